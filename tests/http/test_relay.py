"""What the proxy relays from and to the upstream, against the scripted upstream on loopback:
compressed answers arrive decodable, the upstream's own response headers (request ids, rate
limits, timing) reach the client on misses, and passthrough bodies stream both ways under their
own size limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from openai.types.chat import ChatCompletionMessageParam

from proxy.core.openai.request import completion_chunks, completion_json, new_completion_id
from tests.conftest import ProxyFactory
from tests.scripted_upstream import Script, scripted_app

UPSTREAM_HEADERS = {
    "x-request-id": "req-123",
    "x-ratelimit-remaining-requests": "99",
    "x-ratelimit-reset-tokens": "6ms",
    "openai-processing-ms": "42",
}
MB = 1024 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Relaying:
    """A scripted upstream with extras: forced gzip, headers on every answer, an upload route."""

    script: Script
    server: TestServer
    uploads: list[int]
    first_bytes: asyncio.Event

    @property
    def url(self) -> str:
        return str(self.server.make_url("/v1"))


async def _start(*, force_gzip: bool = False, honest_gzip: bool = False) -> Relaying:
    script = Script()
    app = scripted_app(script)
    uploads: list[int] = []
    first_bytes = asyncio.Event()

    async def gzipped_chat(request: web.Request) -> web.StreamResponse:
        """The scripted answer, compressed whatever the request's accept-encoding says."""
        body = await request.json()
        script.calls.append(body)
        script.headers.append(dict(request.headers))
        text, cid = script.answer_for(body), new_completion_id()
        if not body.get("stream"):
            response: web.StreamResponse = web.json_response(
                completion_json(completion_id=cid, model=body["model"], content=text)
            )
            response.enable_compression(web.ContentCoding.gzip)
            return response
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        response.enable_compression(web.ContentCoding.gzip)
        await response.prepare(request)
        for event in completion_chunks(completion_id=cid, model=body["model"], content=text, include_usage=True):
            await response.write(event)
        await response.write_eof()
        return response

    @web.middleware
    async def compressing(request: web.Request, handler: Handler) -> web.StreamResponse:
        if force_gzip and request.path == "/v1/chat/completions":
            return await gzipped_chat(request)
        response = await handler(request)
        if not response.prepared and (force_gzip or honest_gzip):
            # forced: an upstream that compresses whatever it was asked; honest: only when the
            # request's accept-encoding allows it
            response.enable_compression(web.ContentCoding.gzip if force_gzip else None)
        return response

    async def with_headers(_: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(UPSTREAM_HEADERS)

    async def upload(request: web.Request) -> web.Response:
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            first_bytes.set()
        uploads.append(size)
        return web.json_response({"received": size})

    async def download(request: web.Request) -> web.StreamResponse:
        size = int(request.query["bytes"])
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        for _ in range(size // MB):
            await response.write(b"x" * MB)
        await response.write_eof()
        return response

    app.middlewares.append(compressing)
    app.on_response_prepare.append(with_headers)
    app.router.add_post("/v1/audio/transcriptions", upload)
    app.router.add_get("/v1/files/blob/content", download)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return Relaying(script, server, uploads, first_bytes)


@pytest.fixture
async def gzipping() -> AsyncIterator[Relaying]:
    relaying = await _start(force_gzip=True)
    yield relaying
    await relaying.server.close()


@pytest.fixture
async def honest() -> AsyncIterator[Relaying]:
    relaying = await _start(honest_gzip=True)
    yield relaying
    await relaying.server.close()


MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Recommend a good book about databases."}]


async def test_passthrough_from_a_gzipping_upstream_is_decodable(make_proxy: ProxyFactory, gzipping: Relaying) -> None:
    proxy = await make_proxy(upstream=gzipping.url)
    models = await proxy.client().models.list()
    assert [m.id for m in models.data] == ["scripted"]


async def test_streamed_chat_from_a_gzipping_upstream_arrives_decoded(
    make_proxy: ProxyFactory, gzipping: Relaying
) -> None:
    proxy = await make_proxy(upstream=gzipping.url)
    stream = await proxy.client().chat.completions.create(
        model="m",
        messages=MESSAGES,
        stream=True,
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text.startswith("Answer #1 to: Recommend")


async def test_json_chat_from_a_gzipping_upstream_arrives_decoded(make_proxy: ProxyFactory, gzipping: Relaying) -> None:
    proxy = await make_proxy(upstream=gzipping.url)
    reply = await proxy.client().chat.completions.create(model="m", messages=MESSAGES)
    assert (reply.choices[0].message.content or "").startswith("Answer #1 to: Recommend")


async def test_chat_asks_the_upstream_for_an_uncompressed_answer(make_proxy: ProxyFactory, honest: Relaying) -> None:
    proxy = await make_proxy(upstream=honest.url)
    await proxy.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert honest.script.headers[-1]["Accept-Encoding"] == "identity"


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_response_headers_reach_the_client_on_a_miss(
    make_proxy: ProxyFactory, honest: Relaying, stream: bool
) -> None:
    proxy = await make_proxy(upstream=honest.url)
    raw = await proxy.client().chat.completions.with_raw_response.create(
        model="m",
        messages=MESSAGES,
        stream=stream,
    )
    assert raw.headers["x-cache-status"] == "miss"
    for name, value in UPSTREAM_HEADERS.items():
        assert raw.headers.get(name) == value, name
    # our framing wins: one content type, and no hop-by-hop header of the upstream's connection
    assert len(raw.headers.get_list("content-type")) == 1
    assert "keep-alive" not in {k.lower() for k in raw.headers}


async def test_passthrough_takes_an_upload_larger_than_the_chat_limit(
    make_proxy: ProxyFactory, honest: Relaying
) -> None:
    proxy = await make_proxy(upstream=honest.url)
    body = b"\0" * (11 * MB)
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"{proxy.base_url}/audio/transcriptions", content=body)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"received": len(body)}


async def test_passthrough_request_body_reaches_the_upstream_while_the_client_still_sends(
    make_proxy: ProxyFactory, honest: Relaying
) -> None:
    """The client holds back the rest of its body until the upstream has seen the first part: a
    proxy that buffers the whole body first never forwards anything, and this times out."""
    proxy = await make_proxy(upstream=honest.url)

    async def body() -> AsyncIterator[bytes]:
        yield b"a" * 65536
        await asyncio.wait_for(honest.first_bytes.wait(), timeout=10)
        yield b"b" * 65536

    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(f"{proxy.base_url}/audio/transcriptions", content=body())
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"received": 2 * 65536}


