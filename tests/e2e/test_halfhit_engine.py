"""Half-hits, token accounting and KV prewarm against the real local engine (SmolLM2-135M).

The proxy runs with ``upstream_flavour: llamacpp`` in front of a module-scoped LocalEngine. Every
assertion is on token counts the engine reports (``usage.prompt_tokens_details.cached_tokens``
as the canonical log line carries it) or counts from the engine's own tokenizer, never on time.
Each test uses its own topic, so no test finds another's prefix in the engine's cache.

The prewarm mechanics that need no engine (body, hints, dropping, shutdown) run against the
scripted upstream at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml
from structlog.testing import capture_logs

from proxy.http import keys
from proxy.settings import DEFAULT_POLICY
from proxy.upstream.engine import LocalEngine
from tests.conftest import Proxy, ProxyFactory, Upstream

Messages = list[dict[str, str]]
TokenCounter = Callable[[Messages], Awaitable[int]]
HALF_HIT_SHARE = 0.8
# One sentence per answer: the engine stops at the full stop, so answers finish with "stop" and
# are stored, and stay far below the engine's 256-token KV-shift reuse (which would blur the
# with/without-prewarm comparison).
GEN = {"max_tokens": 48, "temperature": 0, "stop": ["."]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[LocalEngine]:
    async with LocalEngine(parallel=4) as running:
        yield running


@pytest.fixture
async def tokens(engine: LocalEngine) -> AsyncIterator[TokenCounter]:
    async with httpx.AsyncClient(base_url=engine.root_url, timeout=60.0, trust_env=False) as http:

        async def count(messages: Messages) -> int:
            """Tokens of the rendered prompt (a trailing assistant turn renders without its end)."""
            rendered = await http.post("/apply-template", json={"messages": messages})
            tokenized = await http.post(
                "/tokenize", json={"content": rendered.json()["prompt"], "add_special": False, "parse_special": True}
            )
            return len(tokenized.json()["tokens"])

        yield count


def history(topic: str) -> Messages:
    """About 200 tokens of settled conversation, unique to ``topic`` from its first token."""
    details = (
        f"I am planning a first trip to {topic} next spring with my partner. We have about ten days, "
        "we like quiet neighbourhoods, local food markets, museums and long walks, and we do not want "
        "to rent a car. One of us is vegetarian and the other does not like crowds or early mornings. "
    )
    return [
        {"role": "system", "content": f"You are a concise travel assistant for {topic}."},
        {"role": "user", "content": details * 2},
        {"role": "assistant", "content": f"Great, {topic} in spring is lovely; stay somewhere central."},
    ]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def send(proxy: Proxy, session: str, messages: Messages, **extra: Any) -> tuple[dict[str, Any], Any]:
    """One request through the proxy; (its canonical log line, the parsed completion or chunks)."""
    client = proxy.client(**{"x-smartcache-session": session})
    with capture_logs() as logs:
        if extra.pop("stream", False):
            stream = await client.chat.completions.create(
                model="m",
                messages=messages,
                stream=True,  # type: ignore[arg-type]
                **GEN,
                **extra,
            )
            reply: Any = [chunk async for chunk in stream]
        else:
            reply = await client.chat.completions.create(model="m", messages=messages, **GEN, **extra)  # type: ignore[arg-type]
        # a stream's client may read [DONE] before the handler has written its log line
        for _ in range(500):
            lines = [entry for entry in logs if entry["event"] == "chat.request"]
            if lines:
                break
            await asyncio.sleep(0.01)
    (line,) = lines
    return line, reply


async def engine_proxy(make_proxy: ProxyFactory, engine: LocalEngine, **settings: Any) -> Proxy:
    return await make_proxy(upstream=engine.base_url, upstream_flavour="llamacpp", upstream_timeout=120.0, **settings)


async def test_half_hit_prefills_only_the_changed_turn(
    make_proxy: ProxyFactory, engine: LocalEngine, tokens: TokenCounter
) -> None:
    proxy = await engine_proxy(make_proxy, engine)
    past = history("Lisbon")
    first, _ = await send(proxy, "hh1", [*past, user("Suggest a hotel area, our budget is 8000 dollars.")])
    assert (first["status"], first["stored"]) == ("miss", True)
    # streamed, and the client does not ask for usage: we ask upstream for it and strip it again
    changed, chunks = await send(
        proxy, "hh1", [*past, user("Actually our budget is only 3000 dollars, suggest a hotel area.")], stream=True
    )
    history_tokens = await tokens(past)
    print(
        f"\n[half-hit] cold miss: {first['upstream_cached_tokens']} cached; half-hit "
        f"({changed['reason']}): {changed['upstream_cached_tokens']} prompt tokens served from the engine's prefix"
        f" cache; the shared history alone renders to {history_tokens} (the cached prefix also covers the"
        " end of the last answer and the next turn's role header)"
    )
    assert changed["status"] == "half-hit"
    assert first["upstream_cached_tokens"] < 0.5 * history_tokens
    assert changed["upstream_cached_tokens"] >= HALF_HIT_SHARE * history_tokens
    assert changed["saved_tokens"] == 0
    assert all(chunk.usage is None for chunk in chunks)
    metrics = proxy.app[keys.METRICS].registry
    counted = metrics.get_sample_value("smartcache_upstream_cached_tokens_total")
    assert counted == first["upstream_cached_tokens"] + changed["upstream_cached_tokens"]


async def test_a_hit_saves_the_tokens_its_answer_cost_upstream(make_proxy: ProxyFactory, engine: LocalEngine) -> None:
    proxy = await engine_proxy(make_proxy, engine)
    messages = [*history("Bergen"), user("What should we eat in Bergen?")]
    miss, completion = await send(proxy, "tok1", messages)
    assert miss["status"] == "miss" and miss["stored"] and miss["saved_tokens"] == 0
    hit, served = await send(proxy, "tok1", [*messages[:-1], user("what should we eat in bergen")])
    assert hit["status"] == "hit" and hit["upstream_cached_tokens"] == 0
    spent = completion.usage.prompt_tokens + completion.usage.completion_tokens
    assert hit["saved_tokens"] == spent > completion.usage.prompt_tokens > 100
    assert served.choices[0].message.content == completion.choices[0].message.content
    metrics = proxy.app[keys.METRICS].registry
    saved = [
        metrics.get_sample_value("smartcache_saved_tokens_total", {"kind": kind}) for kind in ("prompt", "completion")
    ]
    assert saved == [completion.usage.prompt_tokens, completion.usage.completion_tokens]


async def next_turn_after_a_hit(
    proxy: Proxy, topic: str, session: str, tokens: TokenCounter
) -> tuple[dict[str, Any], int, int]:
    """Miss, paraphrased hit, next turn. (next turn's log line, tokens through the paraphrased
    question, tokens through the served answer)."""
    past = history(topic)
    first, _ = await send(proxy, session, [*past, user(f"What should we eat in {topic}?")])
    assert first["stored"]
    asked = [*past, user(f"what should we eat in {topic.lower()}")]
    hit, served = await send(proxy, session, asked)
    assert hit["status"] == "hit"
    assert hit["prewarmed"] is proxy.settings.prewarm
    await proxy.app[keys.CHAT].prewarmer.drain()  # type: ignore[union-attr]
    with_answer = [*asked, {"role": "assistant", "content": served.choices[0].message.content}]
    following, _ = await send(proxy, session, [*with_answer, user("And on a rainy day?")])
    return following, await tokens(asked), await tokens(with_answer)


@pytest.mark.parametrize("prewarm", [True, False])
async def test_prewarm_after_a_direct_hit_caches_the_served_answer(
    make_proxy: ProxyFactory, engine: LocalEngine, tokens: TokenCounter, prewarm: bool
) -> None:
    proxy = await engine_proxy(make_proxy, engine, prewarm=prewarm)
    topic = "Seville" if prewarm else "Ghent"
    following, through_question, through_answer = await next_turn_after_a_hit(proxy, topic, f"pw-{prewarm}", tokens)
    cached = following["upstream_cached_tokens"]
    print(
        f"\n[prewarm={prewarm}] next turn: {cached} cached; question ends at {through_question}, "
        f"served answer at {through_answer}"
    )
    if prewarm:
        assert cached >= through_answer - 1  # the trailing assistant turn renders without its end token
    else:
        assert cached < through_question < through_answer
    assert proxy.app[keys.CHAT].prewarmer.sent == int(prewarm)  # type: ignore[union-attr]


# ---- prewarm mechanics against the scripted upstream ------------------------------------------

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def prewarm_policy(tmp_path: Path) -> Path:
    """The shipped policy with prewarm on for every intent (which needs pools wider than a session)."""
    data = yaml.safe_load(DEFAULT_POLICY.read_text(encoding="utf-8"))
    data["defaults"].update({"prewarm": True, "widen_to": "user"})
    path = tmp_path / "prewarm.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


QUESTION = "What is the tallest mountain in Europe?"


async def ask_then_hit(
    proxy: Proxy, session: str, *, hits: int = 1, delay_after_miss: float = 0.0, upstream: Upstream | None = None
) -> None:
    """A miss, then ``hits`` paraphrases that hit (each a distinct request, so none is a regenerate)."""
    client = proxy.client(**{"x-smartcache-session": session})
    await client.chat.completions.create(model="m", messages=[SYSTEM, user(QUESTION)])  # type: ignore[list-item]
    if upstream is not None:
        upstream.script.delay = delay_after_miss
    for i in range(hits):
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=[SYSTEM, user("what is the tallest mountain in europe" + "!" * i)]
        )  # type: ignore[list-item]
        assert raw.headers["x-cache-status"] == "hit"


async def test_a_policy_with_prewarm_sends_the_conversation_with_the_served_answer(
    make_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path
) -> None:
    proxy = await make_proxy(policy=prewarm_policy(tmp_path), upstream_flavour="llamacpp")
    await ask_then_hit(proxy, "pm1")
    await proxy.app[keys.CHAT].prewarmer.drain()  # type: ignore[union-attr]
    assert len(upstream.script.calls) == 2
    warm, headers = upstream.script.calls[1], upstream.script.headers[1]
    assert warm["messages"] == [
        SYSTEM,
        user("what is the tallest mountain in europe"),
        {"role": "assistant", "content": f"Answer #1 to: {QUESTION}"},
    ]
    assert (warm["max_tokens"], warm["temperature"], warm["cache_prompt"]) == (1, 0, True)
    assert "stream" not in warm and "id_slot" not in warm
    assert headers["Authorization"] == "Bearer key-A"


async def test_prewarm_is_off_by_default(proxy: Proxy, upstream: Upstream) -> None:
    await ask_then_hit(proxy, "pm2")
    await asyncio.sleep(0.2)
    assert len(upstream.script.calls) == 1
    assert proxy.app[keys.CHAT].prewarmer.sent == 0  # type: ignore[union-attr]


async def test_prewarms_beyond_the_limit_are_dropped_and_never_delay_hits(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    proxy = await make_proxy(prewarm=True, prewarm_concurrency=1)
    prewarmer = proxy.app[keys.CHAT].prewarmer
    assert prewarmer is not None
    # the one prewarm let through hangs upstream
    await ask_then_hit(proxy, "pm3", hits=3, delay_after_miss=30.0, upstream=upstream)
    # all three hits were answered while the first prewarm still waits upstream
    assert (prewarmer.in_flight, prewarmer.dropped, prewarmer.sent) == (1, 2, 0)
    assert await proxy.metric("smartcache_prewarms_total", outcome="dropped") == 2
    assert await proxy.metric("smartcache_prewarms_total", outcome="sent") == 0
    await proxy.stop()  # shutdown cancels it: nobody is left to use the warm prefix
    assert (prewarmer.in_flight, prewarmer.sent, prewarmer.failed) == (0, 0, 0)
