"""An upstream call relayed to the client, sent once more where it failed before the client had a
byte (proxy.upstream.retry): a router that lost the replica it chose moves the second attempt,
sent with the same routing key, to a live one. Bounded to one retry, so a fleet that is down costs
a client two attempts, never a storm."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from proxy.core.errors import UpstreamError
from proxy.http.outcome import Outcome
from proxy.http.race import UpstreamCall
from proxy.http.relay import OurHeaders, Reading, Relayed, relay_json, relay_stream
from proxy.observability.metrics import Metrics
from proxy.upstream.client import Upstream
from proxy.upstream.readiness import Readiness
from proxy.upstream.retry import retry_reason


async def relay_with_retry(
    upstream: Upstream,
    http: web.Request,
    call: UpstreamCall,
    again: Callable[[], UpstreamCall],
    *,
    retry: bool,
    stream: bool,
    strip_usage: bool,
    out: Outcome,
    ours: OurHeaders,
    metrics: Metrics,
    reading: Reading,
    readiness: Readiness | None = None,
) -> Relayed:
    """``call`` relayed; ``again`` sends the same request once more (with the same routing key)
    where ``retry`` allows it and the failure is worth it. Says why in ``out.retried``. Each
    attempt's outcome goes to ``readiness``: a forward that finds the upstream gone makes /readyz
    say so at once, without waiting for its next probe."""
    while True:
        # an error raised here came before the client got a byte: once a stream's status line is
        # relayed, what breaks ends it in-band (relay_stream) and is never raised
        try:
            if not stream:
                answer = await call.json()
                if readiness is not None:
                    readiness.answered(answer.status)
                return relay_json(answer, out, ours, reading)
            async with call.opened() as resp:
                if readiness is not None:
                    readiness.answered(resp.status)
                return await relay_stream(
                    upstream, http, resp, strip_usage=strip_usage, out=out, ours=ours, metrics=metrics, reading=reading
                )
        except UpstreamError as exc:
            if readiness is not None:
                readiness.failed(exc)
            metrics.upstream_error(type(exc).__name__)
            reason = retry_reason(exc) if retry and out.retried is None else None
            if reason is None:
                raise
            out.retried = reason
            metrics.upstream_retry(reason)
            call = again()
