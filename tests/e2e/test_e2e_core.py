"""The whole chain through the official openai SDK: real proxy, real model, real SQLite, and a
scripted upstream on loopback."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai
import pytest

from proxy.http import keys
from tests.conftest import Proxy, ProxyFactory, Upstream

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def ask(text: str, history: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
    return [SYSTEM, *(history or []), {"role": "user", "content": text}]


async def chat(client: openai.AsyncOpenAI, messages: list[dict[str, str]], **kw: Any) -> tuple[str, str, Any]:
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages, **kw)
    completion = raw.parse()
    return raw.headers.get("x-cache-status", ""), completion.choices[0].message.content or "", raw


async def chat_stream(
    client: openai.AsyncOpenAI, messages: list[dict[str, str]], **kw: Any
) -> tuple[str, str, list[Any]]:
    async with client.chat.completions.with_streaming_response.create(
        model="m", messages=messages, stream=True, **kw
    ) as resp:
        status = resp.headers.get("x-cache-status", "")
        chunks = [c async for c in await resp.parse()]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return status, text, chunks


async def test_first_ask_misses_and_a_paraphrase_in_the_session_hits(proxy: Proxy, upstream: Upstream) -> None:
    client = proxy.client(**{"x-smartcache-session": "s1"})
    status, first, _ = await chat(client, ask("What is the tallest mountain in Europe?"))
    assert status == "miss"
    assert len(upstream.script.calls) == 1
    status, again, raw = await chat(client, ask("what is the tallest mountain in europe"))
    assert status == "hit"
    assert again == first
    assert float(raw.headers["x-cache-similarity"]) > 0.9
    assert raw.headers["x-cache-id"].startswith("sc-")
    assert int(raw.headers["age"]) >= 0
    assert len(upstream.script.calls) == 1
    usage = raw.parse().usage
    assert usage.prompt_tokens == 0 and usage.completion_tokens == 0


async def test_hit_is_streamed_as_sse_with_usage_chunk(proxy: Proxy, upstream: Upstream) -> None:
    client = proxy.client(**{"x-smartcache-session": "s2"})
    status, first, _ = await chat(client, ask("Give me three tips for sleeping better."))
    assert status == "miss"
    status, text, chunks = await chat_stream(
        client, ask("give me 3 tips for sleeping better"), stream_options={"include_usage": True}
    )
    assert status == "hit"
    assert text == first
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 0
    assert len({c.id for c in chunks}) == 1
    assert len(upstream.script.calls) == 1
    # the held answer goes out as one body of known length, not written an event at a time
    body = {"model": "m", "messages": ask("Give me three tips for sleeping better."), "stream": True}
    headers = {"Authorization": "Bearer key-A", "x-smartcache-session": "s2-again"}  # a repeat, not a regenerate
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy.base_url}/chat/completions", json=body, headers=headers) as resp,
    ):
        raw = await resp.read()
        assert resp.headers["x-cache-status"] == "hit"
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert "transfer-encoding" not in resp.headers and int(resp.headers["content-length"]) == len(raw)
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and all(e.startswith(b"data: ") for e in events)
    assert "".join(json.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-1]) == first


async def test_miss_streams_through_and_is_stored(proxy: Proxy, upstream: Upstream) -> None:
    client = proxy.client(**{"x-smartcache-session": "s3"})
    status, text, chunks = await chat_stream(client, ask("What is the boiling point of water at sea level?"))
    assert status == "miss"
    assert text.startswith("Answer #1")
    # we asked upstream for usage on the client's behalf, and did not leak the extra chunk
    assert upstream.script.calls[0]["stream_options"] == {"include_usage": True}
    assert all(c.usage is None for c in chunks)
    status, again, _ = await chat(client, ask("what is the boiling point of water at sea level"))
    assert (status, again) == ("hit", text)


async def test_another_tenant_never_gets_the_answer(proxy: Proxy, upstream: Upstream) -> None:
    headers = {"x-smartcache-session": "shared-session"}
    await chat(proxy.client("key-A", **headers), ask("Recommend a good book about databases."))
    status, text, _ = await chat(proxy.client("key-B", **headers), ask("Recommend a good book about databases."))
    assert status == "miss"
    assert text.startswith("Answer #2")
    assert len(upstream.script.calls) == 2


async def test_regenerate_is_forwarded_and_rejects_the_pending_record(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    proxy = await make_proxy(ready_after=30.0)
    client = proxy.client(**{"x-smartcache-session": "s4"})
    messages = ask("Write a haiku about autumn.")
    status, first, _ = await chat(client, messages)
    assert status == "miss"
    store = proxy.app[keys.CACHE].store
    (record,) = [r async for r in store.iter_live()]
    assert record.state == "pending"
    status, second, _ = await chat(client, messages)
    assert status == "miss" and second != first
    assert len(upstream.script.calls) == 2
    assert (await store.get(record.cache_id)).state == "rejected"


async def test_pending_answers_are_not_served_before_the_window(make_proxy: ProxyFactory, upstream: Upstream) -> None:
    proxy = await make_proxy(ready_after=0.6)
    client = proxy.client(**{"x-smartcache-session": "s5"})
    await chat(client, ask("Explain what a hash map is."))
    status, _, _ = await chat(client, ask("explain what a hash map is"))
    assert status == "miss"
    await asyncio.sleep(1.2)
    status, _, _ = await chat(client, ask("Explain what a hash map is!"))
    assert status == "hit"


@pytest.mark.slow
async def test_records_survive_a_restart(make_proxy: ProxyFactory, upstream: Upstream) -> None:
    first_proxy = await make_proxy()
    client = first_proxy.client(**{"x-smartcache-session": "s6"})
    _, first, _ = await chat(client, ask("What is the capital of Australia?"))
    await first_proxy.stop()
    second_proxy = await make_proxy()
    status, text, _ = await chat(
        second_proxy.client(**{"x-smartcache-session": "s6"}), ask("what is the capital of australia")
    )
    assert (status, text) == ("hit", first)
    assert len(upstream.script.calls) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_500_reaches_the_client_and_nothing_is_stored(
    proxy: Proxy, upstream: Upstream, stream: bool
) -> None:
    upstream.script.mode = "error500"
    client = proxy.client(**{"x-smartcache-session": "s7"})
    with pytest.raises(openai.InternalServerError) as info:
        if stream:
            await chat_stream(client, ask("Why is the sky blue?"))
        else:
            await chat(client, ask("Why is the sky blue?"))
    assert info.value.status_code == 500
    assert info.value.body["code"] == "boom"
    upstream.script.mode = "ok"
    status, _, _ = await chat(client, ask("Why is the sky blue?"))
    assert status == "miss"


@pytest.mark.slow
async def test_upstream_timeout_is_504_and_refused_is_502(make_proxy: ProxyFactory, upstream: Upstream) -> None:
    proxy = await make_proxy(upstream_timeout=0.3)
    upstream.script.delay = 1.0
    with pytest.raises(openai.APIStatusError) as info:
        await chat(proxy.client(), ask("Tell me a joke."))
    assert info.value.status_code == 504
    assert info.value.body["type"] == "timeout"
    # a data dir of its own: the first proxy still holds its lock
    refused = await make_proxy(upstream="http://127.0.0.1:9/v1", data_dir=proxy.settings.data_dir.parent / "refused")
    with pytest.raises(openai.APIStatusError) as info:
        await chat(refused.client(), ask("Tell me a joke."))
    assert info.value.status_code == 502
    assert set(info.value.body) == {"message", "type", "param", "code"}
    assert [r async for r in proxy.app[keys.CACHE].store.iter_live()] == []


async def test_cut_stream_and_truncated_and_tool_answers_are_not_stored(proxy: Proxy, upstream: Upstream) -> None:
    client = proxy.client(**{"x-smartcache-session": "s8"})
    upstream.script.mode = "cut"
    with pytest.raises(openai.APIError):
        await chat_stream(client, ask("Describe the water cycle."))
    for mode in ("length", "toolcall"):
        upstream.script.mode = mode
        await chat(client, ask(f"Describe the water cycle ({mode})."))
    assert [r async for r in proxy.app[keys.CACHE].store.iter_live()] == []


async def test_client_disconnect_mid_stream_stores_nothing(proxy: Proxy, upstream: Upstream) -> None:
    upstream.script.answers["Tell me a long story."] = "Once upon a time " * 200
    body = {"model": "m", "stream": True, "messages": ask("Tell me a long story.")}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy.base_url}/chat/completions", json=body, headers={"Authorization": "Bearer key-A"}
        ) as resp,
    ):
        assert resp.status == 200
        await resp.content.readany()
    await asyncio.sleep(1.0)  # let the upstream stream finish on the proxy side
    assert [r async for r in proxy.app[keys.CACHE].store.iter_live()] == []


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "model"),
        (b'{"model": "m"}', 400, "messages"),
        (b'{"model": "m", "messages": []}', 400, "messages"),
        (b'{"model": 3, "messages": [{"role": "user", "content": "hi"}]}', 400, "model"),
        (b'{"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}', 400, "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', 400, "messages[0].content"),
        (b'{"model": "m", "messages": ["hi"]}', 400, "messages[0]"),
        (b'{"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "hi"}]}', 400, "stream"),
        (b'{"model": "m", "n": 0, "messages": [{"role": "user", "content": "hi"}]}', 400, "n"),
        (b'{"model": "m", "cache": {"ttl": -1}, "messages": [{"role": "user", "content": "hi"}]}', 400, "cache.ttl"),
        (b'{"model": "m", "cache": {"bogus": 1}, "messages": [{"role": "user", "content": "hi"}]}', 400, "cache"),
    ],
)
async def test_malformed_input_gets_an_openai_style_4xx(
    proxy: Proxy, upstream: Upstream, body: bytes, status: int, param: str | None
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy.base_url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as resp,
    ):
        assert resp.status == status
        payload = await resp.json()
    assert payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["param"] == param
    assert payload["error"]["message"]
    assert upstream.script.calls == []


async def test_body_over_the_limit_is_413(make_proxy: ProxyFactory, upstream: Upstream) -> None:
    proxy = await make_proxy(max_body_bytes=4096)
    big = "x" * 10_000
    with pytest.raises(openai.APIStatusError) as info:
        await chat(proxy.client(), ask(big))
    assert info.value.status_code == 413
    assert upstream.script.calls == []


@pytest.mark.parametrize("session", ["s\xe9ssion", "has space", "x" * 201])
async def test_bad_session_header_is_refused(proxy: Proxy, upstream: Upstream, session: str) -> None:
    body = {"model": "m", "messages": ask("hello")}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{proxy.base_url}/chat/completions",
            json=body,
            headers={
                "Authorization": "Bearer key-A",
                "x-smartcache-session": session.encode("latin-1").decode("latin-1"),
            },
        ) as resp,
    ):
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "x-smartcache-session"
    assert upstream.script.calls == []


@pytest.mark.parametrize("extra", [{"n": 2}, {"logprobs": True}])
async def test_requests_that_cannot_be_cached_bypass(proxy: Proxy, upstream: Upstream, extra: dict[str, Any]) -> None:
    client = proxy.client(**{"x-smartcache-session": "s9"})
    for _ in range(2):
        status, _, _ = await chat(client, ask("What is 2 + 2?"), **extra)
        assert status == "bypass"
    assert len(upstream.script.calls) == 2


async def test_cache_controls(proxy: Proxy, upstream: Upstream) -> None:
    client = proxy.client(**{"x-smartcache-session": "s10"})
    status, _, _ = await chat(
        client, ask("Name a planet of the solar system."), extra_body={"cache": {"no_store": True}}
    )
    assert status == "miss"
    assert "cache" not in upstream.script.calls[0]
    status, _, _ = await chat(client, ask("Name a planet of the solar system!"))
    assert status == "miss"  # the first answer was not stored
    status, _, _ = await chat(
        client, ask("name a planet of the solar system"), extra_headers={"Cache-Control": "no-cache"}
    )
    assert status == "miss"  # lookup skipped even though an answer is stored now
    status, _, _ = await chat(client, ask("Name a planet of the solar system"))
    assert status == "hit"


async def test_other_v1_routes_pass_through(proxy: Proxy, upstream: Upstream) -> None:
    client = proxy.client()
    models = await client.models.list()
    assert [m.id for m in models.data] == ["scripted"]
    emb = await client.embeddings.create(model="e", input="hi")
    assert emb.data[0].embedding == [0.1, 0.2]


async def test_healthz_and_metrics(proxy: Proxy) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(str(proxy.server.make_url("/healthz"))) as resp:
            assert resp.status == 200
            assert (await resp.json())["status"] == "ok"
        async with session.get(str(proxy.server.make_url("/metrics"))) as resp:
            assert resp.status == 200
            assert "smartcache_requests_total" in await resp.text()
