"""Shadow-replay rows as the verifier judges them, for the tests of calibration, the held-out
check and the calibrated policy file: one place that knows every field of a ``Row``."""

from __future__ import annotations

import dataclasses

from proxy.tools.replay import Row


def row(intent: str, p: float | None, ok: bool, *, score: float = 0.9, conversation: str = "c",
        nets: bool = True, category: str = "cat") -> Row:  # fmt: skip
    return Row(conversation, category, 0, intent, "shadow_hit", "verified", score, ok, nets, False, ok, ok, 0, p)


def travel_rows() -> list[Row]:
    """40 verified travel candidates: the false ones score up to 0.7, the right ones 0.8 and up."""
    right = [row("travel", 0.8 + i / 200, True) for i in range(36)]
    return right + [row("travel", p, False) for p in (0.3, 0.5, 0.6, 0.7)]


def asked_again(rows: list[Row]) -> list[Row]:
    """The same rows as shadow replay writes them for the session's previous turn (verify_previous)."""
    return [dataclasses.replace(r, reason="verified_previous", score=0.5) for r in rows]
