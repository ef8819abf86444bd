"""Relaying an upstream chat answer to the client as it arrives, JSON or SSE, while reading what
write-back and coalesced followers need out of it. A stream cut after its status line ends with an
in-band error event, as OpenAI's own do; nothing but a whole answer is ever marked storable."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.core.errors import UpstreamError, UpstreamUnavailable
from proxy.core.openai.sse import StreamTee, answer_of_completion
from proxy.http.outcome import Ending, Outcome
from proxy.observability.metrics import Metrics
from proxy.upstream import coalesce
from proxy.upstream.client import JsonAnswer, Query, Upstream, chat_headers


@dataclass(frozen=True, slots=True)
class Relayed:
    """What an upstream call produced, as write-back and coalesced followers need it."""

    response: web.StreamResponse
    usage: dict[str, Any]
    text: str | None = None  # None: no answer came back whole (error in-band, cut, client gone)
    finish_reason: str | None = None
    storable: bool = False  # complete, successful, plain text
    # whole and plain, but ended at the token limit: storable only where the request set that limit
    cut_at_limit: bool = False


# the cache's own headers, computed once the upstream's status is known
OurHeaders = Callable[[], dict[str, str]]


def relay_json(answer: JsonAnswer, out: Outcome, ours: OurHeaders) -> Relayed:
    out.upstream_status = answer.status
    plain, usage = answer_of_completion(answer.body, cut_ok=True)
    if isinstance(answer.body, dict) and isinstance(answer.body.get("id"), str):
        out.response_id = answer.body["id"]
    response = web.Response(
        body=answer.raw, status=answer.status, content_type="application/json", headers={**answer.headers, **ours()}
    )
    text, finish = coalesce.plain_answer(answer.body)
    return Relayed(
        response, usage, text, finish, plain is not None and finish == "stop", plain is not None and finish == "length"
    )


@contextlib.asynccontextmanager
async def opened_stream(
    upstream: Upstream, body: dict[str, Any], headers: dict[str, str], *, params: Query = ()
) -> AsyncIterator[aiohttp.ClientResponse]:
    """A streamed chat call whose status line said success; an error status raises (with the
    upstream's headers). ``params``: the client's query string, sent on as it came."""
    async with upstream.open_stream(
        "POST", "chat/completions", headers=headers, content=orjson.dumps(body), params=params
    ) as resp:
        if resp.status >= 400:
            raise await upstream.read_error(resp)
        yield resp


async def relay_stream(
    upstream: Upstream,
    http: web.Request,
    resp: aiohttp.ClientResponse,
    *,
    strip_usage: bool,
    out: Outcome,
    ours: OurHeaders,
    metrics: Metrics,
) -> Relayed:
    """``resp``: an opened stream (``opened_stream``, or a raced call's), its body unread.

    A whole answer is relayed up to its end but for the end of the body itself: the caller ends it
    (``write_eof``) once what it does with the answer is under way, so the client cannot have
    the answer before the proxy has registered its keeping (proxy.service.settling)."""
    tee = StreamTee(strip_usage=strip_usage)
    out.upstream_status = resp.status
    response = web.StreamResponse(
        status=resp.status,
        headers={
            **chat_headers(resp.headers),
            **ours(),
            "Content-Type": resp.headers.get("content-type", "text/event-stream"),
            "Cache-Control": "no-cache",
        },
    )
    await response.prepare(http)
    try:
        async for chunk in upstream.iter_bytes(resp):
            if data := tee.feed(chunk):
                await response.write(data)
        if rest := tee.flush():
            await response.write(rest)
        if not tee.done:
            raise UpstreamUnavailable("upstream stream ended before [DONE]")
    except UpstreamError as exc:
        # the status line is gone already: say so in-band, as OpenAI does, and store nothing
        metrics.upstream_error(type(exc).__name__)
        out.ending = Ending.UPSTREAM_CUT
        await end_with_error(response, exc)
        return Relayed(response, tee.usage or {})
    except ConnectionResetError:
        out.ending = Ending.CLIENT_GONE
        return Relayed(response, tee.usage or {})
    out.response_id = tee.response_id
    return Relayed(
        response,
        tee.usage or {},
        tee.text if tee.whole else None,
        tee.finish_reason,
        tee.complete and bool(tee.text.strip()),
        tee.cut_at_limit and bool(tee.text.strip()),
    )


async def end_with_error(response: web.StreamResponse, exc: UpstreamError) -> None:
    with contextlib.suppress(ConnectionResetError):
        await response.write(b"data: " + orjson.dumps(exc.to_body()) + b"\n\n")
        await response.write_eof()
