"""The operators a turn writes, which an embedding does not read: "the difference between '-' and
'-='" and "the difference between == and =" are one sentence to it, and two questions.

A run of operator characters counts; a hyphen inside a word ("feel-good", "x-ray"), a slash
between words ("and/or") and runs of nothing but "!" or "~" (emphasis, 好的~) do not.
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["operators_differ", "operators_in"]

_RUN = re.compile(r"[=+\-*/%<>!&|^~]+")
_EMPHASIS = frozenset("!~")


def _inside_word(text: str, start: int, end: int) -> bool:
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    return before.isalnum() and after.isalnum()


def operators_in(text: str) -> Counter[str]:
    """The operator runs of ``text``, counted."""
    out: Counter[str] = Counter()
    for m in _RUN.finditer(text):
        run = m.group()
        if set(run) <= _EMPHASIS:
            continue
        if run in ("-", "/") and _inside_word(text, m.start(), m.end()):
            continue
        out[run] += 1
    return out


def operators_differ(a: str, b: str) -> bool:
    """Do the two turns write different operators (where either writes any)?"""
    ours, theirs = operators_in(a), operators_in(b)
    return (bool(ours) or bool(theirs)) and ours != theirs
