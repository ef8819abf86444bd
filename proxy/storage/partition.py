"""One partition of the vector index (one tenant's records, or the shared global ones): a
contiguous matrix of bfloat16 rows searched exactly while small, and an hnswlib graph of its own
once past ``EXACT_LIMIT`` (proxy.storage.hnsw explains the choice and its measurements)."""

from __future__ import annotations

import hnswlib
import numpy as np
import numpy.typing as npt

from proxy.storage.mirror import COLUMNS, Coded, Columns
from proxy.storage.vectors import Hits, Vector

Bf16 = npt.NDArray[np.uint16]

# exact scan of this many rows costs about what a graph walk does (bench_store.py); a graph past it
EXACT_LIMIT = 8192
# a walk asked for more nearest than this costs more than ranking up to EXACT_LIMIT rows exactly
# (knn_query's cost grows with the number asked for; bench_store.py times both)
WALK_ASK = 256


def to_bf16(vectors: Vector) -> Bf16:
    bits = np.ascontiguousarray(vectors, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round half to even


def from_bf16(rows: Bf16) -> Vector:
    wide = rows.astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


def unit(vectors: Vector) -> Vector:
    v = np.asarray(vectors, dtype=np.float32)
    out: Vector = v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
    return out


def rounded(vectors: Vector) -> tuple[Bf16, Vector]:
    """Unit vectors as bfloat16 rows, and the reciprocal of each row's norm after rounding."""
    rows = to_bf16(vectors)
    inv_norm: Vector = (1.0 / np.maximum(np.linalg.norm(from_bf16(rows), axis=1), 1e-12)).astype(np.float32)
    return rows, inv_norm


def best(scores: Vector, k: int) -> npt.NDArray[np.intp]:
    """Positions of the k highest scores, highest first."""
    if k < len(scores):
        part = np.argpartition(-scores, k - 1)[:k]
        return part[np.argsort(-scores[part], kind="stable")]
    return np.argsort(-scores, kind="stable")


class Partition:
    """One partition: its labels (sorted), their code columns, and the bfloat16 rows (exact) or a
    graph. Arrays are allocated with room to grow; ``n`` rows are in use."""

    def __init__(self, dim: int, labels: npt.NDArray[np.int64], cols: Columns, rows: Bf16 | None = None) -> None:
        self.dim, self.n = dim, len(labels)
        self.labels, self.cols = labels, cols
        self.rows = rows if rows is not None else np.empty((0, dim), np.uint16)
        self.inv_norm = 1.0 / np.maximum(np.linalg.norm(from_bf16(self.rows), axis=1), 1e-12).astype(np.float32)
        self.graph: hnswlib.Index | None = None
        self.tombstones = 0
        self.promoting = False  # a graph is being built from these rows, outside the lock

    @classmethod
    def empty(cls, dim: int) -> Partition:
        return cls(dim, np.empty(0, np.int64), np.empty((COLUMNS, 0), np.int32))

    def _grow(self, more: int) -> None:
        need = self.n + more
        if need <= len(self.labels):
            return
        cap = max(need, 2 * len(self.labels), 16)
        self.labels = np.resize(self.labels, cap)
        cols = np.empty((COLUMNS, cap), np.int32)
        cols[:, : self.n] = self.cols[:, : self.n]
        self.cols = cols
        rows = np.empty((cap, self.dim), np.uint16)
        rows[: self.n] = self.rows[: self.n]
        self.rows = rows
        self.inv_norm = np.resize(self.inv_norm, cap)

    def add(self, labels: npt.NDArray[np.int64], vectors: Vector, cols: Columns, graph: GraphSettings) -> None:
        """New labels (none already here) with unit vectors."""
        self.add_rows(labels, vectors, *rounded(vectors), cols, graph)

    def add_rows(
        self,
        labels: npt.NDArray[np.int64],
        vectors: Vector,
        rows: Bf16,
        inv_norm: Vector,
        cols: Columns,
        graph: GraphSettings,
    ) -> None:
        """``add``, given the vectors rounded already (a batch is rounded at once, then split)."""
        self._grow(len(labels))
        n, m = self.n, len(labels)
        self.labels[n : n + m], self.cols[:, n : n + m] = labels, cols
        self.rows[n : n + m], self.inv_norm[n : n + m] = rows, inv_norm
        if self.graph is not None:
            graph.fit(self.graph, self.graph.element_count + m)
            self.graph.add_items(vectors, labels.astype(np.uint64))
        self.n += m
        if n and labels.min() < self.labels[n - 1]:  # a label older than the newest (adopted late)
            self._reorder(np.argsort(self.labels[: self.n], kind="stable"))

    def due(self, limit: int) -> tuple[npt.NDArray[np.int64], Vector] | None:
        """The rows to build this partition's graph from, once it outgrew exact search."""
        if self.graph is not None or self.promoting or self.n <= limit:
            return None
        self.promoting = True
        return self.labels[: self.n].copy(), from_bf16(self.rows[: self.n])

    def take_graph(self, graph: hnswlib.Index, built: npt.NDArray[np.int64], settings: GraphSettings) -> None:
        """Switch to a graph built from the rows ``built``: what was added to or deleted from the
        partition while it was built is applied to it first."""
        now = self.labels[: self.n]
        gone, new = np.setdiff1d(built, now), np.setdiff1d(now, built)
        for label in gone:
            graph.mark_deleted(int(label))
        if len(new):
            settings.fit(graph, graph.element_count + len(new))
            graph.add_items(self.vectors(new), new.astype(np.uint64))
        self.graph, self.tombstones, self.promoting = graph, len(gone), False

    def _reorder(self, order: npt.NDArray[np.intp]) -> None:
        n = len(order)
        self.labels[:n] = self.labels[order]
        self.cols[:, :n] = self.cols[:, order]
        self.rows[:n] = self.rows[order]
        self.inv_norm[:n] = self.inv_norm[order]

    def positions(self, labels: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
        return np.searchsorted(self.labels[: self.n], labels)

    def remove(self, labels: npt.NDArray[np.int64]) -> None:
        """Drop these labels (all here). Exact rows are compacted at once; a graph marks them."""
        keep = np.ones(self.n, dtype=bool)
        keep[self.positions(labels)] = False
        order = np.flatnonzero(keep)
        if self.graph is not None:
            for label in labels:
                self.graph.mark_deleted(int(label))
            self.tombstones += len(labels)
        self._reorder(order)
        self.n = len(order)

    def vectors(self, labels: npt.NDArray[np.int64]) -> Vector:
        """Unit vectors of these labels (all here)."""
        pos = self.positions(labels)
        out: Vector = from_bf16(self.rows[pos]) * self.inv_norm[pos, None]
        return out

    def search(self, query: Vector, k: int, coded: Coded | None, exact_limit: int = EXACT_LIMIT) -> Hits:
        if self.n == 0 or k <= 0:
            return []
        if self.graph is not None:
            return self._walk(query, k, coded, exact_limit)
        idx = None if coded is None else np.flatnonzero(coded.mask(self.cols[:, : self.n]))
        if idx is not None and len(idx) == self.n:
            idx = None  # every row admitted: no gather
        return self._exact(query, k, idx)

    def _exact(self, query: Vector, k: int, idx: npt.NDArray[np.intp] | None) -> Hits:
        rows = self.rows[: self.n] if idx is None else self.rows[idx]
        if not len(rows):
            return []
        norms = self.inv_norm[: self.n] if idx is None else self.inv_norm[idx]
        scores = (from_bf16(rows) @ query) * norms
        at = np.arange(self.n) if idx is None else idx
        return [(int(self.labels[at[i]]), float(scores[i])) for i in best(scores, k)]

    def _walk(self, query: Vector, k: int, coded: Coded | None, exact_limit: int) -> Hits:
        """See the module docstring; the mask over every row is cheap beside the walk (bench_store.py)."""
        assert self.graph is not None
        admitted = None if coded is None else np.flatnonzero(coded.mask(self.cols[:, : self.n]))
        share = 1.0 if admitted is None else max(len(admitted), 1) / self.n
        ask = max(32, int(2 * k / share))
        if admitted is not None and ask > WALK_ASK and len(admitted) <= exact_limit:
            return self._exact(query, k, admitted)
        ask = min(self.n, ask)
        while True:
            try:
                found, distances = self.graph.knn_query(query, k=ask)
            except RuntimeError:  # fewer than ``ask`` reachable past the tombstones
                break
            labels = found[0].astype(np.int64)
            ok = np.ones(len(labels), bool) if coded is None else coded.mask(self.cols[:, self.positions(labels)])
            if ok.sum() >= k or ask >= self.n:
                return [(int(lab), 1.0 - float(d)) for lab, d in zip(labels[ok][:k], distances[0][ok][:k], strict=True)]
            ask = min(self.n, 4 * ask)
        return self._exact(query, k, admitted)


class GraphSettings:
    """How a partition's graph is built, and when a partition gets one."""

    def __init__(self, dim: int, m: int, ef_construction: int, ef: int, exact_limit: int) -> None:
        self.dim, self.m, self.ef_construction, self.ef, self.exact_limit = dim, m, ef_construction, ef, exact_limit

    def new(self, capacity: int) -> hnswlib.Index:
        graph = hnswlib.Index(space="cosine", dim=self.dim)
        graph.init_index(
            max_elements=max(capacity, 1024),
            ef_construction=self.ef_construction,
            M=self.m,
            allow_replace_deleted=False,
        )
        graph.set_ef(self.ef)
        return graph

    def build(self, vectors: Vector, labels: npt.NDArray[np.int64]) -> hnswlib.Index:
        graph = self.new(2 * len(labels))
        graph.add_items(vectors, labels.astype(np.uint64))
        return graph

    @staticmethod
    def fit(graph: hnswlib.Index, needed: int) -> None:
        if needed > graph.get_max_elements():  # grow geometrically before it fills: a full graph raises
            graph.resize_index(max(needed, 2 * graph.get_max_elements()))
