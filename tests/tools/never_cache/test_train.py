"""The reader's training steps on small tables: weights per group, the fit, the levels, the reading."""

from __future__ import annotations

import numpy as np

from proxy.signing.never_cache_head import softmax
from proxy.tools.never_cache.data import Utterance
from proxy.tools.never_cache.train import fit, group_weights, is_validation, levels, read


def _rows(*specs: tuple[str, str, int]) -> list[Utterance]:
    return [Utterance(f"{lang} {label} {i}", lang, label, "t") for lang, label, n in specs for i in range(n)]


def test_every_language_and_label_weighs_the_same_in_total() -> None:
    rows = _rows(("en", "medical", 10), ("zh", "medical", 1000), ("en", "other", 90))
    w = group_weights(rows)
    totals = {
        g: w[[i for i, u in enumerate(rows) if (u.lang, u.label) == g]].sum()
        for g in (("en", "medical"), ("zh", "medical"), ("en", "other"))
    }
    assert np.allclose(list(totals.values()), totals[("en", "medical")])
    assert np.isclose(w.sum(), len(rows))


def test_the_validation_fifth_is_a_fifth_and_depends_on_the_seed() -> None:
    texts = [f"question {i}" for i in range(5000)]
    share = np.mean([is_validation(t, 1) for t in texts])
    assert 0.17 < share < 0.23
    assert [is_validation(t, 1) for t in texts] != [is_validation(t, 2) for t in texts]
    assert is_validation("Question 7?", 1) == is_validation("question 7", 1)  # by text key


def test_fit_separates_classes_that_lie_apart() -> None:
    rng = np.random.default_rng(0)
    centres = np.eye(3, 8) * 3
    x = np.concatenate([centres[c] + rng.normal(0, 0.3, (50, 8)) for c in range(3)])
    y = np.repeat(np.arange(3), 50).astype(np.int64)
    weights, bias = fit(x, y, np.ones(len(y)), l2=1e-4, epochs=200, seed=0)
    assert (softmax(x @ weights.T + bias).argmax(axis=1) == y).mean() > 0.95


def test_levels_hold_each_language_to_its_share_of_the_target() -> None:
    rows = _rows(("en", "other", 100), ("zh", "other", 100), ("en", "medical", 10))
    probs = np.zeros((len(rows), 3))
    probs[:, 0] = 1.0
    # five English and one Chinese ordinary question look medical, at 0.6 .. 0.95
    for i, p in zip([0, 1, 2, 3, 4, 100], [0.6, 0.7, 0.8, 0.9, 0.95, 0.65], strict=True):
        probs[i] = [1 - p, 0.0, p]
    probs[200:] = [0.02, 0.0, 0.98]
    at = levels(probs, rows, 0.02, ["medical"])
    assert set(at) == {"medical"}
    predicted = read(probs, at)
    en_other = [i for i, u in enumerate(rows) if (u.lang, u.label) == ("en", "other")]
    assert np.mean(predicted[en_other] != 0) <= 0.02
    assert (predicted[200:] == 2).all()


def test_a_class_without_a_level_is_never_read() -> None:
    probs = np.array([[0.01, 0.98, 0.01], [0.01, 0.01, 0.98]])
    assert read(probs, {"medical": 0.9}).tolist() == [0, 2]
