"""proxy/upstream/retry.py: which failed upstream attempts are worth one more, a table of failures
and the reason each is retried for (the metric's label), or None."""

from __future__ import annotations

import aiohttp
import pytest

from proxy.core.errors import UpstreamError, UpstreamStatus, UpstreamTimeout, UpstreamUnavailable
from proxy.upstream.retry import retry_reason


def status(code: int) -> UpstreamStatus:
    return UpstreamStatus(code, b'{"error": {"message": "x"}}', "application/json")


def timed_out(cause: BaseException | None) -> UpstreamTimeout:
    exc = UpstreamTimeout("upstream did not answer in time")
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        # a replica the router could not use: sent again, it lands on a live one
        pytest.param(status(500), "status_500", id="500"),
        pytest.param(status(502), "status_502", id="502"),
        pytest.param(status(503), "status_503", id="503"),
        pytest.param(status(504), "status_504", id="504"),
        pytest.param(UpstreamUnavailable("upstream unreachable: refused"), "unreachable", id="unreachable"),
        pytest.param(timed_out(aiohttp.ConnectionTimeoutError()), "connect_timeout", id="connect-timeout"),
        # the request's own failure: refused again the same way
        pytest.param(status(400), None, id="400"),
        pytest.param(status(401), None, id="401"),
        pytest.param(status(404), None, id="404"),
        pytest.param(status(429), None, id="429"),
        pytest.param(status(501), None, id="501-not-a-replica"),
        # a slow engine is only slowed further by a second copy of the request
        pytest.param(timed_out(TimeoutError()), None, id="answer-timeout"),
        pytest.param(timed_out(aiohttp.ServerTimeoutError()), None, id="read-timeout"),
        pytest.param(timed_out(None), None, id="timeout-no-cause"),
        pytest.param(UpstreamError("upstream answered with something else"), None, id="other"),
    ],
)
def test_which_failures_are_tried_once_more(failure: UpstreamError, reason: str | None) -> None:
    assert retry_reason(failure) == reason
