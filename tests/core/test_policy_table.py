"""Tables printed into a pipe (``smartcache check-policy FILE | less``) keep their natural width,
and thresholds read exactly as the policy file has them."""

from __future__ import annotations

import pytest

from proxy import cli
from proxy.core.policy import load_policy
from proxy.core.policy_table import policy_table
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
