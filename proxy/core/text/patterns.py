"""Regular-expression pieces the English rules of ``proxy.core.text`` share."""

from __future__ import annotations


def whole_words(*alternatives: str) -> str:
    """Alternatives matched as whole words of lowercased text: "now" must not fire on "know", nor
    "rain" on "train"."""
    return r"(?<![a-z0-9])(?:" + "|".join(alternatives) + r")(?![a-z0-9])"
