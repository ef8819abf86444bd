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
from pathlib import Path

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


async def test_an_app_that_fails_to_start_lets_the_address_and_what_started_go() -> None:
    stopped: list[str] = []

    async def first(_: web.Application) -> AsyncIterator[None]:
        yield
        stopped.append("first")  # the engine, say: started before the failing part

    async def failing(_: web.Application) -> AsyncIterator[None]:
        raise RuntimeError("the store would not open")
        yield

    app = web.Application()
    app.cleanup_ctx.extend([first, failing])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RuntimeError):
        async with serving(app, "127.0.0.1", port, max_connections=3):
            pass
    assert stopped == ["first"]
    with socket.socket() as again:  # the address is free again
        again.bind(("127.0.0.1", port))


# --- an address that cannot be had -------------------------------------------------------------------


async def test_a_busy_port_fails_before_the_app_starts_saying_which_and_what_to_do() -> None:
    started: list[str] = []

    async def ctx(_: web.Application) -> AsyncIterator[None]:
        started.append("app")
        yield

    app = web.Application()
    app.cleanup_ctx.append(ctx)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(listener_module.PortUnavailable) as err:
            async with serving(app, "127.0.0.1", port, max_connections=3):
                pass
    assert started == []  # no model, engine or store loaded for nothing
    assert str(err.value).startswith(f"127.0.0.1:{port}: port: in use by another process")
    assert "--port" in str(err.value)


def test_the_cli_says_a_busy_port_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy import cli

    monkeypatch.setattr(cli, "configure_logging", lambda level, **_: None)  # the one global call: not in a test
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["serve", "--upstream", "http://127.0.0.1:9/v1", "--data-dir", str(tmp_path), "--port", str(port)]
        code = cli.main(argv)
    assert code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: 127.0.0.1:{port}: port: " + err.split(": port: ", 1)[1].strip()]
    assert "Traceback" not in err and f"127.0.0.1:{port}" in err and "--port" in err


async def test_connections_wait_for_the_app_to_start() -> None:
    """Bound first, accepting only once set up: a client early is refused, never half-served."""
    app = web.Application()
    app.router.add_get("/hello", hello)
    async with serving(app, "127.0.0.1", 0, max_connections=3) as listener:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        assert (await get(reader, writer))[0] == 200
        writer.close()
