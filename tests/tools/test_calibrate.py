"""Calibration of the verifier's levels from shadow rows: verify_accept on the best candidates'
verdicts, verify_previous on the previous turn's, each under an upper confidence bound."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from proxy.core.policy import load_policy
from proxy.settings import DEFAULT_POLICY
from proxy.tools.calibrate import calibrate, calibrate_verifier, describe_verified, verifier_curve
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


def test_the_curve_shows_what_each_level_serves_and_where_its_false_verdicts_come_from() -> None:
    rows = [row("travel", 0.96 + i / 1000, True, category="kvret") for i in range(30)]
    rows += [row("general", 0.985, False, category="pawsx"), row("general", 0.97, False, category="pawsx"),
             row("general", 0.92, False, category="mtbench"), row("general", 0.99, True, nets=False)]  # fmt: skip
    curve = {v.level: v for v in verifier_curve(rows, levels=(0.9, 0.97, 0.98, 0.99))}
    assert (curve[0.9].served, curve[0.9].false_hits) == (33, 3)
    assert curve[0.9].false_by_category == (("pawsx", 2), ("mtbench", 1))
    assert (curve[0.97].served, curve[0.97].false_hits) == (22, 2)  # 0.97, 0.971, ..., 0.989 and two false
    assert (curve[0.98].served, curve[0.98].false_by_category) == (11, (("pawsx", 1),))
    assert (curve[0.99].served, curve[0.99].false_hits, curve[0.99].fhr_upper) == (0, 0, 1.0)  # the nets dropped 0.99
    assert curve[0.97].fhr_upper > 2 / 22  # an upper bound, above the observed rate


def test_the_calibrate_command_prints_the_curve_as_a_table_a_level_a_row() -> None:
    from rich.console import Console

    from proxy.tools.report import print_verifier_curve

    rows = [row("travel", 0.99, True, category="kvret"), row("travel", 0.985, False, category="pawsx")]
    console = Console(record=True, width=120)
    print_verifier_curve(verifier_curve(rows, levels=(0.98, 0.99)), console)
    text = console.export_text()
    assert "verify_accept: what each level would serve" in text
    cells = [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]
    assert cells == [["0.98", "2", "1", "0.8791", "pawsx 1"], ["0.99", "1", "0", "0.9500", "-"]]
    print_verifier_curve([], console)  # nothing verified: nothing printed
    assert console.export_text() == ""


def test_the_curve_reads_only_the_verdicts_of_its_setting() -> None:
    accepted = [row("travel", 0.99, True)] * 3
    assert [v.served for v in verifier_curve(accepted, levels=(0.5,))] == [3]
    assert verifier_curve(accepted, setting="verify_previous") == []
    previous = verifier_curve(asked_again(accepted), setting="verify_previous", levels=(0.5, 0.995))
    assert [(v.setting, v.served) for v in previous] == [("verify_previous", 3), ("verify_previous", 0)]


@pytest.mark.parametrize("setting", ["verify_accept", "verify_previous"])
def test_shadow_replay_judges_at_every_probability_the_verdicts_an_intent_asks_for(setting: str) -> None:
    """verify_accept: every candidate of the intents that verify; verify_previous: the session's
    previous turn."""
    policy = load_policy(DEFAULT_POLICY)
    travel = dataclasses.replace(policy.intents["travel"], **{setting: 0.9})
    shadow = shadow_policy(dataclasses.replace(policy, intents={**policy.intents, "travel": travel}))
    assert getattr(shadow.intents["travel"], setting) == 0.0
    assert getattr(shadow.intents["chitchat"], setting) is None


def test_verify_all_has_every_cacheable_intent_read_by_the_verifier_in_shadow() -> None:
    policy = load_policy(DEFAULT_POLICY)
    shadow = shadow_policy(policy, verify_all=True)
    cacheable = [n for n, p in policy.intents.items() if p.cache]
    assert cacheable and all(shadow.intents[n].verify_accept == 0.0 == shadow.intents[n].verify_previous
                             for n in cacheable)  # fmt: skip
    assert shadow.intents["medical"].verify_accept is None  # never cached: nothing to read
    assert shadow_policy(policy).intents["chitchat"].verify_accept is None  # as the template has it


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
