"""Thin HTTP handlers: read, parse, identify, hand over."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from aiohttp import web

from proxy.errors import BodyTooLarge, InvalidRequest
from proxy.http import keys
from proxy.identity import identify
from proxy.openai.request import parse_chat_request
from proxy.upstream.client import forward_headers, response_headers

# a streamed body keeps its declared length (else it goes chunked); a raw relay may carry any
# encoding the client itself accepts
PASSTHROUGH_KEEPS = frozenset({"content-length", "accept-encoding"})


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def stream_body(request: web.Request, limit: int) -> AsyncIterator[bytes]:
    """The request body as it arrives, refused with 413 past ``limit``: at once when the declared
    length is over it, else when the bytes read so far are."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(_too_large(f"request body of {declared} bytes", limit))

    async def chunks() -> AsyncIterator[bytes]:
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(_too_large("request body", limit))
            yield chunk

    return chunks()


def _too_large(what: str, limit: int) -> str:
    return f"{what} exceeds the passthrough limit of {limit} bytes (setting passthrough_max_body_bytes)"


async def chat_completions(request: web.Request) -> web.StreamResponse:
    app = request.app
    settings = app[keys.SETTINGS]
    t = time.perf_counter()
    raw = await read_body(request, settings.max_body_bytes)
    chat_request = parse_chat_request(raw, cache_control=request.headers.get("Cache-Control"))
    if len(chat_request.messages) > settings.max_messages:
        raise InvalidRequest(
            f"'messages' has {len(chat_request.messages)} entries; this proxy takes at most "
            f"{settings.max_messages} (setting max_messages)",
            param="messages",
        )
    who = identify(request.headers, chat_request, salt=app[keys.TENANT_SALT])
    app[keys.METRICS].observe_stage("parse", time.perf_counter() - t)
    return await app[keys.CHAT].handle(request, chat_request, who)


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Every other /v1 route goes upstream untouched, streaming both ways: the request body as
    it arrives, the answer as raw bytes with its own content-encoding. Memory stays bounded by
    the read buffers whatever the size (audio, files, batches)."""
    app = request.app
    upstream = app[keys.UPSTREAM]
    limit = app[keys.SETTINGS].passthrough_max_body_bytes
    body = stream_body(request, limit) if request.can_read_body else None
    path = request.match_info["tail"]
    async with upstream.open_stream(
        request.method,
        path,
        headers=forward_headers(request.headers, keep=PASSTHROUGH_KEEPS),
        content=body,
        params=list(request.query.items()),
        raw=True,
    ) as resp:
        headers = response_headers(resp.headers)
        headers["x-cache-status"] = "bypass"
        response = web.StreamResponse(status=resp.status, headers=headers)
        await response.prepare(request)
        async for chunk in upstream.iter_raw(resp):
            await response.write(chunk)
        await response.write_eof()
        return response


async def healthz(request: web.Request) -> web.Response:
    cache = request.app[keys.CACHE]
    return web.json_response(
        {
            "status": "ok",
            "records_indexed": len(cache.index),
            "policy_version": request.app[keys.POLICY_BOX].policy.version,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    # the counters of every answer already given (proxy.settling)
    await request.app[keys.CHAT].settling.everything()
    body, content_type = request.app[keys.METRICS].render()
    return web.Response(body=body, headers={"Content-Type": content_type})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_route("*", "/v1/{tail:.*}", passthrough)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
