"""Tables printed into a pipe (``smartcache check-policy FILE | less``) keep their natural width,
and thresholds read exactly as the policy file has them."""

from __future__ import annotations

import dataclasses

import pytest

from proxy import cli
from proxy.core.policy import IntentPolicy, load_policy
from proxy.core.policy_table import COLUMNS, NOT_SHOWN, policy_table
from proxy.settings import DEFAULT_POLICY


def test_check_policy_into_a_pipe_truncates_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-policy", str(DEFAULT_POLICY)]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    header = next(line for line in out.splitlines() if "intent" in line)
    for column in policy_table(load_policy(DEFAULT_POLICY))[0]:
        assert f" {column} " in header, column
    assert max(len(line) for line in out.splitlines()) > 80


def test_thresholds_are_shown_exactly() -> None:
    policy = load_policy(DEFAULT_POLICY)
    rows = {row["intent"]: row for row in policy_table(policy)}
    for name, intent in policy.intents.items():
        if not intent.cache:
            continue
        assert float(rows[name]["accept"]) == intent.accept, name
        assert float(rows[name]["candidate"]) == intent.candidate, name
        if intent.accept < 1:
            assert rows[name]["accept"] != "1.00", name
    assert any(row["accept"] == "0.9961" for row in rows.values())  # the shipped code/contracts intents


def test_every_knob_that_decides_a_hit_is_a_column() -> None:
    """Each field of IntentPolicy is shown as a column or said not to decide a hit, so a new knob
    cannot be left out of ``check-policy`` unnoticed."""
    fields = {f.name for f in dataclasses.fields(IntentPolicy)}
    unaccounted = fields - set(COLUMNS) - set(NOT_SHOWN)
    assert not unaccounted, f"show {sorted(unaccounted)} in policy_table.COLUMNS, or say in NOT_SHOWN why not"
    assert set(COLUMNS) | set(NOT_SHOWN) <= fields and not set(COLUMNS) & set(NOT_SHOWN)
    shown = set(policy_table(load_policy(DEFAULT_POLICY))[0])
    assert set(COLUMNS.values()) <= shown
    for knob in ("restatement", "verify_top", "feedback_floor", "global_safe", "scope", "widen_to"):
        assert knob in COLUMNS, knob


def test_restatement_is_shown_per_intent() -> None:
    policy = load_policy(DEFAULT_POLICY)
    rows = {row["intent"]: row for row in policy_table(policy)}
    for name, intent in policy.intents.items():
        expected = ("yes" if intent.restatement else "no") if intent.cache else "-"
        assert rows[name]["restatement"] == expected, name
    assert any(row["restatement"] == "yes" for row in rows.values())
