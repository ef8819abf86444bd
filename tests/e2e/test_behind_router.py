"""The proxy behind a real ``vllm-router`` (consistent hashing) in front of two scripted replicas
on loopback, clients sending only an API key: every turn of a conversation reaches one replica
(the router keys on the proxy's ``x-session-id``, the derived session), both replicas serve, and a
replica that dies mid-run costs no client error (the proxy retries what failed before a byte
reached the client). Skipped, saying so, where vllm-router is not installed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory
from tests.scripted_upstream import Script, scripted_app
from tests.upstream.router_process import INSTALL_HINT, VllmRouter, find_binary

pytestmark = pytest.mark.skipif(find_binary() is None, reason=INSTALL_HINT)

TOPICS = [
    "How do tides work?",
    "Suggest a name for a bakery.",
    "What is a prime number?",
    "How do I repot a cactus?",
    "Explain what a mortgage is.",
    "Why is the sky blue?",
    "How does a bicycle gear work?",
    "What is the rule of thirds in photography?",
]


@dataclass
class Replica:
    script: Script
    server: TestServer

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def openings(self) -> set[str]:
        """The conversations this replica served, by their first user turn."""
        return {next(m["content"] for m in call["messages"] if m["role"] == "user") for call in self.script.calls}


async def _health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.fixture
async def replicas() -> AsyncIterator[list[Replica]]:
    started = []
    for _ in range(2):
        script = Script()
        app = scripted_app(script)
        app.router.add_get("/health", _health)  # what the router probes
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        started.append(Replica(script, server))
    yield started
    for replica in started:
        await replica.server.close()


@pytest.fixture
async def router(replicas: list[Replica]) -> AsyncIterator[VllmRouter]:
    process = VllmRouter([r.url for r in replicas])
    # off the loop: the router probes the replicas, which answer from this loop, before it opens
    await asyncio.to_thread(process.start)
    yield process
    process.stop()


async def turn(client: openai.AsyncOpenAI, history: list[dict[str, str]], text: str) -> None:
    """One turn of a conversation; raises what the client would see."""
    history.append({"role": "user", "content": text})
    # no-cache: every turn goes upstream, so what is tested is where it goes, not whether it hits
    done = await client.chat.completions.create(
        model="m",
        messages=history,  # type: ignore[arg-type]
        extra_headers={"cache-control": "no-cache"},
    )
    history.append({"role": "assistant", "content": done.choices[0].message.content or ""})


async def test_every_turn_of_a_conversation_reaches_one_replica(
    make_proxy: ProxyFactory, router: VllmRouter, replicas: list[Replica]
) -> None:
    proxy = await make_proxy(upstream=router.url, upstream_flavour="vllm")
    client = proxy.client()  # an API key only: the proxy derives each conversation's session
    conversations: list[list[dict[str, str]]] = [[] for _ in TOPICS]
    for n in range(3):
        for topic, history in zip(TOPICS, conversations, strict=True):
            await turn(client, history, topic if n == 0 else f"Tell me more, part {n}.")
    a, b = replicas[0].openings(), replicas[1].openings()
    assert a and b and not a & b and a | b == set(TOPICS)
    assert len(replicas[0].script.calls) + len(replicas[1].script.calls) == 3 * len(TOPICS)


@pytest.mark.parametrize("retry", [True, False], ids=["retry", "no-retry"])
async def test_a_replica_that_dies_mid_run_costs_no_client_error(
    make_proxy: ProxyFactory, replicas: list[Replica], retry: bool
) -> None:
    # the router's own retries off: what moves a request off the dead replica is the proxy's one
    router = VllmRouter([r.url for r in replicas], extra=("--disable-retries", "--cb-failure-threshold", "1"))
    await asyncio.to_thread(router.start)
    try:
        proxy = await make_proxy(upstream=router.url, upstream_flavour="vllm", upstream_retry=retry)
        client = proxy.client()
        conversations: list[list[dict[str, str]]] = [[] for _ in TOPICS]
        for topic, history in zip(TOPICS, conversations, strict=True):
            await turn(client, history, topic)
        dead = replicas[0]
        assert dead.openings(), "both replicas serve before one dies"
        await dead.server.close()
        errors = 0
        for history in conversations:
            try:
                await turn(client, history, "And in one sentence?")
            except openai.APIError:
                errors += 1
        retried = await proxy.metric("smartcache_upstream_retries_total", reason="status_500")
    finally:
        router.stop()
    if retry:
        assert errors == 0 and retried is not None and retried >= 1
    else:  # the failure the retry absorbs
        assert errors >= 1 and not retried
