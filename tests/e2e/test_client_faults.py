"""Clients that misbehave, against the real proxy on loopback: one that hangs up mid-stream, one
that reads a stream slowly, header floods, idle keep-alive connections by the thousand, and
requests pipelined on one socket. The proxy must store nothing it did not relay whole, hold no
more of a stream than the sockets do, refuse floods with a 400 and stay up, close idle
connections after ``keepalive_timeout``, and answer pipelined requests in order."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.http import keys
from proxy.storage.base import Selector
from tests.conftest import Proxy, ProxyFactory, Upstream


def chat_body(text: str, *, model: str = "m", stream: bool = False, **extra: object) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": text}], "stream": stream, **extra})


def raw_post(proxy: Proxy, body: bytes, *, headers: tuple[str, ...] = ()) -> bytes:
    head = [
        "POST /v1/chat/completions HTTP/1.1",
        f"Host: 127.0.0.1:{proxy.server.port}",
        "Content-Type: application/json",
        "Authorization: Bearer key-A",
        f"Content-Length: {len(body)}",
        *headers,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def connect(proxy: Proxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.server.port)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response off the socket, by its Content-Length (the proxy's JSON answers
    and errors all carry one)."""
    status_line = await reader.readline()
    assert status_line, "the connection closed before a response"
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def requests_counted(proxy: Proxy) -> float:
    """Chat requests the proxy has finished accounting for (its canonical line and metrics)."""
    body, _ = proxy.app[keys.METRICS].render()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith("smartcache_requests_total{")
    )


