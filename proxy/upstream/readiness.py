"""Is the upstream reachable? The readiness half of the health checks (``/readyz``): a load
balancer or Kubernetes sends traffic only to a proxy whose upstream answers. ``/healthz`` stays
the liveness check (the process serves), so an upstream outage never gets a healthy proxy
restarted.

One short probe (``GET models``) at a time, its result kept for ``ttl`` seconds: probes from
several balancers cost the upstream one request per ``ttl``, and a flood of ``/readyz`` none more.
A forwarded request says as much as a probe, and says it at once: one that finds the upstream
gone (``after_failure``) makes the proxy unready before the kept probe would, so a balancer stops
sending it traffic it can only fail; the next answer makes it ready again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from proxy.core.errors import UpstreamError, UpstreamStatus, UpstreamTimeout
from proxy.upstream.client import Upstream

PROBE_TIMEOUT_S = 2.0
PROBE_TTL_S = 5.0
# what a gateway or a router answers when nothing behind it can take the request
NO_UPSTREAM_STATUSES: Final = frozenset({502, 503, 504})


@dataclass(frozen=True, slots=True)
class UpstreamState:
    """What the last probe found: reachable (any answer under 500), the status it got, or why none."""

    reachable: bool
    status: int | None
    error: str | None
    checked_at: float

    def as_json(self, url: str, now: float) -> dict[str, Any]:
        return {
            "url": url,
            "reachable": self.reachable,
            "status": self.status,
            "error": self.error,
            "checked_s_ago": round(max(0.0, now - self.checked_at), 3),
        }


def state_of(status: int | None, error: str | None, now: float) -> UpstreamState:
    """A 5xx is an upstream that answers but cannot serve (llama.cpp loading its model: 503)."""
    if status is not None and status >= 500:
        error = f"upstream answered {status}"
    return UpstreamState(status is not None and status < 500, status, error, now)


def after_failure(exc: UpstreamError, now: float) -> UpstreamState | None:
    """What a failed forward says of the upstream, or None where it says nothing of it. A
    connection refused, reset or not opened in time, and a 502/503/504, are an upstream gone; a
    4xx is one that answered (the request was refused, not the upstream). A 500 may be this
    request's own failure, and a whole answer that took too long a slow engine: neither says the
    upstream is gone, so the state stays what it was."""
    if isinstance(exc, UpstreamStatus):
        if exc.status < 500 or exc.status in NO_UPSTREAM_STATUSES:
            return state_of(exc.status, None, now)
        return None
    cause = exc.__cause__
    if isinstance(exc, UpstreamTimeout):
        return state_of(None, exc.message, now) if isinstance(cause, aiohttp.ConnectionTimeoutError) else None
    if isinstance(cause, aiohttp.ClientConnectionError | ConnectionError):
        return state_of(None, exc.message, now)
    return None


class Readiness:
    def __init__(
        self,
        upstream: Upstream,
        *,
        timeout: float = PROBE_TIMEOUT_S,
        ttl: float = PROBE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream, self.timeout, self.ttl, self.clock = upstream, timeout, ttl, clock
        self.last: UpstreamState | None = None
        self._lock = asyncio.Lock()

    async def check(self) -> UpstreamState:
        """The upstream's state, probed at most once per ``ttl``; concurrent callers share a probe."""
        async with self._lock:
            last = self.last
            if last is not None and self.clock() - last.checked_at < self.ttl:
                return last
            started = self.clock()
            try:
                status: int | None = await self.upstream.probe(self.timeout)
                error = None
            except UpstreamError as exc:
                status, error = None, exc.message
            if self.last is not last and self.last is not None and self.last.checked_at >= started:
                return self.last  # a forward said it while the probe was out: that is newer
            self.last = state_of(status, error, self.clock())
            return self.last

    def answered(self, status: int) -> None:
        """A forward got an answer (its status line): the upstream is reachable."""
        self.last = state_of(status, None, self.clock())

    def failed(self, exc: UpstreamError) -> None:
        """A forward failed: where the failure says the upstream is gone, it is unready now."""
        if (state := after_failure(exc, self.clock())) is not None:
            self.last = state
