"""The policy as a table, for ``smartcache check-policy``: one row per intent, every cell a
string, thresholds exactly as the file has them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from proxy.core.policy import IntentPolicy, Policy
from proxy.core.policy_values import CHECKS

# Each knob of an intent that decides whether a request is served, with the column that shows it
# (tests/core/test_policy_table.py checks that every field of IntentPolicy is here or below)
COLUMNS: Final[Mapping[str, str]] = {
    "name": "intent",
    "cache": "cache",
    "accept": "accept",
    "candidate": "candidate",
    "direct_hit": "direct_hit",
    "restatement": "restatement",
    "verify_accept": "verify_accept",
    "verify_top": "verify_top",
    "verify_previous": "verify_previous",
    "validate": "validate",
    "feedback_floor": "feedback_floor",
    "ttl": "ttl",
    "scope": "pools",
    "widen_to": "pools",
    "widen_by": "pools",
    "global_safe": "global_safe",
    "repeats_widen_to": "repeats",
    "judge": "judge",
    "judge_top": "judge",
    "judge_floor": "judge",
    "judge_verify": "judge",
    "judge_near": "judge",
    "judge_near_again": "judge",
    "judge_near_opening": "judge",
    "judge_deadline_ms": "judge",
    "max_error": "judge",
    "audit_rate": "judge",
    "labels_per_user": "judge",
    "keywords": "keywords",
    "force": "keywords",
    "exemplars": "exemplars",
    "neighbours": "neighbours",
}
# Knobs that decide no hit, and why they are not shown
NOT_SHOWN: Final[Mapping[str, str]] = {
    "prewarm": "what follows a hit (the engine's KV warmed), not whether there is one",
}


def policy_table(policy: Policy) -> list[dict[str, str]]:
    """One row per intent, every cell a string, for ``smartcache check-policy``.

    Cache settings of an intent that never caches are shown as "-": they have no effect; so are
    the verifier's knobs of an intent it does not read.
    """
    return [_table_row(intent) for intent in policy.intents.values()]


def _table_row(intent: IntentPolicy) -> dict[str, str]:
    verified = intent.verify_accept is not None or (intent.judges and intent.judge_verify is not None)
    cached = {
        "accept": _threshold(intent.accept),
        "candidate": _threshold(intent.candidate),
        "direct_hit": _yes(intent.direct_hit),
        "restatement": _yes(intent.restatement),
        "verify_accept": _threshold(intent.verify_accept) if intent.verify_accept is not None else "-",
        "verify_top": str(intent.verify_top) if verified else "-",
        "verify_previous": "-" if intent.verify_previous is None else _threshold(intent.verify_previous),
        "validate": "all" if set(intent.validate) == set(CHECKS) else ",".join(intent.validate) or "-",
        "feedback_floor": _threshold(intent.feedback_floor),
        "ttl": _duration(intent.ttl),
        "pools": "→".join(intent.pools) + (" (judged)" if intent.widen_by == "judge" and len(intent.pools) > 1 else ""),
        "global_safe": _yes(intent.global_safe),
        "repeats": intent.repeats_widen_to,
        "judge": _judge(intent),
        "neighbours": ",".join(sorted(intent.neighbours)) or "-",
    }
    return {
        "intent": intent.name,
        "cache": _yes(intent.cache),
        **(cached if intent.cache else dict.fromkeys(cached, "-")),
        "keywords": f"{len(intent.keywords)}{' (force)' if intent.force else ''}",
        "exemplars": str(len(intent.exemplars)),
    }


def _judge(intent: IntentPolicy) -> str:
    """``race ≥0.7 top 2 v≥0.9 or q≥0.85 800ms learn≤0.005 audit 0.05 50/user``: the mode, the
    score floor, how many it reads, the verifier's level before it (or the question similarity that
    admits without it), a race's deadline, and the learned levels' error target, audit share and
    labels per user."""
    if not intent.judges:
        return "off"
    parts = [intent.judge, f"≥{_threshold(intent.judge_score_floor)}", f"top {intent.judge_top}"]
    if intent.judge_verify is not None:
        parts.append(f"v≥{_threshold(intent.judge_verify)}")
        if intent.judge_near is not None:
            parts.append(f"or q≥{_threshold(intent.judge_near)}")
        if intent.judge_near_again is not None:
            parts.append(f"asked again q≥{_threshold(intent.judge_near_again)}")
        if intent.judge_near_opening is not None:
            parts.append(f"opening q≥{_threshold(intent.judge_near_opening)}")
    if intent.judge == "race":
        parts.append(f"{intent.judge_deadline_ms}ms")
    if intent.max_error is not None:
        parts.append(f"learn≤{intent.max_error:g} audit {intent.audit_rate:g} {intent.labels_per_user}/user")
    return " ".join(parts)


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _threshold(value: float) -> str:
    """As the file has it, at least two decimals: rounding would show 0.999 as 1.00."""
    text = repr(float(value))
    return f"{value:.2f}" if "e" not in text and len(text.partition(".")[2]) < 2 else text


def _duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
