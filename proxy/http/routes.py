"""Thin HTTP handlers: read, parse, identify, hand over."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace

from aiohttp import web

from proxy.core.errors import BodyTooLarge, InvalidRequest, MethodNotAllowed, NotFound, SmartCacheError
from proxy.core.identity import caller_tenant, identify
from proxy.core.model import Reason
from proxy.core.openai.request import ChatRequest, load_object, parse_chat_request
from proxy.core.openai.responses import Chain, as_chat, parse_responses_request
from proxy.http import keys
from proxy.http.dialect import ResponsesDialect
from proxy.settings import Settings
from proxy.storage.base import StoreUnavailable
from proxy.upstream.client import chat_headers, forward_headers, response_headers

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
    _check_length(chat_request, settings, "messages", "'messages' has {} entries")
    who = identify(request.headers, chat_request, salt=app[keys.TENANT_SALT], query=tuple(request.query.items()))
    app[keys.METRICS].observe_stage("parse", time.perf_counter() - t)
    return await app[keys.CHAT].handle(request, chat_request, who)


async def responses(request: web.Request) -> web.StreamResponse:
    """The Responses API through the same cache, read as the chat request it is
    (proxy.core.openai.responses); ``previous_response_id`` resolved within the caller's tenant."""
    app = request.app
    settings = app[keys.SETTINGS]
    t = time.perf_counter()
    raw = await read_body(request, settings.max_body_bytes)
    parsed = parse_responses_request(load_object(raw))
    salt, query = app[keys.TENANT_SALT], tuple(request.query.items())
    chains = app[keys.STORE].chains
    earlier: Chain | None = None
    lost = False
    if parsed.previous_response_id is not None:
        try:
            earlier = await chains.get(
                caller_tenant(request.headers, salt=salt, query=query), parsed.previous_response_id
            )
        except StoreUnavailable:
            lost = True  # forwarded untouched and uncached, as a store that is down leaves any request
    chat_request = as_chat(parsed, earlier, cache_control=request.headers.get("Cache-Control"))
    if lost:
        chat_request = replace(chat_request, bypass_reason=chat_request.bypass_reason or Reason.STORE_UNAVAILABLE)
    _check_length(
        chat_request, settings, "input", "the conversation (input and the responses it continues) has {} messages"
    )
    who = identify(request.headers, chat_request, salt=salt, query=query)
    app[keys.METRICS].observe_stage("parse", time.perf_counter() - t)
    return await app[keys.CHAT].handle(request, chat_request, who, ResponsesDialect(parsed, earlier, chains))


def _check_length(chat_request: ChatRequest, settings: Settings, param: str, says: str) -> None:
    if len(chat_request.messages) > settings.max_messages:
        raise InvalidRequest(
            f"{says.format(len(chat_request.messages))}; this proxy takes at most "
            f"{settings.max_messages} (setting max_messages)",
            param=param,
        )


async def chat_other_method(request: web.Request) -> web.StreamResponse:
    """``/v1/chat/completions`` takes POST: any other method is answered here, as OpenAI does, not
    passed to an upstream whose plain-text 405 no SDK reads. OPTIONS (a CORS preflight) goes on."""
    if request.method == "OPTIONS":
        return await passthrough(request)
    raise MethodNotAllowed(request.method, request.path, allow="POST")


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Every other /v1 route goes upstream untouched, streaming both ways: the request body as
    it arrives, the answer as raw bytes with its own content-encoding. Memory stays bounded by
    the read buffers whatever the size (audio, files, batches). An upstream's 404 or 405 that is
    not JSON (a route or method it does not have) becomes an OpenAI-style error."""
    app = request.app
    upstream = app[keys.UPSTREAM]
    limit = app[keys.SETTINGS].passthrough_max_body_bytes
    body = stream_body(request, limit) if request.can_read_body else None
    path = request.match_info.get("tail", request.path.removeprefix("/v1/"))
    async with upstream.open_stream(
        request.method,
        path,
        headers=forward_headers(request.headers, keep=PASSTHROUGH_KEEPS),
        content=body,
        params=list(request.query.items()),
        raw=True,
    ) as resp:
        if resp.status in (404, 405) and not _is_json(resp.headers.get("content-type")):
            raise _no_such_route(request, resp.status, chat_headers(resp.headers))
        headers = response_headers(resp.headers)
        headers["x-cache-status"] = "bypass"
        response = web.StreamResponse(status=resp.status, headers=headers)
        await response.prepare(request)
        async for chunk in upstream.iter_raw(resp):
            await response.write(chunk)
        await response.write_eof()
        return response


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _no_such_route(request: web.Request, status: int, upstream_headers: dict[str, str]) -> SmartCacheError:
    """The error OpenAI answers for a route or a method it does not have, with the upstream's headers."""
    headers = {**upstream_headers, "x-cache-status": "bypass"}
    said = f": the upstream answered {status} in plain text"
    if status == 405:
        allow = headers.pop("allow", None)
        return MethodNotAllowed(request.method, request.path, allow=allow, detail=said, headers=headers)
    return NotFound(f"Invalid URL ({request.method} {request.path}){said}", code="unknown_url", headers=headers)


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process is up and serves (the model, the index and the store are loaded by
    the time it answers). It never asks the upstream: an upstream outage must not get a healthy
    proxy restarted. Readiness, upstream included, is ``/readyz``."""
    cache = request.app[keys.CACHE]
    return web.json_response(
        {
            "status": "ok",
            "records_indexed": len(cache.index),
            "policy_version": request.app[keys.POLICY_BOX].policy.version,
        }
    )


async def readyz(request: web.Request) -> web.Response:
    """Readiness: 200 while the upstream answers, 503 while it does not, with its state either way
    (probed with a short timeout, the result kept a few seconds: proxy.upstream.readiness)."""
    readiness = request.app[keys.READINESS]
    state = await readiness.check()
    body = {
        "status": "ready" if state.reachable else "not_ready",
        "upstream": state.as_json(readiness.upstream.base_url, readiness.clock()),
    }
    judging = request.app[keys.CHAT].judging
    if judging is not None:  # which models passed the judge's exam: the others decide nothing
        body["judge"] = judging.qualification.standings()
    return web.json_response(body, status=200 if state.reachable else 503)


async def metrics(request: web.Request) -> web.Response:
    # the counters of every answer already given (proxy.service.settling)
    await request.app[keys.CHAT].settling.everything()
    body, content_type = request.app[keys.METRICS].render()
    return web.Response(body=body, headers={"Content-Type": content_type})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_route("*", "/v1/chat/completions", chat_other_method)
    app.router.add_post("/v1/responses", responses)
    app.router.add_route("*", "/v1/{tail:.*}", passthrough)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
