"""A second pass over the hard cases: the rows the starting weights get wrong or nearly wrong.

The verifier serves only its top end (a pair is accepted at a probability near 1), so what
matters is which negatives the starting weights score highest: one more epoch over everything
moves the bulk of easy rows the model already ranks well. ``hard_pool`` reads the starting
model's logits over a seeded sample of the training rows and keeps, per source, the negatives
ranked highest and the positives ranked lowest, each read twice, with a seeded share of the
other rows so the pass does not forget the easy ones. Pure: logits and labels in, row indices out.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from proxy.tools.verifier.pairs import LabeledPair

__all__ = ["HardCut", "hard_pool"]


@dataclass(frozen=True)
class HardCut:
    # share of a source's scored negatives kept, highest logits first (the false accepts to come)
    negatives: float = 0.12
    # share of a source's scored positives kept, lowest logits first (the paraphrases it misses)
    positives: float = 0.08
    # times each hard row is read in the pass
    repeat: int = 2
    # other scored rows read once, as a share of the hard rows
    easy: float = 1.0


def hard_pool(
    pairs: Sequence[LabeledPair], scored: Sequence[int], logits: np.ndarray, cut: HardCut, seed: int
) -> list[int]:
    """Row indices of the pass: hard rows ``cut.repeat`` times, then a seeded sample of easy ones.

    ``scored[k]`` is the row whose logit is ``logits[k]``; rows not scored are not read.
    """
    by_source: dict[str, list[int]] = {}
    for k, i in enumerate(scored):
        by_source.setdefault(pairs[i].source, []).append(k)
    hard: set[int] = set()
    for ks in by_source.values():
        negatives = sorted((k for k in ks if pairs[scored[k]].label == 0), key=lambda k: -logits[k])
        positives = sorted((k for k in ks if pairs[scored[k]].label == 1), key=lambda k: logits[k])
        hard.update(negatives[: round(len(negatives) * cut.negatives)])
        hard.update(positives[: round(len(positives) * cut.positives)])
    hard_rows = sorted(scored[k] for k in hard)
    easy_rows = sorted(scored[k] for k in range(len(scored)) if k not in hard)
    rng = random.Random(f"{seed}|hard")
    easy_rows = rng.sample(easy_rows, min(len(easy_rows), round(len(hard_rows) * cut.easy)))
    return [i for i in hard_rows for _ in range(cut.repeat)] + easy_rows
