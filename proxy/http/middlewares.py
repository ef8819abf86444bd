"""Errors become OpenAI-style JSON; nothing a client sends can produce a 500 with a traceback."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from proxy.core.errors import ClientError, UpstreamError, UpstreamStatus, error_body

log = structlog.get_logger("smartcache")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(status: int, body: dict[str, object], headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except UpstreamStatus as exc:
        # the upstream's status reaches the client as it came, with its headers (retry-after,
        # x-ratelimit-*, x-request-id), and its body when an SDK can read it
        relayed = {**exc.headers, "x-cache-status": "miss", "x-smartcache-upstream-error": "1"}
        wrapped = exc.client_body()
        if wrapped is not None:
            log.warning("upstream.non_openai_error", status=exc.status, path=request.path)
            return _json(exc.status, wrapped, relayed)
        return web.Response(
            body=exc.body, status=exc.status, content_type=exc.content_type.split(";")[0], headers=relayed
        )
    # a config or service error here is the proxy's own failure: the last branch logs it, and
    # the client is told no detail
    except (ClientError, UpstreamError) as exc:
        headers = {**exc.headers, "x-cache-status": "miss"} if exc.status >= 500 else exc.headers
        return _json(exc.status, exc.to_body(), headers)
    except web.HTTPRequestEntityTooLarge as exc:
        return _json(413, error_body(f"request body too large: {exc.text}", "invalid_request_error"))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        allow = {"allow": exc.headers["allow"]} if "allow" in exc.headers else None
        return _json(exc.status, error_body(exc.reason or "error", kind), allow)
    except Exception:
        log.exception("request.failed", path=request.path)
        return _json(500, error_body("internal error in SmartCache; the request was not cached", "server_error"))
