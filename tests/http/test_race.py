"""Racing the upstream (proxy/http/race.py): the upstream call goes out while the cache decides;
a miss relays it, a hit cancels it. Through the openai SDK against the scripted upstream, with
the real embedder, gated where a test needs to know what happened before the lookup ended."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import openai
import pytest
from aiohttp import web

from proxy.embedding.backends import Matrix, SyncEmbedder
from proxy.http import keys
from proxy.http.race import races
from proxy.settings import SettingsError, load_settings
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat, chat_stream

pytestmark = pytest.mark.model
# a question asked again verbatim is a hit here, not a regenerate (proxy/service/feedback.py)


class GatedEmbedder:
    """The real embedder, held before each model call until the test opens the gate."""

    def __init__(self, inner: SyncEmbedder) -> None:
        self.inner = inner
        self.name, self.dim, self.max_tokens = inner.name, inner.dim, inner.max_tokens
        self.gate = threading.Event()
        self.gate.set()

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.gate.wait(timeout=60)  # a bound, so a failing test ends instead of hanging
        return self.inner.embed(texts)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


async def until(check: object, what: str, seconds: float = 20.0) -> None:
    async with asyncio.timeout(seconds):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def stored(proxy: Proxy) -> int:
    return len([r async for r in proxy.app[keys.CACHE].store.iter_live()])


async def until_stored(proxy: Proxy, n: int) -> None:
    """A streamed answer is written back after its last byte has gone to the client."""
    async with asyncio.timeout(20):
        while await stored(proxy) < n:
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_a_miss_is_on_its_way_upstream_before_the_lookup_ends(
    make_proxy: ProxyFactory, sync_embedder: SyncEmbedder, upstream: Upstream, streamed: bool
) -> None:
    embedder = GatedEmbedder(sync_embedder)
    proxy = await make_proxy(backend=embedder, race_upstream="on", regenerate_window=0.0)
    client = proxy.client(**{"x-smartcache-session": "r1"})
    question = ask("Which rivers flow through Vienna?")
    embedder.gate.clear()
    pending = asyncio.ensure_future(chat_stream(client, question) if streamed else chat(client, question))
    # the embedding is held: only a call sent before the lookup ends can reach the upstream now
    await until(lambda: upstream.script.calls, "the raced call")
    embedder.gate.set()
    status, text, _ = await pending
    assert (status, text) == ("miss", "Answer #1 to: Which rivers flow through Vienna?")
    await until_stored(proxy, 1)  # what the raced call answered is kept like any miss's answer
    status, again, _ = await chat(client, question)
    # asked again verbatim, every text is known: decided in a few ms without the model, unraced
    assert (status, again) == ("hit", text) and len(upstream.script.calls) == 1
    assert await proxy.metric("smartcache_raced_upstream_calls_total", outcome="relayed") == 1
    assert await proxy.metric("smartcache_raced_upstream_calls_total", outcome="cancelled") == 0


async def test_without_racing_the_upstream_waits_for_the_lookup(
    make_proxy: ProxyFactory, sync_embedder: SyncEmbedder, upstream: Upstream
) -> None:
    embedder = GatedEmbedder(sync_embedder)
    proxy = await make_proxy(backend=embedder, race_upstream="off", regenerate_window=0.0)
    client = proxy.client(**{"x-smartcache-session": "r2"})
    embedder.gate.clear()
    pending = asyncio.ensure_future(chat(client, ask("Which rivers flow through Vienna?")))
    await asyncio.sleep(1.0)
    assert upstream.script.calls == []
    embedder.gate.set()
    status, _, _ = await pending
    assert status == "miss" and len(upstream.script.calls) == 1
    assert await proxy.metric("smartcache_raced_upstream_calls_total", outcome="relayed") is None


HOTEL = ask("Suggest a hotel near the Belvedere in Vienna")
HOTEL_AGAIN = ask("Can you suggest a hotel close to the Belvedere in Vienna?")


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_a_hit_cancels_the_call_it_raced_and_the_upstream_sees_its_client_go(
    make_proxy: ProxyFactory, upstream: Upstream, streamed: bool
) -> None:
    proxy = await make_proxy(race_upstream="on", regenerate_window=0.0)
    client = proxy.client(**{"x-smartcache-session": "r3"})
    _, first, _ = await chat(client, HOTEL)
    upstream.script.delay = 5.0  # the raced call would answer long after the hit
    status, text, _ = await (chat_stream(client, HOTEL_AGAIN) if streamed else chat(client, HOTEL_AGAIN))
    assert (status, text) == ("hit", first)
    await until(lambda: upstream.script.aborted, "the upstream to see the raced call's client go")
    assert upstream.script.aborted == [HOTEL_AGAIN[-1]["content"]] and len(upstream.script.calls) == 2
    assert await proxy.metric("smartcache_raced_upstream_calls_total", outcome="cancelled") == 1


async def test_an_upstream_error_is_a_miss_s_answer_and_is_never_stored(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    proxy = await make_proxy(race_upstream="on", regenerate_window=0.0)
    client = proxy.client(**{"x-smartcache-session": "r4"})
    upstream.script.mode = "error500"
    with pytest.raises(openai.InternalServerError) as caught:
        await chat(client, ask("How deep is Lake Constance?"))
    assert caught.value.status_code == 500 and "engine exploded" in caught.value.message
    assert await stored(proxy) == 0
    upstream.script.mode = "ok"
    status, text, _ = await chat(client, ask("How deep is Lake Constance?"))
    assert (status, text) == ("miss", "Answer #1 to: How deep is Lake Constance?")


async def test_an_upstream_that_fails_during_the_lookup_does_not_stop_a_hit(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    proxy = await make_proxy(race_upstream="on", regenerate_window=0.0)
    client = proxy.client(**{"x-smartcache-session": "r5"})
    _, text, _ = await chat(client, HOTEL)
    upstream.script.mode = "error500"
    status, again, _ = await chat(client, HOTEL_AGAIN)
    assert (status, again) == ("hit", text) and len(upstream.script.calls) == 2
    assert await proxy.metric("smartcache_raced_upstream_calls_total", outcome="cancelled") == 1


async def test_coalesced_followers_drop_their_own_calls_and_one_answer_serves_all(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    proxy = await make_proxy(race_upstream="on", regenerate_window=0.0)
    client = proxy.client(**{"x-smartcache-session": "r6"})
    chat_handler = proxy.app[keys.CHAT]
    coalescer = chat_handler.coalescer
    assert coalescer is not None
    upstream.script.hold = asyncio.Event()
    question = ask("Why is the Danube blue in songs?")
    tasks = [asyncio.ensure_future(chat(client, question)) for _ in range(4)]

    def left(request: web.Request) -> bool:
        return request.transport is None or request.transport.is_closing()

    # each follower drops its call as it follows, before any answer: released only once the
    # upstream has seen every dropped call's connection close, or a held call would be answered
    await until(
        lambda: (
            coalescer.followed == 3
            and chat_handler.races["cancelled"] == 3
            and [left(r) for r in upstream.script.waiting].count(False) == 1
        ),
        "three followers, their calls dropped",
    )
    upstream.script.hold.set()
    results = await asyncio.gather(*tasks)
    assert sorted(s for s, _, _ in results) == ["hit", "hit", "hit", "miss"]
    assert len({t for _, t, _ in results}) == 1
    await until(lambda: len(upstream.script.calls) - len(upstream.script.aborted) == 1, "one call answered")
    assert await proxy.metric("smartcache_raced_upstream_calls_total", outcome="cancelled") == 3


def test_auto_races_what_the_engine_aborts_when_cancelled_and_nothing_of_a_paid_api() -> None:
    both, streams, none = {"json", "stream"}, {"stream"}, set()
    assert [races("auto", f) for f in ("vllm", "sglang", "llamacpp", "openai", "generic")] == [
        both,
        both,
        streams,  # llama.cpp generates a non-streamed request to its end (tests/upstream/test_engine.py)
        none,
        none,
    ]
    assert races("on", "openai") == both and races("off", "vllm") == none
    assert load_settings(environ={"SMARTCACHE_RACE_UPSTREAM": "on"}).race_upstream == "on"
    with pytest.raises(SettingsError, match="race_upstream: must be auto, on or off"):
        load_settings(environ={}, overrides={"race_upstream": "sometimes"})
