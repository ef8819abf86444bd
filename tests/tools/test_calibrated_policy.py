"""The calibrated policy file: a version of its own, the verifier levels calibration fitted (and
only those), and a header naming the targets they meet."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from proxy.core.policy import load_policy
from proxy.settings import DEFAULT_POLICY
from proxy.tools.calibrate import calibrate, calibrate_verifier
from proxy.tools.calibrated_policy import calibrated_version, write_policy
from tests.tools.verdict_rows import asked_again, row, travel_rows


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
