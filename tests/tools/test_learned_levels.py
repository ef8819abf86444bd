"""The learned levels a trace would earn (proxy.tools.learned_levels): shadow rows become labels
and are fitted exactly as the proxy fits a tenant's stored labels."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from proxy.core.learning import Source, fit_level
from proxy.core.policy import load_policy
from proxy.settings import DEFAULT_POLICY
from proxy.tools.learned_levels import labels_from_rows, print_trace_levels, trace_levels
from tests.tools.verdict_rows import row


def test_rows_that_passed_the_nets_and_were_scored_become_labels() -> None:
    rows = [
        row("general", 0.9, True, conversation="a"),
        row("general", 0.4, False, conversation="b"),
        row("general", None, True),  # never scored by the verifier: no label
        row("general", 0.9, True, nets=False),  # stopped by a net: never the judge's question
        dataclasses.replace(row("travel", 0.95, True), expect_no_hit=True),  # must never be served
    ]
    labels = labels_from_rows(rows)
    assert [(lb.score, lb.right, lb.user) for lb in labels["general"]] == [(0.9, True, "a"), (0.4, False, "b")]
    assert [lb.right for lb in labels["travel"]] == [False]
    assert all(lb.source is Source.TRACE for lbs in labels.values() for lb in lbs)


def test_the_table_is_the_online_fit() -> None:
    policy = load_policy(DEFAULT_POLICY)
    rows = [row("general", 0.6 + (i % 40) / 100, True, conversation=f"c{i}") for i in range(700)]
    rows += [row("general", 0.55, False, conversation=f"w{i}") for i in range(30)]
    (level,) = trace_levels(rows, policy)
    online = fit_level(labels_from_rows(rows)["general"], max_error=0.005, per_user=50)
    assert level.level == online and online is not None and online.score == 0.6
    assert (level.labels, level.wrong, level.max_error) == (730, 30, 0.005)
    console = Console(record=True, width=160)
    print_trace_levels([level], console)
    assert "0.600" in console.export_text()
    # too few labels for the target: no level, and the table says so
    (thin,) = trace_levels(rows[:100], policy)
    assert thin.level is None
