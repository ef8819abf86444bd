"""The hard pass reads the rows the starting weights rank worst, per source, and some others."""

from __future__ import annotations

from collections import Counter

import numpy as np

from proxy.tools.verifier.hard import HardCut, hard_pool
from proxy.tools.verifier.pairs import LabeledPair
from proxy.verify import PairSide


def _pairs(source: str, labels: list[int]) -> list[LabeledPair]:
    return [LabeledPair(source, PairSide(f"{source}a{i}"), PairSide(f"{source}b{i}"), y) for i, y in enumerate(labels)]


def test_keeps_the_highest_negatives_and_lowest_positives_of_each_source_twice() -> None:
    pairs = _pairs("bq", [0] * 10 + [1] * 10) + _pairs("qqp", [0] * 10 + [1] * 10)
    scored = list(range(40))
    # within a source, negatives score 0..9 and positives 10..19: the model ranks them right,
    # so the hard ones are the top negatives and the bottom positives
    logits = np.array([float(i % 20) for i in scored])
    pool = hard_pool(pairs, scored, logits, HardCut(negatives=0.2, positives=0.1, repeat=2, easy=0.0), seed=0)
    counts = Counter(pool)
    assert set(counts) == {8, 9, 10, 28, 29, 30}
    assert set(counts.values()) == {2}


def test_reads_only_scored_rows_and_adds_a_seeded_share_of_easy_ones() -> None:
    pairs = _pairs("oppo", [0, 1] * 20)
    scored = [*range(0, 40, 2), 1, 3, 5, 7]  # 20 negatives, 4 positives
    logits = np.linspace(-3, 3, len(scored))
    cut = HardCut(negatives=0.1, positives=0.25, repeat=1, easy=1.0)
    pool = hard_pool(pairs, scored, logits, cut, seed=3)
    hard = {36, 38, 1}  # the two highest negatives, the lowest positive
    assert hard <= set(pool) <= set(scored)
    assert len(pool) == 2 * len(hard) and len(set(pool)) == len(pool)
    assert pool == hard_pool(pairs, scored, logits, cut, seed=3)
    assert pool != hard_pool(pairs, scored, logits, cut, seed=4)
