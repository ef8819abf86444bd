"""Which failed upstream attempts are tried once more (pure, no IO).

Behind a router (vllm-router, sglang-router) a replica that has just died fails the requests the
router still sends it: a refused connection, a 502/503/504, or a 500 the router makes of a
worker it could not reach. The router marks the worker down on that failure, so the same request
sent again with the same routing key lands on a live replica. Only an attempt that failed before
its first byte reached the client is tried again (proxy.http.chat): a stream already relayed in
part cannot be taken back. A timeout of the whole answer is not retried: a slow engine is only
slowed further by a second copy of the request; a connection that timed out before it opened is.
"""

from __future__ import annotations

import aiohttp

from proxy.core.errors import UpstreamError, UpstreamStatus, UpstreamTimeout, UpstreamUnavailable

# statuses a gateway or a router answers for a replica it could not use; 429 and 4xx are the
# request's own (a retry would be refused again), and other 5xx are rare enough to pass through
RETRIED_STATUSES = frozenset({500, 502, 503, 504})


def retry_reason(exc: UpstreamError) -> str | None:
    """Why a failed attempt is worth one more (the metric's and the log line's label), or None."""
    if isinstance(exc, UpstreamStatus):
        return f"status_{exc.status}" if exc.status in RETRIED_STATUSES else None
    if isinstance(exc, UpstreamTimeout):
        return "connect_timeout" if isinstance(exc.__cause__, aiohttp.ConnectionTimeoutError) else None
    if isinstance(exc, UpstreamUnavailable):
        return "unreachable"
    return None
