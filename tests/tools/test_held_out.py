"""The held-out check serves what the verifier's fitted levels would: candidates by probability,
and the session's previous turn at its own level only."""

from __future__ import annotations

import dataclasses

from proxy.tools.held_out import held_out
from tests.tools.verdict_rows import asked_again, travel_rows


def test_held_out_serves_verified_intents_by_probability() -> None:
    # low cosines that the accept threshold would never serve: only the verifier can
    rows = [dataclasses.replace(r, score=0.5, conversation=f"c{i}") for i, r in enumerate(travel_rows() * 2)]
    result = held_out(rows, folds=2, min_samples=5, target=0.1)
    assert result.hits > 0 and result.false_hits == 0
    without = held_out([dataclasses.replace(r, verified=None) for r in rows], folds=2, min_samples=5, target=0.1)
    assert without.hits == 0


def test_held_out_serves_the_previous_turn_at_its_own_level_only() -> None:
    rows = [dataclasses.replace(r, conversation=f"c{i}") for i, r in enumerate(asked_again(travel_rows()) * 2)]
    result = held_out(rows, folds=2, min_samples=5, target=0.1)
    assert result.hits > 0 and result.false_hits == 0
    # a policy without verify_previous never serves them by score, however high
    unverified = [dataclasses.replace(r, score=0.999, verified=None) for r in rows]
    assert held_out(unverified, folds=2, min_samples=5, target=0.1).hits == 0
