"""proxy/upstream/readiness.py: the readiness probe. Any answer under 500 is a reachable upstream,
a 5xx or no answer is not (and says why); one probe per ``ttl``, shared by concurrent callers."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from proxy.core.errors import UpstreamError, UpstreamStatus, UpstreamTimeout, UpstreamUnavailable
from proxy.upstream.readiness import Readiness, UpstreamState, after_failure, state_of


@pytest.mark.parametrize(
    ("status", "error", "reachable", "said"),
    [
        pytest.param(200, None, True, None, id="200"),
        pytest.param(401, None, True, None, id="401-the-probe-has-no-key"),
        pytest.param(404, None, True, None, id="404"),
        pytest.param(499, None, True, None, id="499"),
        pytest.param(500, None, False, "upstream answered 500", id="500"),
        pytest.param(503, None, False, "upstream answered 503", id="503-model-loading"),
        pytest.param(None, "upstream unreachable: refused", False, "upstream unreachable: refused", id="no-answer"),
    ],
)
def test_state_of_a_probe(status: int | None, error: str | None, reachable: bool, said: str | None) -> None:
    state = state_of(status, error, now=10.0)
    assert (state.reachable, state.status, state.error, state.checked_at) == (reachable, status, said, 10.0)


def test_the_state_as_json_says_how_long_ago_it_was_checked() -> None:
    state = UpstreamState(True, 200, None, checked_at=10.0)
    assert state.as_json("http://u/v1", now=12.5) == {
        "url": "http://u/v1",
        "reachable": True,
        "status": 200,
        "error": None,
        "checked_s_ago": 2.5,
    }
    assert state.as_json("http://u/v1", now=9.0)["checked_s_ago"] == 0.0  # a clock step back reads as now


class Probed:
    """Stands in for the upstream client: answers each probe from ``answers``, in turn."""

    def __init__(self, *answers: int | UpstreamError, delay: float = 0.0) -> None:
        self.answers, self.delay, self.probes = list(answers), delay, 0

    async def probe(self, timeout: float) -> int:
        self.probes += 1
        await asyncio.sleep(self.delay)
        answer = self.answers.pop(0)
        if isinstance(answer, UpstreamError):
            raise answer
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_probe_is_kept_for_its_ttl_then_taken_again() -> None:
    upstream, clock = Probed(200, UpstreamUnavailable("upstream unreachable: refused")), Clock()
    readiness = Readiness(upstream, ttl=5.0, clock=clock)  # type: ignore[arg-type]
    assert (await readiness.check()).reachable
    clock.now += 4.9
    assert (await readiness.check()).reachable and upstream.probes == 1
    clock.now += 0.1
    state = await readiness.check()
    assert upstream.probes == 2
    assert (state.reachable, state.status, state.error) == (False, None, "upstream unreachable: refused")
    assert readiness.last is state


async def test_concurrent_checks_share_one_probe() -> None:
    upstream = Probed(503, delay=0.05)
    readiness = Readiness(upstream, ttl=5.0, clock=Clock())  # type: ignore[arg-type]
    states = await asyncio.gather(*(readiness.check() for _ in range(10)))
    assert upstream.probes == 1
    assert {s.error for s in states} == {"upstream answered 503"} and not any(s.reachable for s in states)


def caused(exc: UpstreamError, cause: BaseException) -> UpstreamError:
    exc.__cause__ = cause
    return exc


def refused() -> UpstreamError:
    return caused(UpstreamUnavailable("upstream unreachable: refused"), aiohttp.ClientConnectionError("refused"))


@pytest.mark.parametrize(
    ("exc", "reachable"),
    [
        pytest.param(refused(), False, id="refused"),
        pytest.param(caused(UpstreamUnavailable("reset"), ConnectionResetError()), False, id="reset"),
        pytest.param(caused(UpstreamUnavailable("gone"), aiohttp.ServerDisconnectedError()), False, id="disconnected"),
        pytest.param(
            caused(UpstreamTimeout("no connection"), aiohttp.ConnectionTimeoutError()), False, id="connect-timeout"
        ),
        pytest.param(UpstreamStatus(502, b"", None), False, id="502-gateway-without-upstream"),
        pytest.param(UpstreamStatus(503, b"", None), False, id="503"),
        pytest.param(UpstreamStatus(504, b"", None), False, id="504"),
        # the upstream answered: the request was refused, not the upstream gone
        pytest.param(UpstreamStatus(400, b"", None), True, id="400"),
        pytest.param(UpstreamStatus(401, b"", None), True, id="401"),
        pytest.param(UpstreamStatus(429, b"", None), True, id="429"),
        # say nothing of the upstream: this request's own failure, or a slow engine
        pytest.param(UpstreamStatus(500, b"", None), None, id="500-the-requests-own"),
        pytest.param(caused(UpstreamTimeout("slow"), TimeoutError()), None, id="answer-timeout"),
        pytest.param(UpstreamUnavailable("upstream answered with invalid JSON"), None, id="invalid-json"),
    ],
)
def test_what_a_failed_forward_says_of_the_upstream(exc: UpstreamError, reachable: bool | None) -> None:
    state = after_failure(exc, now=7.0)
    assert (None if state is None else state.reachable) is reachable
    if state is not None:
        assert state.checked_at == 7.0 and (state.reachable or state.error)


async def test_a_failed_forward_says_unreachable_at_once_and_an_answer_says_reachable() -> None:
    upstream, clock = Probed(200), Clock()
    readiness = Readiness(upstream, ttl=5.0, clock=clock)  # type: ignore[arg-type]
    assert (await readiness.check()).reachable
    clock.now += 0.5
    readiness.failed(refused())
    state = await readiness.check()
    assert (state.reachable, state.error, state.checked_at) == (False, "upstream unreachable: refused", clock.now)
    readiness.failed(UpstreamStatus(500, b"", None))  # says nothing: the state stays
    assert await readiness.check() is state
    clock.now += 0.5
    readiness.answered(200)
    state = await readiness.check()
    assert (state.reachable, state.status, state.error) == (True, 200, None)
    assert upstream.probes == 1  # a forward's outcome is as fresh as a probe's


async def test_a_probe_under_way_does_not_overwrite_a_newer_forward() -> None:
    upstream, clock = Probed(200, delay=0.05), Clock()
    readiness = Readiness(upstream, ttl=5.0, clock=clock)  # type: ignore[arg-type]
    probing = asyncio.create_task(readiness.check())
    await asyncio.sleep(0.01)
    clock.now += 0.01
    readiness.failed(refused())
    assert not (await probing).reachable
    assert not (await readiness.check()).reachable
