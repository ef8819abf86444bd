"""Calibration of verify_accept from shadow rows, held-out serving by the verifier, and the
version a calibrated policy gets (a new one, so records of another calibration are not served)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from proxy.core.policy import load_policy
from proxy.settings import DEFAULT_POLICY
from proxy.tools.calibrate import (
    calibrate,
    calibrate_verifier,
    calibrated_version,
    describe_verified,
    held_out,
    write_policy,
)
from proxy.tools.replay import Row, shadow_policy


def row(intent: str, p: float | None, ok: bool, *, score: float = 0.9, conversation: str = "c",
        nets: bool = True) -> Row:  # fmt: skip
    return Row(conversation, "cat", 0, intent, "shadow_hit", "verified", score, ok, nets, False, ok, ok, 0, p)


def travel_rows() -> list[Row]:
    """40 verified travel candidates: the false ones score up to 0.7, the right ones 0.8 and up."""
    right = [row("travel", 0.8 + i / 200, True) for i in range(36)]
    return right + [row("travel", p, False) for p in (0.3, 0.5, 0.6, 0.7)]


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


def test_held_out_serves_verified_intents_by_probability() -> None:
    # low cosines that the accept threshold would never serve: only the verifier can
    rows = [dataclasses.replace(r, score=0.5, conversation=f"c{i}") for i, r in enumerate(travel_rows() * 2)]
    result = held_out(rows, folds=2, min_samples=5, target=0.1)
    assert result.hits > 0 and result.false_hits == 0
    without = held_out([dataclasses.replace(r, verified=None) for r in rows], folds=2, min_samples=5, target=0.1)
    assert without.hits == 0


def test_calibrate_writes_a_new_policy_version(tmp_path: Path) -> None:
    template = load_policy(DEFAULT_POLICY).version
    out = tmp_path / "calibrated.yaml"
    rows = [row("travel", None, True, score=0.97)] * 200
    version = write_policy(DEFAULT_POLICY, out, calibrate(rows, target=0.02), traces=["t.jsonl"], target=0.02)
    written = load_policy(out)
    assert written.version == version != template
    assert version.startswith(template)
    # the same calibration again: the same version; recalibrating its output replaces the digest
    again = write_policy(DEFAULT_POLICY, tmp_path / "again.yaml", calibrate(rows, target=0.02), traces=["t"],
                         target=0.02)  # fmt: skip
    assert again == version
    # false candidates among the 0.97s raise travel's accept to the 0.99s
    other = [*rows, *[row("travel", None, False, score=0.97)] * 5, *[row("travel", None, True, score=0.99)] * 200]
    recalibrated = write_policy(out, tmp_path / "re.yaml", calibrate(other, target=0.02), traces=["t"], target=0.02)
    assert recalibrated != version and recalibrated.count("+cal.") == 1 and recalibrated.startswith(template)


def test_calibrated_verify_accept_is_written_and_loads(tmp_path: Path) -> None:
    out = tmp_path / "verified.yaml"
    rows = travel_rows()
    write_policy(DEFAULT_POLICY, out, calibrate(rows, min_samples=5), traces=["t.jsonl"], target=0.1,
                 verified=calibrate_verifier(rows, target=0.1))  # fmt: skip
    policy = load_policy(out)
    assert policy.intents["travel"].verify_accept == pytest.approx(0.8)
    assert policy.intents["chitchat"].verify_accept is None
    # the verifier reads from the template's candidate floor, not one fitted for the accept zone
    assert policy.intents["travel"].candidate == load_policy(DEFAULT_POLICY).intents["travel"].candidate
    text = out.read_text(encoding="utf-8")
    assert "# travel: 40 verified; at verify_accept 0.8" in text
    # a level the data could not show is not written
    strict = tmp_path / "strict.yaml"
    write_policy(DEFAULT_POLICY, strict, {}, traces=["t"], target=1e-3, verified=calibrate_verifier(rows))
    assert load_policy(strict).intents["travel"].verify_accept is None
    assert yaml.safe_load(text)["version"] == policy.version


def test_calibrated_version_is_a_digest_of_the_content() -> None:
    a = calibrated_version("2026-11", {"intents": {"travel": {"accept": 0.9}}})
    assert a == calibrated_version("2026-11", {"intents": {"travel": {"accept": 0.9}}})
    assert a != calibrated_version("2026-11", {"intents": {"travel": {"accept": 0.91}}})
    assert calibrated_version(a, {"x": 1}).startswith("2026-11+cal.") and calibrated_version(a, {"x": 1}) != a


@pytest.mark.parametrize("setting", ["verify_accept", "verify_previous"])
def test_shadow_replay_judges_at_every_probability_the_verdicts_an_intent_asks_for(setting: str) -> None:
    """verify_accept: every candidate of the intents that verify; verify_previous: the session's
    previous turn."""
    policy = load_policy(DEFAULT_POLICY)
    travel = dataclasses.replace(policy.intents["travel"], **{setting: 0.9})
    shadow = shadow_policy(dataclasses.replace(policy, intents={**policy.intents, "travel": travel}))
    assert getattr(shadow.intents["travel"], setting) == 0.0
    assert getattr(shadow.intents["chitchat"], setting) is None


def asked_again(rows: list[Row]) -> list[Row]:
    """The same rows as shadow replay writes them for the session's previous turn (verify_previous)."""
    return [dataclasses.replace(r, reason="verified_previous", score=0.5) for r in rows]


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


