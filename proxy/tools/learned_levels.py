"""The learned levels a trace would earn: the offline side of the mechanism the proxy runs online
(proxy.core.learning). A shadow replay's rows are labels as the proxy would have kept them, each
candidate that passed the nets and that the pair verifier scored, right where its answer key is the
request's, and ``fit_level`` fits them exactly as ``LearnedLevels`` fits a tenant's labels from its
store: one user a conversation, its ``labels_per_user`` cap, the same bound and the same levels.
``smartcache calibrate`` prints them beside the thresholds it fits, so a level a tenant's traffic
would earn can be read off its traces before it is earned online."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from proxy.core.learning import Label, Level, Source, fit_level, labels_needed
from proxy.core.policy import Policy
from proxy.tools.replay import Row

__all__ = ["TraceLevel", "labels_from_rows", "print_trace_levels", "trace_levels"]


@dataclass(frozen=True, slots=True)
class TraceLevel:
    intent: str
    labels: int
    wrong: int
    max_error: float
    level: Level | None


def labels_from_rows(rows: Iterable[Row]) -> dict[str, list[Label]]:
    """Per intent, a label for each row whose candidate passed the nets and was scored by the
    verifier, in replay order."""
    out: dict[str, list[Label]] = defaultdict(list)
    for i, r in enumerate(rows):
        if r.verified is None or r.candidate_key_ok is None or not r.nets_ok:
            continue
        right = r.candidate_key_ok and not r.expect_no_hit
        out[r.intent].append(Label(r.intent, r.verified, right, Source.TRACE, r.conversation, "", float(i)))
    return dict(out)


def trace_levels(rows: Sequence[Row], policy: Policy, *, max_error: float | None = None) -> list[TraceLevel]:
    """The level each intent's labels earn at its policy's ``max_error`` (or ``max_error`` where
    given; an intent with neither is fitted at 0.005)."""
    out = []
    for intent, labels in sorted(labels_from_rows(rows).items()):
        intent_policy = policy.for_intent(intent)
        target = max_error or intent_policy.max_error or 0.005
        level = fit_level(labels, max_error=target, per_user=intent_policy.labels_per_user)
        out.append(TraceLevel(intent, len(labels), sum(not lb.right for lb in labels), target, level))
    return out


def print_trace_levels(levels: Sequence[TraceLevel], console: Console | None = None) -> None:
    table = Table(title="learned levels these traces would earn (one tenant, labels from their answer keys)")
    for col in ("intent", "labels", "wrong", "max_error", "needs", "level", "labels above", "bound"):
        table.add_column(col, justify="right")
    for t in levels:
        lv = t.level
        table.add_row(
            t.intent,
            str(t.labels),
            str(t.wrong),
            f"{t.max_error:g}",
            str(labels_needed(t.max_error)),
            "none" if lv is None else f"{lv.score:.3f}",
            "-" if lv is None else str(lv.n),
            "-" if lv is None else f"{lv.bound:.4f}",
        )
    (console or Console()).print(table)
