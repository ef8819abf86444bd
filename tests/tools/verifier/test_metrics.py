from __future__ import annotations

import numpy as np
import pytest

from proxy.tools.verifier.metrics import auc, fit_platt, recall_at_precision


@pytest.mark.parametrize(
    ("scores", "labels", "expected"),
    [
        ([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1], 1.0),
        ([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1], 0.0),
        ([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1], 0.5),
        ([0.1, 0.6, 0.4, 0.9], [0, 0, 1, 1], 0.75),
    ],
)
def test_auc(scores: list[float], labels: list[int], expected: float) -> None:
    assert auc(scores, labels) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("scores", "labels", "precision", "expected"),
    [
        ([0.9, 0.8, 0.7, 0.1], [1, 1, 0, 1], 0.99, 2 / 3),  # stop before the first negative
        ([0.9, 0.9, 0.7], [1, 0, 1], 0.99, 0.0),  # a tie with a negative cannot be split
        ([0.9, 0.8, 0.7, 0.6], [1, 1, 1, 0], 0.75, 1.0),
        ([0.9, 0.1], [0, 1], 0.99, 0.0),
    ],
)
def test_recall_at_precision(scores: list[float], labels: list[int], precision: float, expected: float) -> None:
    assert recall_at_precision(scores, labels, precision) == pytest.approx(expected)


def test_platt_recovers_a_known_scale() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=20000)
    y = (rng.random(20000) < 1 / (1 + np.exp(-(2.0 * x - 1.0)))).astype(np.int64)
    a, b = fit_platt(x, y)
    assert a == pytest.approx(2.0, abs=0.1) and b == pytest.approx(-1.0, abs=0.1)


def test_platt_converges_on_the_large_logits_of_a_confident_model() -> None:
    # logits of tens: a full Newton step from a = 1 overshoots, and undamped it ran a to ~1e9
    rng = np.random.default_rng(1)
    x = rng.normal(scale=12.0, size=7000) + 3.0
    y = (rng.random(7000) < 1 / (1 + np.exp(-(0.15 * x + 0.4)))).astype(np.int64)
    a, b = fit_platt(x, y)
    assert a == pytest.approx(0.15, abs=0.02) and b == pytest.approx(0.4, abs=0.15)
