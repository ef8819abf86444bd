"""The vector index: one partition per tenant, searched exactly while small, by an HNSW graph of
its own once big.

A lookup only ever reads its own tenant's records and the shared (scope global) ones, so those are
the partitions (``mirror.partition_of``); one graph over every tenant walked with a Python filter
visits other tenants' nodes and calls the filter per node (21 ms at 100k records, 50 tenants).

- Up to ``EXACT_LIMIT`` records a partition is a contiguous matrix of bfloat16 rows (the upper
  half of each float32, rounded): half the memory of float32, so a million 384-d vectors fit in
  768 MB, and widening it back is an integer shift, ten times quicker than numpy's float16 cast
  (0.07 against 0.7 ms per 1000 rows). Each row's norm after rounding is kept, so a vector still
  scores 1.0 against itself and others within ~3e-4 of float32. The filter is a vectorised mask
  over the rows' code columns (``mirror.Coded``), then one matrix-vector product.
- Past it the partition also gets an hnswlib graph of its own, walked without a filter for
  enough nearest that k admitted ones are among them (judged by the admitted share) and masked
  after. When the filter admits so few that the walk would have to ask for many, and no more rows
  than that limit, they are ranked exactly as above instead. The partition
  keeps its bfloat16 rows beside the graph's float32 copy: reading vectors back out of hnswlib
  (``get_items``) costs ~40 us each, 40 ms for a thousand, too slow to rank by.

hnswlib is not safe for concurrent add and search and fails when it fills: every call takes the
lock, and graphs are resized before they fill. Calls block, so the cache runs them in an
executor. SQLite is the source of truth: at start the index is either rebuilt from it or loaded
from the snapshot written at the last shutdown and brought level with it (proxy.cache).
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import threading
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import hnswlib
import numpy as np
import numpy.typing as npt

from proxy.storage.base import IndexKey
from proxy.storage.mirror import (
    COLUMNS,
    GLOBAL_POOL,
    SCOPE,
    SCOPE_WIDTH,
    TENANT,
    Coded,
    Codes,
    Columns,
    Want,
    partition_of,
)

Vector = npt.NDArray[np.float32]
Bf16 = npt.NDArray[np.uint16]
Hits = list[tuple[int, float]]

# exact scan of this many rows costs ~0.6 ms on the 2 shared cores (bench_store.py); a graph past it
EXACT_LIMIT = 8192
# a walk asked for more nearest than this costs more than ranking up to EXACT_LIMIT rows exactly
# (knn_query on 12k rows of 384: 0.4 ms for 32, 0.6 for 128, 1.8 for 512)
WALK_ASK = 256
SNAPSHOT_FORMAT = 2
_GEN_BYTES = 32  # the snapshot's generation, at the head of its data file


class VectorIndex(Protocol):
    dim: int

    def add(self, labels: Sequence[int], vectors: Vector, keys: Sequence[IndexKey]) -> None: ...
    def delete(self, labels: Iterable[int]) -> None: ...
    def search(self, vector: Vector, k: int, *, want: Want | None = None) -> Hits: ...
    def search_among(self, vector: Vector, labels: Sequence[int]) -> Hits: ...
    def __len__(self) -> int: ...


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


def _rounded(vectors: Vector) -> tuple[Bf16, Vector]:
    """Unit vectors as bfloat16 rows, and the reciprocal of each row's norm after rounding."""
    rows = to_bf16(vectors)
    inv_norm: Vector = (1.0 / np.maximum(np.linalg.norm(from_bf16(rows), axis=1), 1e-12)).astype(np.float32)
    return rows, inv_norm


def _best(scores: Vector, k: int) -> npt.NDArray[np.intp]:
    """Positions of the k highest scores, highest first."""
    if k < len(scores):
        part = np.argpartition(-scores, k - 1)[:k]
        return part[np.argsort(-scores[part], kind="stable")]
    return np.argsort(-scores, kind="stable")


class _Pool:
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
    def empty(cls, dim: int) -> _Pool:
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
        self.add_rows(labels, vectors, *_rounded(vectors), cols, graph)

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
        return [(int(self.labels[at[i]]), float(scores[i])) for i in _best(scores, k)]

    def _walk(self, query: Vector, k: int, coded: Coded | None, exact_limit: int) -> Hits:
        """See the module docstring; the mask over every row costs tens of microseconds."""
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


