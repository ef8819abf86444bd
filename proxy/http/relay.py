"""Relaying an upstream answer to the client as it arrives, JSON or SSE, while reading what
write-back and coalesced followers need out of it. A stream cut after its status line ends with an
in-band error event, as OpenAI's own do; nothing but a whole answer is ever marked storable. How
an answer is read is the API's (``Reading``: proxy.http.dialect); the relaying is the same."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web

from proxy.core.errors import UpstreamError, UpstreamUnavailable
from proxy.core.openai.sse import StreamTee
from proxy.http.outcome import Ending, Outcome
from proxy.observability.metrics import Metrics
from proxy.upstream.client import CHAT_PATH, JsonAnswer, Query, Upstream, chat_headers


@dataclass(frozen=True, slots=True)
class JsonRead:
    """What an upstream's JSON answer says, in chat's terms."""

    text: str | None  # its plain text whatever its ending; None: tool calls, no text answer
    finish_reason: str | None
    usage: dict[str, Any]
    response_id: str | None
    plain: bool  # one whole, non-empty text answer: kept where it stopped, or was cut at the limit


class Reading(Protocol):
    """How one API's upstream answers are read while they are relayed."""

    def read_json(self, body: Any) -> JsonRead: ...

    def tee(self, *, strip_usage: bool) -> StreamTee: ...

    def error_event(self, exc: UpstreamError) -> bytes:
        """The in-band event that ends a stream the upstream broke."""
        ...


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


def relay_json(answer: JsonAnswer, out: Outcome, ours: OurHeaders, reading: Reading) -> Relayed:
    out.upstream_status = answer.status
    read = reading.read_json(answer.body)
    if read.response_id is not None:
        out.response_id = read.response_id
    response = web.Response(
        body=answer.raw, status=answer.status, content_type="application/json", headers={**answer.headers, **ours()}
    )
    finish = read.finish_reason
    return Relayed(
        response, read.usage, read.text, finish, read.plain and finish == "stop", read.plain and finish == "length"
    )


@contextlib.asynccontextmanager
async def opened_stream(
    upstream: Upstream, body: dict[str, Any], headers: dict[str, str], *, params: Query = (), path: str = CHAT_PATH
) -> AsyncIterator[aiohttp.ClientResponse]:
    """A streamed call whose status line said success; an error status raises (with the
    upstream's headers). ``params``: the client's query string, sent on as it came."""
    async with upstream.open_stream("POST", path, headers=headers, content=orjson.dumps(body), params=params) as resp:
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
    reading: Reading,
) -> Relayed:
    """``resp``: an opened stream (``opened_stream``, or a raced call's), its body unread.

    A whole answer is relayed up to its end but for the end of the body itself: the caller ends it
    (``write_eof``) once what it does with the answer is under way, so the client cannot have
    the answer before the proxy has registered its keeping (proxy.service.settling)."""
    tee = reading.tee(strip_usage=strip_usage)
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
            raise UpstreamUnavailable("upstream stream ended before its last event")
    except UpstreamError as exc:
        # the status line is gone already: say so in-band, as OpenAI does, and store nothing
        metrics.upstream_error(type(exc).__name__)
        out.ending = Ending.UPSTREAM_CUT
        await end_with_error(response, reading.error_event(exc))
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


async def end_with_error(response: web.StreamResponse, event: bytes) -> None:
    with contextlib.suppress(ConnectionResetError):
        await response.write(event)
        await response.write_eof()
