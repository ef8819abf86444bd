"""Cheap pair features for the gradient-boosted baseline the cross-encoder is measured against.

Both cosines plus what a cosine misses: character n-gram overlap, edit ratio, length gap, and
mismatches of numbers, Latin identifiers ("Optimus" vs "Optimus G") and negations.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

import numpy as np
import numpy.typing as npt

from proxy.tools.verifier.pairs import text_key

__all__ = ["FEATURES", "pair_features"]

FEATURES = (
    "cos_e5",
    "cos_use",
    "jaccard2",
    "jaccard3",
    "edit_ratio",
    "length_gap",
    "number_mismatch",
    "latin_mismatch",
    "negation_gap",
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_LATIN = re.compile(r"[A-Za-z][A-Za-z0-9+\-]*")
_NEGATION = re.compile(r"不|没|别|未|无|非|n't|\bnot\b|\bno\b|\bnever\b|\bwithout\b", re.IGNORECASE)


def _grams(text: str, n: int) -> set[str]:
    return {text[i : i + n] for i in range(max(1, len(text) - n + 1))}


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / max(1, len(a | b))


def pair_features(a: str, b: str, cos_e5: float, cos_use: float) -> npt.NDArray[np.float64]:
    ka, kb = text_key(a), text_key(b)
    latin_a, latin_b = ({w.lower() for w in _LATIN.findall(t)} for t in (a, b))
    return np.array(
        [
            cos_e5,
            cos_use,
            _jaccard(_grams(ka, 2), _grams(kb, 2)),
            _jaccard(_grams(ka, 3), _grams(kb, 3)),
            SequenceMatcher(None, ka, kb).ratio(),
            abs(len(ka) - len(kb)) / max(1, len(ka) + len(kb)),
            float(set(_NUMBER.findall(a)) != set(_NUMBER.findall(b))),
            float(latin_a != latin_b),
            float(abs(len(_NEGATION.findall(a)) - len(_NEGATION.findall(b)))),
        ]
    )