def test_held_out_serves_the_previous_turn_at_its_own_level_only() -> None:
    rows = [dataclasses.replace(r, conversation=f"c{i}") for i, r in enumerate(asked_again(travel_rows()) * 2)]
    result = held_out(rows, folds=2, min_samples=5, target=0.1)
    assert result.hits > 0 and result.false_hits == 0
    # a policy without verify_previous never serves them by score, however high
    unverified = [dataclasses.replace(r, score=0.999, verified=None) for r in rows]
    assert held_out(unverified, folds=2, min_samples=5, target=0.1).hits == 0


def test_a_verifier_level_the_template_sets_but_calibration_did_not_fit_is_dropped(tmp_path: Path) -> None:
    template = tmp_path / "template.yaml"
    data = yaml.safe_load(DEFAULT_POLICY.read_text(encoding="utf-8"))
    data["defaults"]["verify_previous"] = 0.5
    data["intents"]["general"]["verify_accept"] = 0.5
    template.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    assert load_policy(template).intents["chitchat"].verify_previous == 0.5
    out = tmp_path / "out.yaml"
    previous = calibrate_verifier(asked_again(travel_rows()), setting="verify_previous", target=0.1)
    write_policy(template, out, {}, traces=["t"], target=0.1, previous=previous)
    policy = load_policy(out)
    assert policy.intents["travel"].verify_previous == pytest.approx(0.8)
    assert all(i.verify_previous is None for n, i in policy.intents.items() if n != "travel")
    assert all(i.verify_accept is None for i in policy.intents.values())


def test_a_verifier_target_of_its_own_is_written_in_the_header(tmp_path: Path) -> None:
    """``--verify-target``: the verifier's levels meet a target apart from the accept zone's."""
    rows = travel_rows()
    out = tmp_path / "verified.yaml"
    write_policy(DEFAULT_POLICY, out, calibrate(rows, min_samples=5), traces=["t.jsonl"], target=1e-3,
                 verified=calibrate_verifier(rows, target=0.1), verify_target=0.1)  # fmt: skip
    assert "calibrate --target-false-hit 0.001 --verify-target 0.1`" in out.read_text(encoding="utf-8")
    assert load_policy(out).intents["travel"].verify_accept == pytest.approx(0.8)
    same = tmp_path / "same.yaml"
    write_policy(DEFAULT_POLICY, same, {}, traces=["t"], target=1e-3, verify_target=1e-3)
    assert "--verify-target" not in same.read_text(encoding="utf-8")