async def test_passthrough_response_streams_a_large_download(make_proxy: ProxyFactory, honest: Relaying) -> None:
    proxy = await make_proxy(upstream=honest.url)
    size = 0
    url = f"{proxy.base_url}/files/blob/content"
    async with httpx.AsyncClient(timeout=60) as http, http.stream("GET", url, params={"bytes": 32 * MB}) as resp:
        assert resp.status_code == 200
        async for chunk in resp.aiter_raw():
            size += len(chunk)
    assert size == 32 * MB


@pytest.mark.parametrize("declared", [True, False])
async def test_passthrough_over_its_own_limit_is_413_in_openai_format(
    make_proxy: ProxyFactory, honest: Relaying, declared: bool
) -> None:
    proxy = await make_proxy(upstream=honest.url, passthrough_max_body_bytes=MB)
    payload = b"\0" * (2 * MB)

    async def chunked() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 65536):
            yield payload[i : i + 65536]

    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(f"{proxy.base_url}/audio/transcriptions", content=payload if declared else chunked())
    assert resp.status_code == 413
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert "passthrough_max_body_bytes" in resp.json()["error"]["message"]
    if declared:  # the declared length alone is refused before anything goes upstream
        assert honest.uploads == []


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_response_headers_reach_the_client_on_a_half_hit(
    make_proxy: ProxyFactory, honest: Relaying, stream: bool
) -> None:
    """A code question asked again in other words: the shipped policy never serves code answers
    directly (direct_hit: false), so the stored one makes a half-hit."""
    proxy = await make_proxy(upstream=honest.url, debug_headers=True)
    client = proxy.client(**{"x-smartcache-session": f"code-{stream}", "x-smartcache-debug": "1"})
    first = "Write a Python function that reverses a linked list."
    again = "Write a Python function to reverse a linked list."
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": first}])
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": again}], stream=stream
    )
    assert raw.headers["x-cache-status"] == "half-hit", raw.headers.get("x-smartcache-reason")
    for name, value in UPSTREAM_HEADERS.items():
        assert raw.headers.get(name) == value, name