class HnswIndex:
    """Every live label in its partition, behind one lock (see the module docstring)."""

    def __init__(
        self, dim: int, *, m: int = 16, ef_construction: int = 200, ef: int = 96, exact_limit: int = EXACT_LIMIT
    ) -> None:
        self.dim = dim
        self.settings = GraphSettings(dim, m, ef_construction, ef, exact_limit)
        self.codes = Codes()
        self._lock = threading.Lock()
        self._pools: dict[str, _Pool] = {}
        self._home: dict[int, str] = {}  # label -> its partition

    def fresh(self) -> HnswIndex:
        """An empty index of the same settings, for a rebuild from the store to fill."""
        s = self.settings
        return HnswIndex(self.dim, m=s.m, ef_construction=s.ef_construction, ef=s.ef, exact_limit=s.exact_limit)

    def __len__(self) -> int:
        return len(self._home)

    def labels(self) -> set[int]:
        with self._lock:
            return set(self._home)

    def partitions(self) -> dict[str, tuple[int, bool]]:
        """Each partition's size and whether it is a graph."""
        with self._lock:
            return {name: (p.n, p.graph is not None) for name, p in self._pools.items()}

    @property
    def deleted_fraction(self) -> float:
        """Of the graphs' elements, those deleted but still walked (exact rows are dropped at once)."""
        with self._lock:
            dead = sum(p.tombstones for p in self._pools.values())
            total = len(self._home) + dead
        return dead / total if total else 0.0

    def add(self, labels: Sequence[int], vectors: Vector, keys: Sequence[IndexKey]) -> None:
        """New records (distinct labels); a label already here is left alone (a record's vector never
        changes). A batch is coded and split by partition at once: a start adds a million."""
        if not len(labels):
            return
        vectors = unit(np.asarray(vectors, dtype=np.float32).reshape(len(labels), self.dim))
        with self._lock:
            home = self._home
            if not home.keys().isdisjoint(labels):
                at = [i for i, label in enumerate(labels) if label not in home]
                labels, keys, vectors = [labels[i] for i in at], [keys[i] for i in at], vectors[at]
            if not len(labels):
                return
            chosen = np.asarray(labels, dtype=np.int64)
            names = list(map(partition_of, keys))
            home.update(zip(labels, names, strict=True))  # the caller's ints, shared with the mirror's keys
            cols = self.codes.columns(keys)
            part = np.where(cols[SCOPE] == SCOPE_WIDTH["global"], -1, cols[TENANT])
            order = np.argsort(part, kind="stable")  # one gather, then each partition is a slice
            chosen, vectors, cols, part = chosen[order], vectors[order], cols[:, order], part[order]
            rows, inv_norm = _rounded(vectors)
            due = []
            bounds = [0, *(np.flatnonzero(np.diff(part)) + 1).tolist(), len(part)]
            for lo, hi in itertools.pairwise(bounds):
                name = names[int(order[lo])]
                pool = self._pools.get(name) or self._pools.setdefault(name, _Pool.empty(self.dim))
                part_at = slice(lo, hi)
                pool.add_rows(
                    chosen[part_at], vectors[part_at], rows[part_at], inv_norm[part_at], cols[:, part_at], self.settings
                )
                if (todo := pool.due(self.settings.exact_limit)) is not None:
                    due.append((pool, *todo))
        for pool, built, wide in due:
            # seconds for a few thousand rows on a busy machine: lookups go on meanwhile, against
            # the exact rows, and only this add waits
            graph = self.settings.build(wide, built)
            with self._lock:
                pool.take_graph(graph, built, self.settings)

    def delete(self, labels: Iterable[int]) -> None:
        with self._lock:
            groups: dict[str, list[int]] = {}
            for label in labels:
                name = self._home.pop(label, None)
                if name is not None:
                    groups.setdefault(name, []).append(label)
            for name, gone in groups.items():
                pool = self._pools[name]
                pool.remove(np.asarray(gone, dtype=np.int64))
                if pool.n == 0 and pool.graph is None:
                    del self._pools[name]  # tenants come and go: no empty partition left behind

    def search(self, vector: Vector, k: int, *, want: Want | None = None) -> Hits:
        """The k nearest records ``want`` admits, from the caller's tenant and the shared partition;
        with no ``want``, the k nearest of all (for tests and benchmarks)."""
        query = unit(np.asarray(vector, dtype=np.float32).reshape(self.dim))
        with self._lock:
            if want is None:
                pools, coded = list(self._pools.values()), None
            else:
                pools = [p for name in (want.tenant, GLOBAL_POOL) if (p := self._pools.get(name)) is not None]
                coded = self.codes.coded(want)
            limit = self.settings.exact_limit
            found = [hit for pool in pools for hit in pool.search(query, k, coded, limit)]
        return heapq.nlargest(k, found, key=lambda hit: hit[1]) if len(pools) > 1 else found

    def search_among(self, vector: Vector, labels: Sequence[int]) -> Hits:
        """Exact cosine over a small pool (a session's records), best first."""
        query = unit(np.asarray(vector, dtype=np.float32).reshape(self.dim))
        with self._lock:
            groups: dict[str, list[int]] = {}
            for label in labels:
                if (name := self._home.get(label)) is not None:
                    groups.setdefault(name, []).append(label)
            found: Hits = []
            for name, chosen in groups.items():
                at = np.asarray(sorted(chosen), dtype=np.int64)
                scores = self._pools[name].vectors(at) @ query
                found += [(int(lab), float(s)) for lab, s in zip(at, scores, strict=True)]
        return sorted(found, key=lambda hit: -hit[1])

    # --- snapshots -------------------------------------------------------------------------------

    def save(self, path: Path, *, stamp: str) -> None:
        """One data file of every partition's labels, codes and exact rows, a file per graph and a
        JSON table of contents. The data file starts with the generation the table names, and the
        graphs' files carry it in their names, so a crash mid-save leaves the previous snapshot
        whole, or a mismatch that ``from_snapshot`` refuses, never half of one."""
        gen = uuid.uuid4().hex
        meta, tmp, meta_tmp = Path(f"{path}.json"), Path(f"{path}.tmp"), Path(f"{path}.json.tmp")
        with self._lock:
            table = []
            with tmp.open("wb") as out:
                out.write(gen.encode())
                for i, (name, pool) in enumerate(self._pools.items()):
                    n = pool.n
                    out.write(pool.labels[:n].tobytes())
                    out.write(np.ascontiguousarray(pool.cols[:, :n]).tobytes())
                    out.write(pool.rows[:n].tobytes())
                    graph = None
                    if pool.graph is not None:
                        graph = f"{path.name}.{gen}.{i}.graph"
                        pool.graph.save_index(str(path.parent / graph))
                    table.append({"name": name, "n": n, "graph": graph, "tombstones": pool.tombstones})
            s = self.settings
            info = {
                "format": SNAPSHOT_FORMAT,
                "stamp": stamp,
                "dim": self.dim,
                "gen": gen,
                "m": s.m,
                "ef_construction": s.ef_construction,
                "exact_limit": s.exact_limit,
                "codes": self.codes.names,
                "pools": table,
            }
        meta_tmp.write_text(json.dumps(info), encoding="utf-8")
        os.replace(tmp, path)
        os.replace(meta_tmp, meta)
        for old in path.parent.glob(f"{path.name}.*.graph"):
            if f".{gen}." not in old.name:
                old.unlink(missing_ok=True)

    @classmethod
    def from_snapshot(cls, path: Path, *, dim: int, stamp: str, ef: int = 96) -> HnswIndex | None:
        """The saved index, or None when there is none, or it was built for another model, shape or
        format. A damaged one raises (OSError, ValueError, RuntimeError or KeyError)."""
        meta = Path(f"{path}.json")
        if not path.is_file() or not meta.is_file():
            return None
        info = json.loads(meta.read_text(encoding="utf-8"))
        if info.get("format") != SNAPSHOT_FORMAT or info.get("stamp") != stamp or info.get("dim") != dim:
            return None
        index = cls(dim, m=int(info["m"]), ef_construction=int(info["ef_construction"]), ef=ef)
        index.settings.exact_limit = int(info["exact_limit"])
        index.codes = Codes(list(info["codes"]))
        table = info["pools"]
        size = _GEN_BYTES + sum(p["n"] * (8 + 4 * COLUMNS + 2 * dim) for p in table)
        if path.stat().st_size != size:
            raise ValueError(f"{path}: {path.stat().st_size} bytes where its table of contents says {size}")
        data = np.memmap(path, dtype=np.uint8, mode="r")  # read a partition at a time, not all at once
        if bytes(data[:_GEN_BYTES]) != str(info["gen"]).encode():
            raise ValueError(f"{path}: written by another save than {meta.name} describes")
        at = _GEN_BYTES
        for p in table:
            n = int(p["n"])
            labels = np.array(data[at : at + 8 * n].view(np.int64))
            at += 8 * n
            cols = np.array(data[at : at + 4 * COLUMNS * n].view(np.int32).reshape(COLUMNS, n))
            at += 4 * COLUMNS * n
            rows = np.array(data[at : at + 2 * dim * n].view(np.uint16).reshape(n, dim))
            at += 2 * dim * n
            pool = _Pool(dim, labels, cols, rows)
            if p["graph"]:
                pool.graph = hnswlib.Index(space="cosine", dim=dim)
                pool.graph.load_index(str(path.parent / p["graph"]), allow_replace_deleted=False)
                pool.graph.set_ef(ef)
                pool.tombstones = int(p["tombstones"])
            index._pools[str(p["name"])] = pool
            index._home.update(dict.fromkeys(labels.tolist(), str(p["name"])))
        del data
        return index
