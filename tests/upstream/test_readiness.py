"""proxy/upstream/readiness.py: the readiness probe. Any answer under 500 is a reachable upstream,
a 5xx or no answer is not (and says why); one probe per ``ttl``, shared by concurrent callers."""

from __future__ import annotations

import asyncio

import pytest

from proxy.core.errors import UpstreamError, UpstreamUnavailable
from proxy.upstream.readiness import Readiness, UpstreamState, state_of


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
