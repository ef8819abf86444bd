"""What the proxy's one upstream client keeps between calls: no cookies (an upstream's set-cookie
for one client must never ride on another client's call), and the environment's proxy, read once
at start as the OpenAI SDKs read it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.upstream.client import env_proxy
from tests.conftest import ProxyFactory


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
