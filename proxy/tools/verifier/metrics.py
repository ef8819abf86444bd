"""Ranking metrics at the high-precision end, and the Platt calibration fit (numpy only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["auc", "fit_platt", "recall_at_precision"]

Floats = npt.NDArray[np.float64]


def auc(scores: Sequence[float] | Floats, labels: Sequence[int] | npt.NDArray[np.int64]) -> float:
    """Area under the ROC curve (ties count half), by ranks."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    pos, neg = int(y.sum()), int(len(y) - y.sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def recall_at_precision(
    scores: Sequence[float] | Floats, labels: Sequence[int] | npt.NDArray[np.int64], precision: float
) -> float:
    """The largest recall over thresholds whose precision is at least ``precision``.

    Thresholds sit between distinct scores only (tied scores are accepted together), so a tie
    between a positive and a negative cannot be broken in the positive's favour.
    """
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    pos = int(y.sum())
    if pos == 0:
        return float("nan")
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    tp, fp = np.cumsum(y), np.cumsum(1 - y)
    last_of_tie = np.r_[s[1:] != s[:-1], True]
    ok = last_of_tie & (tp / (tp + fp) >= precision)
    return float(tp[ok].max() / pos) if ok.any() else 0.0


def fit_platt(logits: Floats, labels: npt.NDArray[np.int64], iterations: int = 100) -> tuple[float, float]:
    """(a, b) minimising the log loss of sigmoid(a * logit + b) (damped Newton, a tiny ridge).

    Each Newton step is halved until the loss falls: a confident model's logits reach tens, where
    a full step from a = 1 overshoots and the plain iteration runs ``a`` off to infinity.
    """
    x, y = np.asarray(logits, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    # Platt's targets: a little away from 0 and 1, so a separable split cannot send a to infinity
    pos, neg = y.sum(), len(y) - y.sum()
    t = np.where(y == 1, (pos + 1) / (pos + 2), 1 / (neg + 2))

    def loss(a: float, b: float) -> float:
        z = a * x + b
        return float((np.logaddexp(0.0, z) - t * z).sum())

    a, b = 1.0 / max(float(np.std(x)), 1.0), 0.0
    current = loss(a, b)
    for _ in range(iterations):
        p = 0.5 * (1 + np.tanh(0.5 * (a * x + b)))
        g = np.array([((p - t) * x).sum(), (p - t).sum()])
        w = p * (1 - p)
        h = np.array([[(w * x * x).sum() + 1e-6, (w * x).sum()], [(w * x).sum(), w.sum() + 1e-6]])
        step = np.linalg.solve(h, g)
        scale = 1.0
        while scale > 1e-6 and loss(a - scale * step[0], b - scale * step[1]) > current:
            scale /= 2
        a, b = a - scale * step[0], b - scale * step[1]
        previous, current = current, loss(a, b)
        if np.abs(scale * step).max() < 1e-9 or previous - current < 1e-12:
            break
    return float(a), float(b)
