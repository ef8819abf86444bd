"""Request coalescing: concurrent identical requests share one upstream call (proxy/coalesce.py).

End to end through the openai SDK against the scripted upstream, which holds the leader's call
until every follower is waiting on it; plus the flight table and the pure helpers alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import openai
import orjson
import pytest
from structlog.testing import capture_logs

from proxy.core.errors import UpstreamTimeout
from proxy.core.identity import Identity
from proxy.core.openai.request import completion_chunks, parse_chat_request
from proxy.http import keys
from proxy.upstream.coalesce import Coalescer, coalesce_key, plain_answer, with_finish_reason
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat, chat_stream

UPSTREAM_DELAY = 2.0  # for requests that must not share a flight: they all arrive within it
N = 10


def request_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == "chat.request"]


async def held(
    proxy: Proxy, upstream: Upstream, requests: list[Coroutine[Any, Any, Any]], *, followers: int | None = None
) -> list[Any]:
    """Run ``requests`` with the upstream held until ``followers`` of them (all but the one that
    leads, by default) wait on a flight, then let it answer."""
    coalescer = proxy.app[keys.CHAT].coalescer
    assert coalescer is not None
    if upstream.script.hold is None:
        upstream.script.hold = asyncio.Event()
    before = coalescer.followed
    tasks = [asyncio.ensure_future(r) for r in requests]
    async with asyncio.timeout(120):
        while coalescer.followed - before < (len(requests) - 1 if followers is None else followers):
            await asyncio.sleep(0.02)
    upstream.script.hold.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


async def concurrent(proxy: Proxy, session: str, messages: list[dict[str, str]], n: int = N, **kw: Any) -> list[Any]:
    client = proxy.client(**{"x-smartcache-session": session})
    return await asyncio.gather(*(chat(client, messages, **kw) for _ in range(n)), return_exceptions=True)


async def together(
    proxy: Proxy, upstream: Upstream, session: str, messages: list[dict[str, str]], n: int = N
) -> list[Any]:
    client = proxy.client(**{"x-smartcache-session": session})
    return await held(proxy, upstream, [chat(client, messages) for _ in range(n)])


async def test_ten_concurrent_identical_requests_make_one_upstream_call(proxy: Proxy, upstream: Upstream) -> None:
    with capture_logs() as logs:
        results = await together(proxy, upstream, "c1", ask("How do tides work?"))
    assert len(upstream.script.calls) == 1
    statuses = sorted(status for status, _, _ in results)
    assert statuses == ["hit"] * (N - 1) + ["miss"]
    assert {text for _, text, _ in results} == {"Answer #1 to: How do tides work?"}
    followers = [raw for status, _, raw in results if status == "hit"]
    assert all(raw.headers["x-cache-similarity"] == "1.0000" for raw in followers)
    stored = [r async for r in proxy.app[keys.CACHE].store.iter_live()]
    assert len(stored) == 1 and {raw.headers["x-cache-id"] for raw in followers} == {stored[0].cache_id}
    lines = request_lines(logs)
    coalesced = [line for line in lines if line["reason"] == "coalesced"]
    assert len(coalesced) == N - 1 and all(line["status"] == "hit" for line in coalesced)
    # a follower saved what the leader spent: the scripted usage of this prompt and answer
    spent = stored[0].prompt_tokens + stored[0].completion_tokens
    assert spent > 0 and {line["saved_tokens"] for line in coalesced} == {spent}
    chat_service = proxy.app[keys.CHAT]
    assert chat_service.coalescer is not None
    assert (chat_service.coalescer.led, chat_service.coalescer.followed, len(chat_service.coalescer)) == (1, N - 1, 0)
    assert await proxy.metric("smartcache_coalesced_requests_total", role="led") == 1
    assert await proxy.metric("smartcache_coalesced_requests_total", role="followed") == N - 1


async def test_stream_and_json_followers_share_a_streamed_leader(proxy: Proxy, upstream: Upstream) -> None:
    client = proxy.client(**{"x-smartcache-session": "c2"})
    messages = ask("Why do cats purr?")
    upstream.script.hold = asyncio.Event()
    leader = asyncio.create_task(chat_stream(client, messages))
    async with asyncio.timeout(120):  # the streamed request leads
        while not upstream.script.calls:
            await asyncio.sleep(0.02)
    followers = await held(
        proxy,
        upstream,
        [
            *(chat_stream(client, messages, stream_options={"include_usage": True}) for _ in range(3)),
            *(chat(client, messages) for _ in range(3)),
        ],
        followers=6,
    )
    status, text, _ = await leader
    assert status == "miss" and text == "Answer #1 to: Why do cats purr?"
    assert len(upstream.script.calls) == 1
    assert [(s, t) for s, t, _ in followers] == [("hit", text)] * 6
    for _, _, chunks in followers[:3]:
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-2].choices[0].finish_reason == "stop"
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 0


async def test_a_truncated_answer_is_shared_with_its_finish_reason(proxy: Proxy, upstream: Upstream) -> None:
    upstream.script.mode = "length"
    client = proxy.client(**{"x-smartcache-session": "c3"})
    messages = ask("List every prime number.")
    results = await held(
        proxy,
        upstream,
        [
            *(chat(client, messages, max_tokens=5) for _ in range(3)),
            *(chat_stream(client, messages, max_tokens=5) for _ in range(3)),
        ],
    )
    assert len(upstream.script.calls) == 1
    assert sorted(s for s, _, _ in results) == ["hit"] * 5 + ["miss"]
    for _, _, raw in results[:3]:
        assert raw.parse().choices[0].finish_reason == "length"
    for _, _, chunks in results[3:]:
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # kept for this very request at this limit only (tests/e2e/test_cut_answers.py)
    assert [r.cut_at async for r in proxy.app[keys.CACHE].store.iter_live()] == [5]


async def test_followers_get_the_leaders_upstream_error(proxy: Proxy, upstream: Upstream) -> None:
    upstream.script.mode = "error500"
    with capture_logs() as logs:
        results = await together(proxy, upstream, "c4", ask("What is dark matter?"))
    assert len(upstream.script.calls) == 2  # the leader's call and its one retry (upstream.retry)
    assert all(isinstance(r, openai.InternalServerError) for r in results)
    assert {r.body["code"] for r in results} == {"boom"}
    lines = request_lines(logs)
    assert len([line for line in lines if line["reason"] == "coalesced" and line["status"] == "miss"]) == N - 1
    assert all(line["upstream_status"] == 500 for line in lines)


async def test_an_identical_request_after_completion_is_a_regenerate_and_goes_upstream(
    proxy: Proxy, upstream: Upstream
) -> None:
    messages = ask("Suggest a name for a bakery.")
    await together(proxy, upstream, "c5", messages, n=4)
    assert len(upstream.script.calls) == 1
    upstream.script.hold = None
    with capture_logs() as logs:
        status, text, _ = await chat(proxy.client(**{"x-smartcache-session": "c5"}), messages)
    assert status == "miss" and text == "Answer #2 to: Suggest a name for a bakery."
    assert request_lines(logs)[0]["reason"] == "regenerate"
    assert len(upstream.script.calls) == 2


async def test_other_sessions_tenants_and_parameters_do_not_share(proxy: Proxy, upstream: Upstream) -> None:
    upstream.script.delay = UPSTREAM_DELAY
    messages = ask("Explain photosynthesis briefly.")
    s1 = proxy.client(**{"x-smartcache-session": "c6a"})
    s2 = proxy.client(**{"x-smartcache-session": "c6b"})
    other_tenant = proxy.client("key-B", **{"x-smartcache-session": "c6a"})
    results = await asyncio.gather(
        chat(s1, messages),
        chat(s1, messages),
        chat(s2, messages),
        chat(other_tenant, messages),
        chat(s1, messages, max_tokens=7),
        chat(s1, messages, temperature=0.1),
    )
    assert len(upstream.script.calls) == 5
    assert [s for s, _, _ in results].count("hit") == 1


@pytest.mark.slow
async def test_no_cache_requests_and_disabled_coalescing_go_upstream_each(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    upstream.script.delay = 0.5
    proxy = await make_proxy(coalesce=False)
    assert proxy.app[keys.CHAT].coalescer is None
    await concurrent(proxy, "c7", ask("What is a black hole?"), n=3)
    assert len(upstream.script.calls) == 3
    on = await make_proxy(data_dir=proxy.settings.data_dir.parent / "on")
    await concurrent(on, "c8", ask("What is a quasar?"), n=3, extra_headers={"Cache-Control": "no-cache"})
    assert len(upstream.script.calls) == 6


# ---- the flight table and helpers alone -------------------------------------------------------


def request(body: dict[str, Any]) -> Any:
    return parse_chat_request(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}))


WHO = Identity(tenant="t", session="s", user=None, session_explicit=True)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({}, {"stream": True, "stream_options": {"include_usage": True}}, True),
        ({"temperature": 0.2, "top_p": 1}, {"top_p": 1, "temperature": 0.2}, True),
        ({}, {"max_tokens": 4}, False),
        ({}, {"cache": {"namespace": "x"}}, False),
        ({}, {"model": "other"}, False),
        ({}, {"messages": [{"role": "user", "content": "hi!"}]}, False),
    ],
)
def test_coalesce_key(a: dict[str, Any], b: dict[str, Any], same: bool) -> None:
    assert (coalesce_key(request(a), WHO) == coalesce_key(request(b), WHO)) is same


def test_coalesce_key_separates_sessions_and_tenants() -> None:
    req = request({})
    keys_ = {
        coalesce_key(req, WHO),
        coalesce_key(req, Identity("t", "s2", None, True)),
        coalesce_key(req, Identity("t2", "s", None, True)),
    }
    assert len(keys_) == 3


async def test_a_flight_whose_leader_gives_up_wakes_followers_empty_handed() -> None:
    table = Coalescer()
    flight = table.begin("k")
    assert table.follow("k") is flight and table.follow("other") is None
    waiter = asyncio.create_task(flight.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    table.end(flight)
    await asyncio.wait_for(waiter, 1)
    assert flight.answer is None and flight.error is None and len(table) == 0
    # ending it again (both a failed relay and its write-back may) leaves a newer flight alone
    newer = table.begin("k")
    table.end(flight)
    assert table.follow("k") is newer


async def test_a_cancelled_follower_does_not_cancel_the_flight() -> None:
    table = Coalescer()
    flight = table.begin("k")
    impatient = asyncio.create_task(flight.wait())
    patient = asyncio.create_task(flight.wait())
    await asyncio.sleep(0)
    impatient.cancel()
    await asyncio.sleep(0)
    flight.fail(UpstreamTimeout("slow"))
    table.end(flight)
    await asyncio.wait_for(patient, 1)
    assert isinstance(flight.error, UpstreamTimeout)


def test_leading_a_key_twice_is_refused() -> None:
    table = Coalescer()
    table.begin("k")
    with pytest.raises(RuntimeError):
        table.begin("k")


def test_plain_answer_and_finish_reason_replay() -> None:
    body = {"choices": [{"message": {"role": "assistant", "content": "abc"}, "finish_reason": "length"}]}
    assert plain_answer(body) == ("abc", "length")
    tool = {"choices": [{"message": {"content": None, "tool_calls": [{}]}, "finish_reason": "tool_calls"}]}
    assert plain_answer(tool) == (None, None)
    assert plain_answer({"choices": []}) == (None, None)
    events = completion_chunks(completion_id="c", model="m", content="x" * 50, include_usage=True)
    assert with_finish_reason(events, "stop") is events
    replayed = with_finish_reason(events, "length")
    finishes = [
        orjson.loads(e[6:])["choices"][0]["finish_reason"]
        for e in replayed
        if e.startswith(b"data: {") and orjson.loads(e[6:])["choices"]
    ]
    assert finishes == [None, None, None, None, "length"]
    assert replayed[-1] == b"data: [DONE]\n\n"
