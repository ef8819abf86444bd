"""hnswlib recall behind a lock.

hnswlib is not safe for concurrent add and search, fails when it fills, and raises when a
filtered query reaches fewer than ``k`` elements; this wrapper owns those three facts. Calls
block, so the cache runs them in an executor. SQLite is the source of truth: the index is
compacted from it when deletions pile up, and at start it is either rebuilt from it or loaded
from the snapshot written at the last shutdown and brought level with it (proxy.cache).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

import hnswlib
import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]
Filter = Callable[[int], bool]


class VectorIndex(Protocol):
    dim: int

    def add(self, labels: Sequence[int], vectors: Vector) -> None: ...
    def delete(self, labels: Iterable[int]) -> None: ...
    def search(self, vector: Vector, k: int, *, allowed: Filter | None = None) -> list[tuple[int, float]]: ...
    def search_among(self, vector: Vector, labels: Sequence[int]) -> list[tuple[int, float]]: ...
    def __len__(self) -> int: ...


class HnswIndex:
    def __init__(
        self, dim: int, *, capacity: int = 1024, m: int = 16, ef_construction: int = 200, ef: int = 96
    ) -> None:
        self.dim = dim
        self._m, self._ef_construction, self._ef = m, ef_construction, ef
        self._lock = threading.Lock()
        self._live: set[int] = set()
        self._deleted = 0
        self._index = self._new_index(max(capacity, 16))

    def _new_index(self, capacity: int) -> hnswlib.Index:
        index = hnswlib.Index(space="cosine", dim=self.dim)
        index.init_index(
            max_elements=capacity, ef_construction=self._ef_construction, M=self._m, allow_replace_deleted=False
        )
        index.set_ef(self._ef)
        return index

    def __len__(self) -> int:
        return len(self._live)

    def labels(self) -> set[int]:
        with self._lock:
            return set(self._live)

    @property
    def deleted_fraction(self) -> float:
        total = len(self._live) + self._deleted
        return self._deleted / total if total else 0.0

    def add(self, labels: Sequence[int], vectors: Vector) -> None:
        if not len(labels):
            return
        vectors = np.asarray(vectors, dtype=np.float32).reshape(len(labels), self.dim)
        with self._lock:
            needed = self._index.element_count + len(labels)
            if needed > self._index.get_max_elements():
                # grow geometrically before it fills: a full index raises on add
                self._index.resize_index(max(needed, 2 * self._index.get_max_elements()))
            self._index.add_items(vectors, np.asarray(labels, dtype=np.uint64))
            self._live.update(int(x) for x in labels)

    def delete(self, labels: Iterable[int]) -> None:
        with self._lock:
            for label in labels:
                if label in self._live:
                    self._index.mark_deleted(label)
                    self._live.discard(label)
                    self._deleted += 1

    def search(self, vector: Vector, k: int, *, allowed: Filter | None = None) -> list[tuple[int, float]]:
        query = np.asarray(vector, dtype=np.float32).reshape(1, self.dim)
        with self._lock:
            k = min(k, len(self._live))
            while k > 0:
                try:
                    labels, distances = self._index.knn_query(query, k=k, filter=allowed)
                except RuntimeError:
                    # fewer than k reachable elements pass the filter: ask for fewer
                    k //= 2
                    continue
                return [(int(lab), 1.0 - float(d)) for lab, d in zip(labels[0], distances[0], strict=True)]
        return []

    def search_among(self, vector: Vector, labels: Sequence[int]) -> list[tuple[int, float]]:
        """Exact cosine over a small pool (a session's records): exact beats a filtered graph walk there."""
        with self._lock:
            live = [lab for lab in labels if lab in self._live]
            if not live:
                return []
            matrix = np.asarray(self._index.get_items(live), dtype=np.float32)
        matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
        q = np.asarray(vector, dtype=np.float32).reshape(self.dim)
        q = q / max(float(np.linalg.norm(q)), 1e-12)
        sims = matrix @ q
        order = np.argsort(-sims)
        return [(live[i], float(sims[i])) for i in order]

    def rebuild(self, items: Iterable[tuple[int, Vector]]) -> None:
        """Replace the graph with exactly these items (compaction after many deletes)."""
        pairs = list(items)
        fresh = self._new_index(max(2 * len(pairs), 1024))
        if pairs:
            fresh.add_items(
                np.stack([v for _, v in pairs]).astype(np.float32),
                np.asarray([lab for lab, _ in pairs], dtype=np.uint64),
            )
        with self._lock:
            self._index = fresh
            self._live = {lab for lab, _ in pairs}
            self._deleted = 0

    # --- snapshots -------------------------------------------------------------------------------

    def save(self, path: Path, *, stamp: str) -> None:
        """The graph, its live labels and what it was built from, each written beside and renamed
        into place, so a crash mid-save leaves the previous snapshot or none, never half of one."""
        graph, meta = path, Path(f"{path}.json")
        tmp, meta_tmp = Path(f"{graph}.tmp"), Path(f"{meta}.tmp")
        with self._lock:
            self._index.save_index(str(tmp))
            live = sorted(self._live)
            info = {
                "stamp": stamp,
                "dim": self.dim,
                "deleted": self._deleted,
                "live": live,
                "m": self._m,
                "ef_construction": self._ef_construction,
            }
        meta_tmp.write_text(json.dumps(info), encoding="utf-8")
        os.replace(tmp, graph)
        os.replace(meta_tmp, meta)

    @classmethod
    def from_snapshot(cls, path: Path, *, dim: int, stamp: str, ef: int = 96) -> HnswIndex | None:
        """The saved graph, or None when there is none or it was built for another model or shape."""
        meta = Path(f"{path}.json")
        if not path.is_file() or not meta.is_file():
            return None
        info = json.loads(meta.read_text(encoding="utf-8"))
        if info.get("stamp") != stamp or info.get("dim") != dim:
            return None
        index = cls(dim, capacity=16, m=int(info["m"]), ef_construction=int(info["ef_construction"]), ef=ef)
        graph = hnswlib.Index(space="cosine", dim=dim)
        graph.load_index(str(path), allow_replace_deleted=False)
        graph.set_ef(ef)
        index._index = graph
        index._live = {int(x) for x in info["live"]}
        index._deleted = int(info["deleted"])
        return index
