"""The seam between the decision stage and whatever model verifies a candidate hit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from proxy.verify.sides import PairSide

__all__ = ["Verifier"]


@runtime_checkable
class Verifier(Protocol):
    """Scores pairs of requests: the probability that the cached answer of one answers the other.

    ``score`` is synchronous and blocking (model inference): call it from an executor, and hand
    it every pending pair at once, since one call over many pairs costs far less than many calls.
    The result has one probability in [0, 1] per pair, in order; a pair scores the same alone
    as inside a batch.
    """

    name: str
    version: str

    def score(self, pairs: Sequence[tuple[PairSide, PairSide]]) -> list[float]: ...
