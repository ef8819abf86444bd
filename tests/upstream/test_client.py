"""The proxy's one upstream client (proxy/upstream/client.py): which headers cross it each way,
the upstream timeout held over a whole answer, and what it keeps between calls."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.errors import UpstreamTimeout
from proxy.upstream.client import Upstream, chat_headers, env_proxy, forward_headers, response_headers
from tests.conftest import ProxyFactory

# Which headers cross the proxy, each way: a table per direction (pure, no sockets).
UPSTREAM = CIMultiDictProxy(
    CIMultiDict(
        [
            ("X-Request-Id", "req-1"),
            ("x-ratelimit-remaining-tokens", "900"),
            ("openai-processing-ms", "12"),
            ("Set-Cookie", "a=1"),
            ("Set-Cookie", "b=2"),
            ("Connection", "keep-alive, X-Hop"),
            ("X-Hop", "only this connection"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Content-Length", "10"),
            ("Content-Encoding", "gzip"),
            ("Content-Type", "text/event-stream"),
            ("Cache-Control", "no-store"),
            ("x-cache-status", "hit"),
        ]
    )
)
HOP = {"connection", "x-hop", "keep-alive", "transfer-encoding", "content-length"}


@pytest.mark.parametrize(
    ("name", "relayed_raw", "on_chat"),
    [
        ("x-request-id", True, True),
        ("x-ratelimit-remaining-tokens", True, True),
        ("openai-processing-ms", True, True),
        ("set-cookie", True, True),
        ("connection", False, False),
        ("x-hop", False, False),  # named by Connection: hop-by-hop too
        ("keep-alive", False, False),
        ("transfer-encoding", False, False),
        ("content-length", False, False),
        ("content-encoding", True, False),  # raw bytes keep their encoding; a decoded body does not
        ("content-type", True, False),  # the chat path sets its own
        ("cache-control", True, False),
        ("x-cache-status", True, False),  # ours, on the chat path
    ],
)
def test_upstream_headers_each_way(name: str, relayed_raw: bool, on_chat: bool) -> None:
    assert (name in response_headers(UPSTREAM)) is relayed_raw
    assert (name in chat_headers(UPSTREAM)) is on_chat


def test_a_raw_relay_keeps_repeated_headers_apart() -> None:
    assert response_headers(UPSTREAM).getall("set-cookie") == ["a=1", "b=2"]


@pytest.mark.parametrize(
    ("name", "kept", "kept_on_passthrough"),
    [
        ("Authorization", True, True),
        ("Content-Type", True, True),
        ("Host", False, False),
        ("Content-Length", False, True),
        ("Accept-Encoding", False, True),
        ("Connection", False, False),
        ("X-Hop", False, False),
        ("TE", False, False),
        ("Proxy-Authorization", False, False),
        ("x-smartcache-session", False, False),
    ],
)
def test_client_headers_going_upstream(name: str, kept: bool, kept_on_passthrough: bool) -> None:
    client = {name: "v", "Connection": "X-Hop"} if name != "Connection" else {name: "close"}
    assert (name in forward_headers(client)) is kept
    passthrough = forward_headers(client, keep=frozenset({"content-length", "accept-encoding"}))
    assert (name in passthrough) is kept_on_passthrough


# An upstream that trickles its answer a byte at a time never trips a per-read timeout; the chat
# path holds the whole answer to the upstream timeout, streamed or not.
BYTE_EVERY = 0.05  # well inside any per-read timeout
ANSWER = {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"content": "x" * 200}}]}


async def trickle(request: web.Request) -> web.StreamResponse:
    await request.read()
    stream = request.query.get("stream") == "1"
    response = web.StreamResponse(headers={"content-type": "text/event-stream" if stream else "application/json"})
    await response.prepare(request)
    payload = (b"data: " + json.dumps(ANSWER).encode() + b"\n\n") * 20 if stream else json.dumps(ANSWER).encode()
    for byte in payload:
        await response.write(bytes([byte]))
        await asyncio.sleep(BYTE_EVERY)
    return response


@pytest.fixture
async def slow_upstream() -> AsyncIterator[Upstream]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", trickle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    client = Upstream(str(server.make_url("/v1")), timeout=0.6, connect_timeout=2)
    yield client
    await client.close()
    await server.close()


async def test_a_trickling_json_answer_times_out_as_a_whole(slow_upstream: Upstream) -> None:
    with pytest.raises(UpstreamTimeout, match=r"within 0\.6 s"):
        await asyncio.wait_for(slow_upstream.chat_json({"model": "m", "messages": []}, {}), 10)


async def test_a_trickling_stream_times_out_as_a_whole(slow_upstream: Upstream) -> None:
    received = b""

    async def read_all() -> None:
        nonlocal received
        async with slow_upstream.open_stream(
            "POST", "chat/completions", headers={}, content=b"{}", params={"stream": "1"}
        ) as resp:
            async for chunk in slow_upstream.iter_bytes(resp):
                received += chunk

    with pytest.raises(UpstreamTimeout, match=r"not complete within 0\.6 s"):
        await asyncio.wait_for(read_all(), 10)
    assert 0 < len(received) < 20 * len(json.dumps(ANSWER))  # it did trickle, and was cut


# What the proxy's one upstream client keeps between calls: no cookies (an upstream's set-cookie
# for one client must never ride on another client's call), and the environment's proxy, read once
# at start as the OpenAI SDKs read it.
def completion(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-cookie",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
    }


class CookieSetter:
    """An upstream that hands every caller a cookie and records the Cookie header of each call,
    with the host its request line named (an absolute URL when it came through a proxy)."""

    def __init__(self) -> None:
        self.cookies: list[str | None] = []
        self.targets: list[str] = []

    def app(self) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            self.cookies.append(request.headers.get("Cookie"))
            self.targets.append(str(request.url.host))
            text = f"Answer to: {body['messages'][-1]['content']}"
            return web.json_response(completion(text), headers={"Set-Cookie": "sid=tenant-a-secret; Path=/"})

        async def models(request: web.Request) -> web.Response:
            self.cookies.append(request.headers.get("Cookie"))
            self.targets.append(str(request.url.host))
            return web.json_response({"object": "list", "data": []}, headers={"Set-Cookie": "sid=tenant-a-secret"})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        return app


@pytest.fixture
async def cookie_upstream() -> AsyncIterator[tuple[CookieSetter, TestServer]]:
    setter = CookieSetter()
    server = TestServer(setter.app(), host="127.0.0.1")
    await server.start_server()
    yield setter, server
    await server.close()


async def test_an_upstream_cookie_never_rides_on_another_clients_call(
    make_proxy: ProxyFactory, cookie_upstream: tuple[CookieSetter, TestServer]
) -> None:
    setter, server = cookie_upstream
    proxy = await make_proxy(upstream=str(server.make_url("/v1")))
    # a fresh SDK client per call, so a Cookie seen upstream can only have come from the proxy
    for key, question in (("key-cookie-A", "What is a fjord?"), ("key-cookie-B", "What is a glacier?")):
        await proxy.client(key).chat.completions.create(model="m", messages=[{"role": "user", "content": question}])
        await proxy.client(key).models.list()
    assert setter.cookies == [None, None, None, None]


async def test_the_environments_proxy_carries_every_upstream_call(
    make_proxy: ProxyFactory, cookie_upstream: tuple[CookieSetter, TestServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    setter, forward_proxy = cookie_upstream
    # a host that resolves nowhere: only the proxy in HTTP_PROXY can answer for it
    monkeypatch.setenv("HTTP_PROXY", str(forward_proxy.make_url("")))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    proxy = await make_proxy(upstream="http://engine.invalid:8000/v1")
    client = proxy.client("key-proxy")
    answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name a fjord."}])
    await client.models.list()
    assert answer.choices[0].message.content == "Answer to: Name a fjord."
    assert setter.targets == ["engine.invalid", "engine.invalid"]


@pytest.mark.parametrize(
    ("env", "upstream", "expected"),
    [
        ({}, "http://10.0.0.5:8000/v1", None),
        ({"HTTPS_PROXY": "http://corp:3128"}, "https://api.openai.com/v1", "http://corp:3128"),
        ({"HTTPS_PROXY": "http://corp:3128"}, "http://10.0.0.5:8000/v1", None),  # another scheme's
        ({"HTTP_PROXY": "http://corp:3128", "NO_PROXY": "engine.internal"}, "http://engine.internal/v1", None),
        ({"http_proxy": "http://corp:3128"}, "http://engine.internal/v1", "http://corp:3128"),
    ],
)
def test_the_proxy_for_an_upstream_follows_the_environment(
    env: dict[str, str], upstream: str, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert env_proxy(upstream) == expected
