"""Is the upstream reachable? The readiness half of the health checks (``/readyz``): a load
balancer or Kubernetes sends traffic only to a proxy whose upstream answers. ``/healthz`` stays
the liveness check (the process serves), so an upstream outage never gets a healthy proxy
restarted.

One short probe (``GET models``) at a time, its result kept for ``ttl`` seconds: probes from
several balancers cost the upstream one request per ``ttl``, and a flood of ``/readyz`` none more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.core.errors import UpstreamError
from proxy.upstream.client import Upstream

PROBE_TIMEOUT_S = 2.0
PROBE_TTL_S = 5.0


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
            try:
                status: int | None = await self.upstream.probe(self.timeout)
                error = None
            except UpstreamError as exc:
                status, error = None, exc.message
            self.last = state_of(status, error, self.clock())
            return self.last
