from __future__ import annotations

import numpy as np

from proxy.storage.hnsw import HnswIndex


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_grows_past_capacity_and_finds_exact_neighbours() -> None:
    rng = np.random.default_rng(0)
    index = HnswIndex(16, capacity=16)
    vectors = unit(rng, 200, 16)
    index.add(list(range(1, 201)), vectors)
    assert len(index) == 200
    (label, score), *_ = index.search(vectors[41], 3)
    assert label == 42 and score > 0.999


def test_filter_with_fewer_matches_than_k_and_deletes() -> None:
    rng = np.random.default_rng(1)
    index = HnswIndex(8)
    vectors = unit(rng, 50, 8)
    index.add(list(range(50)), vectors)
    hits = index.search(vectors[0], 10, allowed=lambda lab: lab in (3, 7))
    assert sorted(lab for lab, _ in hits) == [3, 7]
    index.delete([3])
    assert [lab for lab, _ in index.search(vectors[3], 10, allowed=lambda lab: lab in (3, 7))] == [7]
    assert index.deleted_fraction > 0


def test_search_among_is_exact_and_rebuild_compacts() -> None:
    rng = np.random.default_rng(2)
    index = HnswIndex(8)
    vectors = unit(rng, 20, 8)
    index.add(list(range(20)), vectors)
    ranked = index.search_among(vectors[5], [1, 5, 9])
    assert ranked[0][0] == 5 and len(ranked) == 3
    expected = sorted(float(vectors[i] @ vectors[5]) for i in (1, 9))
    assert sorted(s for lab, s in ranked[1:]) == [pytest_approx(x) for x in expected]
    index.delete(range(10))
    index.rebuild([(i, vectors[i]) for i in range(10, 20)])
    assert len(index) == 10 and index.deleted_fraction == 0


def pytest_approx(x: float) -> object:
    import pytest

    return pytest.approx(x, abs=1e-5)
