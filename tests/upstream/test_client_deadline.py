"""An upstream that trickles its answer a byte at a time never trips a per-read timeout; the chat
path holds the whole answer to the upstream timeout, streamed or not."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.errors import UpstreamTimeout
from proxy.upstream.client import Upstream

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
