"""Calibration of the verifier's levels from shadow rows: verify_accept on the best candidates'
verdicts, verify_previous on the previous turn's, each under an upper confidence bound."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from proxy.core.policy import load_policy
from proxy.settings import DEFAULT_POLICY
from proxy.tools.calibrate import calibrate, calibrate_verifier, describe_verified
from proxy.tools.calibrated_policy import write_policy
from proxy.tools.replay import shadow_policy
from tests.tools.verdict_rows import asked_again, row, travel_rows


def test_no_level_is_written_where_the_data_cannot_show_the_target() -> None:
    [(intent, fitted)] = calibrate_verifier(travel_rows(), target=1e-3).items()
    assert intent == "travel" and not fitted.fitted and fitted.hits == 0
    assert "not written" in fitted.note and "2995" in fitted.note


def test_the_lowest_level_whose_upper_bound_meets_the_target_is_chosen() -> None:
    [(intent, fitted)] = calibrate_verifier(travel_rows(), target=0.1).items()
    assert intent == "travel" and fitted.fitted and fitted.level == pytest.approx(0.8)
    assert (fitted.samples, fitted.hits, fitted.false_hits) == (40, 36, 0)
    assert fitted.fhr_upper == pytest.approx(1 - 0.05 ** (1 / 36), abs=1e-4)
    assert fitted.fhr_upper <= 0.1


def test_with_enough_data_the_lowest_level_meeting_the_target_is_chosen() -> None:
    rows = [row("travel", 0.6 + i / 20000, True) for i in range(3000)] + [row("travel", 0.4, False)]
    fitted = calibrate_verifier(rows, target=1e-3)["travel"]
    assert fitted.note.startswith("meets target") and 0.6 <= fitted.level < 0.62
    assert fitted.fhr_upper <= 1e-3


def test_an_intent_with_few_samples_takes_no_lower_than_the_pooled_level() -> None:
    rows = travel_rows() + [row("chitchat", 0.55, True)] * 5
    fitted = calibrate_verifier(rows, target=0.1)
    assert fitted["chitchat"].level == pytest.approx(0.8)  # its own data alone would give 0.55
    assert "5 verdicts: the level fitted on all 45 together" in fitted["chitchat"].note
    assert fitted["chitchat"].hits == 0


def test_only_verified_rows_that_passed_the_nets_count() -> None:
    rows = [row("travel", None, True), row("travel", 0.99, False, nets=False)]
    assert calibrate_verifier(rows) == {}
    assert describe_verified({}) == []


@pytest.mark.parametrize("setting", ["verify_accept", "verify_previous"])
def test_shadow_replay_judges_at_every_probability_the_verdicts_an_intent_asks_for(setting: str) -> None:
    """verify_accept: every candidate of the intents that verify; verify_previous: the session's
    previous turn."""
    policy = load_policy(DEFAULT_POLICY)
    travel = dataclasses.replace(policy.intents["travel"], **{setting: 0.9})
    shadow = shadow_policy(dataclasses.replace(policy, intents={**policy.intents, "travel": travel}))
    assert getattr(shadow.intents["travel"], setting) == 0.0
    assert getattr(shadow.intents["chitchat"], setting) is None


def test_verify_previous_is_fitted_on_the_previous_turn_verdicts_alone(tmp_path: Path) -> None:
    rows = asked_again(travel_rows()) + [row("travel", 0.99, False)] * 3  # a wrong best candidate at 0.99
    previous = calibrate_verifier(rows, setting="verify_previous", target=0.1)
    assert previous["travel"].level == pytest.approx(0.8) and previous["travel"].samples == 40
    assert not calibrate_verifier(rows, target=0.1)["travel"].fitted  # three wrong best candidates at 0.99
    # neither the accept threshold nor verify_accept reads them: they were not judged by score
    assert calibrate(asked_again(travel_rows()), min_samples=5)["travel"].samples == 0
    assert describe_verified(previous)[0].startswith("verify_previous travel: 0.8 (40 verified")
    out = tmp_path / "previous.yaml"
    write_policy(DEFAULT_POLICY, out, {}, traces=["t"], target=0.1, previous=previous)
    policy = load_policy(out)
    assert policy.intents["travel"].verify_previous == pytest.approx(0.8)
    assert policy.intents["travel"].verify_accept is None
    assert "# travel: 40 verified; at verify_previous 0.8" in out.read_text(encoding="utf-8")
