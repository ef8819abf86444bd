"""The hard cap on open client connections (proxy.http.listener): past ``max_connections`` a new
connection gets an OpenAI-style 503 and is closed, the open ones are served as before, and a slot
freed by a closing connection is taken by the next client."""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from proxy.http import keys
from proxy.http import listener as listener_module
from proxy.http.listener import MAX_REFUSING, RESERVED_DESCRIPTORS, Listener, connection_limit, serving
from proxy.observability.metrics import Metrics


async def hello(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


@pytest.fixture
async def capped() -> AsyncIterator[tuple[Listener, web.Application]]:
    app = web.Application()
    app.router.add_get("/hello", hello)
    app[keys.METRICS] = Metrics()
    async with serving(app, "127.0.0.1", 0, max_connections=3) as listener:
        yield listener, app


async def get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, dict[str, str], bytes]:
    writer.write(b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, await reader.readexactly(int(headers["content-length"]))


async def held_open(listener: Listener, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``n`` keep-alive connections, each past one answered request."""
    held = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(n)]
    for reader, writer in held:
        assert (await get(reader, writer))[0] == 200
    return held


async def until(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_a_connection_past_the_cap_gets_a_503_and_the_open_ones_are_still_served(
    capped: tuple[Listener, web.Application],
) -> None:
    listener, app = capped
    held = await held_open(listener, 3)

    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    status, headers, body = await get(reader, writer)
    assert status == 503
    assert headers["connection"] == "close" and headers["retry-after"] == "1"
    error = json.loads(body)["error"]
    assert error["code"] == "connection_limit" and "3 connections" in error["message"]
    assert await reader.read() == b""  # closed by the proxy, not reset
    writer.close()

    for reader, writer in held:  # keep-alive connections under the cap are untouched
        assert (await get(reader, writer))[0] == 200
    assert listener.cap.counts == {"accepted": 3, "refused": 1, "dropped": 0}
    rendered = app[keys.METRICS].render()[0].decode()
    assert 'smartcache_connections_total{outcome="refused"} 1.0' in rendered
    for _, writer in held:
        writer.close()


async def test_a_slot_freed_by_a_closed_connection_is_taken_by_the_next_client(
    capped: tuple[Listener, web.Application],
) -> None:
    listener, _ = capped
    held = await held_open(listener, 3)
    _, first = held.pop(0)
    first.close()
    await until(lambda: listener.cap.open == 2)

    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    assert (await get(reader, writer))[0] == 200
    assert listener.cap.open == 3
    writer.close()
    for _, w in held:
        w.close()
    await until(lambda: listener.cap.open == 0)


async def test_a_refused_client_that_sends_its_body_late_still_reads_the_503(
    capped: tuple[Listener, web.Application],
) -> None:
    listener, _ = capped
    held = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(3)]
    await until(lambda: listener.cap.open == 3)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    await asyncio.sleep(0.3)  # nothing sent yet: the proxy waits for the head instead of resetting
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}")
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 503")
    writer.close()
    for _, w in held:
        w.close()


def test_the_cap_leaves_the_proxy_its_own_descriptors() -> None:
    assert connection_limit(16_384, descriptor_limit=1_048_576) == 16_384
    assert connection_limit(16_384, descriptor_limit=4_096) == 4_096 - RESERVED_DESCRIPTORS - MAX_REFUSING
    # a small limit keeps a share, not the whole reserve: a proxy of 0 or 1 connections serves nobody
    assert connection_limit(16_384, descriptor_limit=1_024) == 1_024 - 256 - 128
    assert connection_limit(100, descriptor_limit=resource.RLIM_INFINITY) == 100


async def test_past_the_refusals_it_can_wait_for_a_connection_is_closed_unanswered(
    capped: tuple[Listener, web.Application], monkeypatch: pytest.MonkeyPatch
) -> None:
    listener, _ = capped
    monkeypatch.setattr(listener_module, "MAX_REFUSING", 2)
    held = await held_open(listener, 3)
    waiting = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(2)]
    await until(lambda: listener.cap.refusing == 2)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    assert await reader.read() == b""  # closed with nothing said
    assert listener.cap.counts == {"accepted": 3, "refused": 2, "dropped": 1}
    for r, w in waiting:  # those waiting still get their 503 once their head arrives
        w.write(b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await r.readline()).startswith(b"HTTP/1.1 503")
    await until(lambda: listener.cap.refusing == 0)
    for w in (writer, *(w for _, w in (*held, *waiting))):
        w.close()


async def test_an_app_that_cannot_listen_is_cleaned_up_all_the_same() -> None:
    cleaned: list[bool] = []
    app = web.Application()

    async def on_cleanup(_: web.Application) -> None:
        cleaned.append(True)

    app.on_cleanup.append(on_cleanup)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            async with serving(app, "127.0.0.1", taken.getsockname()[1], max_connections=3):
                pass
    assert cleaned == [True]  # the store and the data-dir lock are let go, as on a normal stop
