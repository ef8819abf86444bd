"""proxy/http/attempts.py: an upstream attempt that fails before the client has a byte (a router's
replica just died: a dropped connection, 500, 502, 503, 504) is sent once more with the same routing
key, and the client gets the answer; a failure of the request itself (400, 429), a second failure, a
stream already relayed in part, or the setting turned off reach the client as they came. A failed
attempt is never stored."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from proxy.http import keys
from tests.conftest import ProxyFactory, Upstream
from tests.scripted_upstream import Script, scripted_app

ASK = [{"role": "user", "content": "What is the capital of Portugal?"}]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Failing:
    """Fails the first ``times`` chat calls the way ``how`` says, then lets the script answer."""

    def __init__(self, how: str = "503", times: int = 1) -> None:
        self.how, self.times, self.failed = how, times, 0
        self.script = Script()  # where a failed call is recorded, as the script records an answered one

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.endswith("/chat/completions") or self.failed >= self.times:
            return await handler(request)
        self.failed += 1
        body = await request.json()
        self.script.calls.append(body)
        self.script.headers.append(dict(request.headers))
        if self.how == "drop":  # the replica died with the request in flight: no status line at all
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=599)
        error = {"error": {"message": f"worker failed ({self.how})", "type": "server_error", "code": self.how}}
        return web.json_response(error, status=int(self.how))


@pytest.fixture
async def failing() -> Failing:
    return Failing()


@pytest.fixture
async def upstream(failing: Failing) -> AsyncIterator[Upstream]:
    """The shared fixture's scripted upstream, failing first as ``failing`` says."""
    app = scripted_app(failing.script)
    app.middlewares.append(failing.middleware)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield Upstream(failing.script, server)
    await server.close()


async def ask(client: openai.AsyncOpenAI, *, stream: bool) -> str:
    if not stream:
        done = await client.chat.completions.create(model="m", messages=ASK)  # type: ignore[arg-type]
        return done.choices[0].message.content or ""
    chunks = await client.chat.completions.create(model="m", messages=ASK, stream=True)  # type: ignore[arg-type]
    return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])


def request_line(logs: list[dict[str, Any]]) -> dict[str, Any]:
    (line,) = [entry for entry in logs if entry["event"] == "chat.request"]
    return line


async def stored(proxy: Any) -> int:
    return len([r async for r in proxy.app[keys.CACHE].store.iter_live()])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("how", ["drop", "500", "502", "503", "504"])
async def test_a_failed_first_attempt_is_sent_once_more_with_the_same_routing_key(
    make_proxy: ProxyFactory, upstream: Upstream, failing: Failing, how: str, stream: bool
) -> None:
    failing.how = how
    proxy = await make_proxy(upstream_flavour="vllm")
    with capture_logs() as logs:
        answer = await ask(proxy.client(), stream=stream)
        await proxy.settled()
    assert answer == "Answer #1 to: What is the capital of Portugal?"
    sessions = [h.get("x-session-id") for h in upstream.script.headers]
    assert len(sessions) == 2 and sessions[0] == sessions[1] and sessions[0]
    reason = "unreachable" if how == "drop" else f"status_{how}"
    assert request_line(logs)["retried"] == reason
    assert await proxy.metric("smartcache_upstream_retries_total", reason=reason) == 1
    assert await stored(proxy) == 1  # the answer of the second attempt, as any miss's


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_second_failure_reaches_the_client_and_nothing_is_stored(
    make_proxy: ProxyFactory, upstream: Upstream, failing: Failing, stream: bool
) -> None:
    failing.times = 5
    proxy = await make_proxy()
    with pytest.raises(openai.APIStatusError) as caught:
        await ask(proxy.client(), stream=stream)
    await proxy.settled()
    assert caught.value.status_code == 503 and len(upstream.script.calls) == 2
    assert await stored(proxy) == 0


@pytest.mark.parametrize("how", ["400", "429"])
async def test_a_refusal_of_the_request_itself_is_not_retried(
    make_proxy: ProxyFactory, upstream: Upstream, failing: Failing, how: str
) -> None:
    failing.how = how
    proxy = await make_proxy()
    with pytest.raises(openai.APIStatusError) as caught:
        await ask(proxy.client(), stream=False)
    assert caught.value.status_code == int(how) and len(upstream.script.calls) == 1


async def test_the_setting_turns_retries_off(make_proxy: ProxyFactory, upstream: Upstream) -> None:
    proxy = await make_proxy(upstream_retry=False)
    with capture_logs() as logs, pytest.raises(openai.APIStatusError) as caught:
        await ask(proxy.client(), stream=False)
    assert caught.value.status_code == 503 and len(upstream.script.calls) == 1
    assert request_line(logs)["retried"] is None


async def test_a_stream_cut_after_its_first_byte_is_never_retried(
    make_proxy: ProxyFactory, upstream: Upstream, failing: Failing
) -> None:
    failing.times = 0
    upstream.script.mode = "cut"
    proxy = await make_proxy()
    client = proxy.client()
    with pytest.raises(openai.APIError):
        await ask(client, stream=True)
    await proxy.settled()
    await asyncio.sleep(0.05)
    assert len(upstream.script.calls) == 1 and await stored(proxy) == 0