async def eventually(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def records_of(proxy: Proxy, model: str) -> int:
    return len(await proxy.app[keys.CACHE].store.find(Selector(model=model, states=None), limit=100))


async def healthy(proxy: Proxy) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        resp = await http.post(
            f"{proxy.base_url}/chat/completions",
            content=chat_body("Are you still there?", model="m-health"),
            headers={"Authorization": "Bearer key-A", "Content-Type": "application/json"},
        )
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"]


# --- disconnect mid-stream ------------------------------------------------------------------------


async def test_a_client_gone_mid_stream_leaves_nothing_cached(make_proxy: ProxyFactory, upstream: Upstream) -> None:
    """relay.py: only an answer relayed whole is storable; a client that hangs up mid-stream got
    part of it, so nothing is stored and the next asker is answered fresh and whole."""
    text, model = "Tell me the long story of the lighthouse keeper.", "m-gone"
    long_answer = " ".join(f"word{i}" for i in range(1500))  # ~1500 chunks: seconds of streaming
    upstream.script.answers[text] = long_answer
    proxy = await make_proxy()
    before = await requests_counted(proxy)
    reader, writer = await connect(proxy)
    writer.write(raw_post(proxy, chat_body(text, model=model, stream=True)))
    await writer.drain()
    first = await reader.readuntil(b"\n\n")
    assert b"200" in first.split(b"\r\n", 1)[0]
    await reader.readuntil(b"data: ")  # the stream has started
    writer.transport.abort()  # a hard hang-up (RST), as a killed client does

    async def finished() -> bool:
        return await requests_counted(proxy) > before

    await eventually(finished)
    assert await records_of(proxy, model) == 0
    calls = len(upstream.script.calls)
    async with httpx.AsyncClient(timeout=30) as http:
        again = await http.post(
            f"{proxy.base_url}/chat/completions",
            content=chat_body(text, model=model),
            headers={"Authorization": "Bearer key-B", "Content-Type": "application/json"},
        )
    assert again.headers["x-cache-status"] == "miss"
    assert again.json()["choices"][0]["message"]["content"] == long_answer
    assert len(upstream.script.calls) == calls + 1


# --- slow reader ----------------------------------------------------------------------------------

BIG_EVENTS = 6_000
EVENT_TEXT = "x" * 4000  # ~4 kB an event, ~24 MB a stream


@dataclass
class Firehose:
    """An upstream that streams a huge answer as fast as the proxy will take it, counting what
    it managed to hand to its socket."""

    sent: int = 0
    finished: bool = False

    def app(self) -> web.Application:
        async def chat(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            # a small send buffer here, so what the upstream got out measures the proxy's buffering
            # more than the kernel's
            sock = request.transport.get_extra_info("socket") if request.transport else None
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            base = {"id": "chatcmpl-big", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
            for i in range(BIG_EVENTS):
                delta = {"role": "assistant", "content": EVENT_TEXT} if i == 0 else {"content": EVENT_TEXT}
                event = b"data: " + orjson.dumps({**base, "choices": [{"index": 0, "delta": delta}]}) + b"\n\n"
                await resp.write(event)  # waits while the proxy's socket is full
                self.sent += len(event)
            stop = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            await resp.write(b"data: " + orjson.dumps(stop) + b"\n\ndata: [DONE]\n\n")
            self.finished = True
            return resp

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app


@pytest.fixture
async def firehose() -> AsyncIterator[tuple[Firehose, str]]:
    hose = Firehose()
    server = TestServer(hose.app(), host="127.0.0.1")
    await server.start_server()
    yield hose, str(server.make_url("/v1"))
    await server.close()


async def test_a_slow_reader_holds_the_upstream_back_instead_of_filling_memory(
    make_proxy: ProxyFactory, firehose: tuple[Firehose, str]
) -> None:
    """Back-pressure end to end: while the client reads nothing the proxy stops reading the
    upstream, so what the upstream got out is what the socket buffers on the way hold, not the
    answer (a proxy that buffered would let the whole ~24 MB out at once). Once the client reads,
    every byte arrives."""
    hose, url = firehose
    proxy = await make_proxy(upstream=url, upstream_timeout=60.0)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # before connect: a small window
    sock.connect(("127.0.0.1", proxy.server.port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(
        raw_post(proxy, chat_body("Stream me everything.", model="m-slow", stream=True, cache={"no_store": True}))
    )
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    try:
        # the client reads nothing: every buffer on the way fills, then the upstream stops; on a
        # busy machine filling takes a while, so wait for it to stop rather than for a set time
        stalled = await settled(lambda: hose.sent)
        total = BIG_EVENTS * (len(EVENT_TEXT) + 100)
        assert stalled < total / 2, f"{stalled} of {total} bytes left the upstream for a client that read nothing"
        received = 0
        tail = b""
        while chunk := await asyncio.wait_for(reader.read(1 << 20), 30):
            received += len(chunk)
            tail = (tail + chunk)[-64:]
            if tail.endswith(b"data: [DONE]\n\n") or tail.endswith(b"0\r\n\r\n"):
                break
        assert hose.finished and received >= hose.sent
    finally:
        writer.transport.abort()  # a failed check must not leave the proxy writing to a reader that is gone


async def settled(value: Callable[[], int], *, quiet: float = 0.5, timeout: float = 30.0) -> int:
    """The value once it has stopped changing for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last, since = value(), time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, "the value kept changing"
        await asyncio.sleep(0.1)
        if (now := value()) != last:
            last, since = now, time.monotonic()
    return last


# --- header floods --------------------------------------------------------------------------------


FLOODS = [
    ("many headers", tuple(f"X-Flood-{i}: v" for i in range(200)), "/v1/chat/completions"),
    ("one huge header", ("X-Huge: " + "a" * 20_000,), "/v1/chat/completions"),
    ("huge header name", ("X-" + "n" * 20_000 + ": v",), "/v1/chat/completions"),
    ("huge request line", (), "/v1/chat/completions?q=" + "q" * 20_000),
]


async def test_a_header_flood_is_refused_with_400_and_the_proxy_stays_up(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    proxy = await make_proxy()
    body = chat_body("Hello over a flood.", model="m-flood")
    for name, extra, path in FLOODS:
        request = raw_post(proxy, body, headers=extra).replace(b"POST /v1/chat/completions ", f"POST {path} ".encode())
        reader, writer = await connect(proxy)
        writer.write(request)
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 10)  # refused and closed, not kept waiting
        writer.close()
        assert response.split(b"\r\n", 1)[0].split()[1] == b"400", (name, response[:200])
        assert not upstream.script.calls, name  # refused before any handler ran
    await healthy(proxy)


async def test_header_limits_are_settings(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(max_headers=32, max_header_bytes=2048)
    cases = [
        (tuple(f"X-H-{i}: v" for i in range(20)), 200),
        (tuple(f"X-H-{i}: v" for i in range(40)), 400),
        (("X-Big: " + "b" * 1500,), 200),
        (("X-Big: " + "b" * 3000,), 400),
    ]
    for extra, want in cases:
        reader, writer = await connect(proxy)
        writer.write(
            raw_post(proxy, chat_body("Limits as settings.", model="m-limits"), headers=(*extra, "Connection: close"))
        )
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert int(response.split(b"\r\n", 1)[0].split()[1]) == want, (len(extra), want)


# --- idle keep-alive connections -------------------------------------------------------------------

IDLE_SOCKETS = 1000


@pytest.mark.slow
async def test_idle_connections_are_served_beside_and_closed_after_the_keepalive_timeout(
    make_proxy: ProxyFactory,
) -> None:
    """A thousand idle sockets (900 never sent a byte, 100 finished one request and kept the
    connection) do not stop the proxy answering, and it closes every one of them once idle for
    ``keepalive_timeout``: idle clients cannot pile up to the descriptor limit."""
    # aiohttp starts the idle clock when a connection is made, so the sockets that ask are opened
    # last and ask at once: on a loaded machine, opening a thousand can take a second or more.
    keepalive = 4.0
    proxy = await make_proxy(keepalive_timeout=keepalive)
    server = proxy.server.runner.server  # type: ignore[union-attr]
    assert server is not None
    asking = IDLE_SOCKETS // 10  # a hundred of them ask once and stay
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for start in range(0, IDLE_SOCKETS - asking, 100):
        opened += await asyncio.gather(*(connect(proxy) for _ in range(start, start + 100)))
    used = await asyncio.gather(*(connect(proxy) for _ in range(asking)))
    for _, writer in used:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    opened += used
    statuses = [(await read_response(reader))[0] for reader, _ in used]
    assert statuses == [200] * len(used)
    assert len(server.connections) >= IDLE_SOCKETS
    t = time.monotonic()
    await healthy(proxy)
    assert time.monotonic() - t < 5
    closed = await asyncio.wait_for(asyncio.gather(*(reader.read() for reader, _ in opened)), keepalive + 10)
    assert all(data == b"" for data in closed)  # the server hung up: EOF, nothing sent

    async def drained() -> bool:
        return len(server.connections) <= 1

    await eventually(drained)
    for _, writer in opened:
        writer.close()


# --- pipelining -----------------------------------------------------------------------------------


async def test_pipelined_requests_on_one_socket_are_answered_in_order(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    """HTTP/1.1 pipelining: several requests written at once, before any answer; the answers
    come back on the same socket in the order asked, each the answer to its own request, a
    non-chat request among them included."""
    proxy = await make_proxy()
    texts = [f"Pipelined question number {i} about {topic}?" for i, topic in enumerate(("owls", "tides", "moss"))]
    for i, text in enumerate(texts):
        upstream.script.answers[text] = f"answer-{i}"
    requests = [raw_post(proxy, chat_body(t, model="m-pipe")) for t in texts]
    requests.insert(1, f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{proxy.server.port}\r\n\r\n".encode())
    reader, writer = await connect(proxy)
    writer.write(b"".join(requests))
    await writer.drain()
    replies = [await asyncio.wait_for(read_response(reader), 15) for _ in requests]
    writer.close()
    assert [status for status, _, _ in replies] == [200] * 4
    assert json.loads(replies[1][2])["status"] == "ok"
    chats = [replies[0], *replies[2:]]
    assert [json.loads(body)["choices"][0]["message"]["content"] for _, _, body in chats] == [
        "answer-0",
        "answer-1",
        "answer-2",
    ]
