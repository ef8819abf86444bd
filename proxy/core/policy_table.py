"""The policy as a table, for ``smartcache check-policy``: one row per intent, every cell a
string, thresholds exactly as the file has them."""

from __future__ import annotations

from proxy.core.policy import IntentPolicy, Policy
from proxy.core.policy_values import CHECKS


def policy_table(policy: Policy) -> list[dict[str, str]]:
    """One row per intent, every cell a string, for ``smartcache check-policy``.

    Cache settings of an intent that never caches are shown as "-": they have no effect.
    """
    return [_table_row(intent) for intent in policy.intents.values()]


def _table_row(intent: IntentPolicy) -> dict[str, str]:
    cached = {
        "accept": _threshold(intent.accept),
        "candidate": _threshold(intent.candidate),
        "direct_hit": "yes" if intent.direct_hit else "no",
        "verify_accept": "-" if intent.verify_accept is None else _threshold(intent.verify_accept),
        "verify_previous": "-" if intent.verify_previous is None else _threshold(intent.verify_previous),
        "validate": "all" if set(intent.validate) == set(CHECKS) else ",".join(intent.validate) or "-",
        "ttl": _duration(intent.ttl),
        "pools": "→".join(intent.pools),
        "repeats": intent.repeats_widen_to,
    }
    return {
        "intent": intent.name,
        "cache": "yes" if intent.cache else "no",
        **(cached if intent.cache else dict.fromkeys(cached, "-")),
        "keywords": f"{len(intent.keywords)}{' (force)' if intent.force else ''}",
        "exemplars": str(len(intent.exemplars)),
    }


def _threshold(value: float) -> str:
    """As the file has it, at least two decimals: rounding would show 0.999 as 1.00."""
    text = repr(float(value))
    return f"{value:.2f}" if "e" not in text and len(text.partition(".")[2]) < 2 else text


def _duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
