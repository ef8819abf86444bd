"""proxy/http/outcome.py: every response says in ``x-cache-reason`` why it got its status, hits
included, and the README lists every reason a client can be told, so the two cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.core.model import Decision, Reason, Status
from proxy.http.outcome import PUBLIC_REASONS, Outcome, cache_headers

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        pytest.param(Status.HIT, Reason.RESTATEMENT, id="restatement-hit"),
        pytest.param(Status.HIT, Reason.EXACT_REPEAT, id="exact-repeat-hit"),
        pytest.param(Status.HIT, Reason.ACCEPT, id="accept-hit"),
        pytest.param(Status.HIT, Reason.COALESCED, id="coalesced-hit"),
        pytest.param(Status.HALF_HIT, Reason.NO_DIRECT_HIT, id="half-hit"),
        pytest.param(Status.MISS, Reason.NO_CANDIDATE, id="miss-nothing-near"),
        pytest.param(Status.MISS, Reason.FILTERED_ENTITIES, id="miss-other-entities"),
        pytest.param(Status.BYPASS, Reason.TOO_LONG, id="bypass-too-long"),
        pytest.param(Status.BYPASS, Reason.ACKNOWLEDGEMENT, id="bypass-acknowledgement"),
    ],
)
def test_every_status_says_its_reason(status: Status, reason: Reason) -> None:
    out = Outcome(status=status, reason=reason, score=0.97 if status is Status.HIT else None)
    headers = cache_headers(out, debug=False)
    assert headers["x-cache-reason"] == reason.value
    assert not [name for name in headers if name.startswith("x-smartcache-")]  # the inside stays behind debug


def test_a_hit_without_a_reason_says_none() -> None:
    assert "x-cache-reason" not in cache_headers(Outcome(status=Status.HIT, score=1.0), debug=False)


def test_the_reason_is_the_decisions_not_its_detail() -> None:
    decision = Decision(Status.MISS, Reason.FILTERED_ENTITIES, detail="budget,places")
    out = Outcome(status=Status.MISS, reason=decision.reason, decision=decision)
    assert cache_headers(out, debug=False)["x-cache-reason"] == "filtered:entities"


def readme_reasons() -> set[str]:
    """The first cells of the README's table of ``x-cache-reason`` values."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Why: `x-cache-reason`", 1)[1].split("\n#", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", section, re.MULTILINE)}


def test_the_readme_lists_every_public_reason_and_nothing_else() -> None:
    listed = readme_reasons()
    public = {reason.value for reason in PUBLIC_REASONS}
    assert public - listed == set(), "reasons a client can see that the README does not list"
    assert listed - {reason.value for reason in Reason} == set(), "README reasons that no longer exist"


def test_every_reason_is_public() -> None:
    assert set(PUBLIC_REASONS) == set(Reason)
