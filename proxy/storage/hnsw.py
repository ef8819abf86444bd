"""The vector index: one partition per tenant, searched exactly while small, by an HNSW graph of
its own once big.

A lookup only ever reads its own tenant's records and the shared (scope global) ones, so those are
the partitions (``mirror.partition_of``); one graph over every tenant walked with a Python filter
visits other tenants' nodes and calls the filter per node (bench_store.py times the search).

- Up to ``EXACT_LIMIT`` records a partition is a contiguous matrix of bfloat16 rows (the upper
  half of each float32, rounded): half the memory of float32, so a million 384-d vectors fit in
  768 MB, and widening it back is an integer shift, far quicker than numpy's float16 cast.
  Each row's norm after rounding is kept, so a vector still
  scores 1.0 against itself and others within ~3e-4 of float32. The filter is a vectorised mask
  over the rows' code columns (``mirror.Coded``), then one matrix-vector product.
- Past it the partition also gets an hnswlib graph of its own, walked without a filter for
  enough nearest that k admitted ones are among them (judged by the admitted share) and masked
  after. When the filter admits so few that the walk would have to ask for many, and no more rows
  than that limit, they are ranked exactly as above instead. The partition
  keeps its bfloat16 rows beside the graph's float32 copy: reading vectors back out of hnswlib
  (``get_items``) costs a call per vector, too slow to rank by.

hnswlib is not safe for concurrent add and search and fails when it fills: every call takes the
lock, and graphs are resized before they fill. Calls block, so the cache runs them in an
executor. SQLite is the source of truth: at start the index is either rebuilt from it or loaded
from the snapshot written at the last shutdown and brought level with it (proxy.service.cache).
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import hnswlib
import numpy as np

from proxy.storage.base import IndexKey
from proxy.storage.mirror import (
    COLUMNS,
    GLOBAL_POOL,
    SCOPE,
    SCOPE_WIDTH,
    TENANT,
    Codes,
    Want,
    partition_of,
)
from proxy.storage.partition import EXACT_LIMIT, GraphSettings, Partition, rounded, unit
from proxy.storage.vectors import Hits, Vector

SNAPSHOT_FORMAT = 2
_GEN_BYTES = 32  # the snapshot's generation, at the head of its data file


class HnswIndex:
    """Every live label in its partition, behind one lock (see the module docstring)."""

    def __init__(
        self, dim: int, *, m: int = 16, ef_construction: int = 200, ef: int = 96, exact_limit: int = EXACT_LIMIT
    ) -> None:
        self.dim = dim
        self.settings = GraphSettings(dim, m, ef_construction, ef, exact_limit)
        self.codes = Codes()
        self._lock = threading.Lock()
        self._pools: dict[str, Partition] = {}
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
            due = self._add_rows(labels, vectors, keys)
        for pool, built, wide in due:
            # a graph over thousands of rows takes a while (bench_store_scale.py): lookups go on meanwhile, against
            # the exact rows, and only this add waits
            graph = self.settings.build(wide, built)
            with self._lock:
                pool.take_graph(graph, built, self.settings)

    def add_now(self, labels: Sequence[int], vectors: Vector, keys: Sequence[IndexKey]) -> bool:
        """``add`` on the caller's thread; or False, having done nothing, when the index is busy or a
        partition it adds to walks a graph or would outgrow exact search. A few rows appended to a
        matrix cost less than the hop to an executor thread, and a busy lock must not hold up an
        event loop (``search_both_now``)."""
        if not len(labels):
            return True
        if not self._lock.acquire(blocking=False):
            return False
        try:
            growth = Counter(map(partition_of, keys))
            for name, more in growth.items():
                pool = self._pools.get(name)
                if pool is None:
                    if more > self.settings.exact_limit:
                        return False
                elif pool.graph is not None or pool.promoting or pool.n + more > self.settings.exact_limit:
                    return False
            vectors = unit(np.asarray(vectors, dtype=np.float32).reshape(len(labels), self.dim))
            due = self._add_rows(labels, vectors, keys)
            assert not due, "a partition within the exact limit is not due a graph"
            return True
        finally:
            self._lock.release()

    def _add_rows(
        self, labels: Sequence[int], vectors: Vector, keys: Sequence[IndexKey]
    ) -> list[tuple[Partition, np.ndarray, Vector]]:
        """Under the lock: unit ``vectors`` into their partitions; the partitions now due a graph."""
        home = self._home
        if not home.keys().isdisjoint(labels):
            at = [i for i, label in enumerate(labels) if label not in home]
            labels, keys, vectors = [labels[i] for i in at], [keys[i] for i in at], vectors[at]
        if not len(labels):
            return []
        chosen = np.asarray(labels, dtype=np.int64)
        names = list(map(partition_of, keys))
        home.update(zip(labels, names, strict=True))  # the caller's ints, shared with the mirror's keys
        cols = self.codes.columns(keys)
        part = np.where(cols[SCOPE] == SCOPE_WIDTH["global"], -1, cols[TENANT])
        order = np.argsort(part, kind="stable")  # one gather, then each partition is a slice
        chosen, vectors, cols, part = chosen[order], vectors[order], cols[:, order], part[order]
        rows, inv_norm = rounded(vectors)
        due = []
        bounds = [0, *(np.flatnonzero(np.diff(part)) + 1).tolist(), len(part)]
        for lo, hi in itertools.pairwise(bounds):
            name = names[int(order[lo])]
            pool = self._pools.get(name) or self._pools.setdefault(name, Partition.empty(self.dim))
            part_at = slice(lo, hi)
            pool.add_rows(
                chosen[part_at], vectors[part_at], rows[part_at], inv_norm[part_at], cols[:, part_at], self.settings
            )
            if (todo := pool.due(self.settings.exact_limit)) is not None:
                due.append((pool, *todo))
        return due

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
            return self._search(query, k, want)

    def search_among(self, vector: Vector, labels: Sequence[int]) -> Hits:
        """Exact cosine over a small pool (a session's records), best first."""
        query = unit(np.asarray(vector, dtype=np.float32).reshape(self.dim))
        with self._lock:
            return self._among(query, labels)

    def search_both(self, vector: Vector, labels: Sequence[int], k: int, want: Want | None) -> tuple[Hits, Hits]:
        """``search_among(labels)`` and, given a ``want``, ``search(k, want)``, under one hold of
        the lock: a lookup's two searches in one hop to the executor."""
        with self._lock:
            return self._both(vector, labels, k, want)

    def search_both_now(
        self, vector: Vector, labels: Sequence[int], k: int, want: Want | None, *, max_rows: int
    ) -> tuple[Hits, Hits] | None:
        """``search_both`` on the caller's thread; or None, having done nothing, when the index is
        busy or the lookup would walk a graph or scan more than ``max_rows`` rows. A small scan
        costs less than the hop to an executor thread (bench_store.py times the scan,
        bench_request_parts.py the hop), and a busy lock must not hold up an event loop."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if want is not None:
                pools = [p for name in (want.tenant, GLOBAL_POOL) if (p := self._pools.get(name)) is not None]
                if any(p.graph is not None for p in pools) or sum(p.n for p in pools) > max_rows:
                    return None
            return self._both(vector, labels, k, want)
        finally:
            self._lock.release()

    def _both(self, vector: Vector, labels: Sequence[int], k: int, want: Want | None) -> tuple[Hits, Hits]:
        query = unit(np.asarray(vector, dtype=np.float32).reshape(self.dim))
        return self._among(query, labels), [] if want is None else self._search(query, k, want)

    def _search(self, query: Vector, k: int, want: Want | None) -> Hits:
        if want is None:
            pools, coded = list(self._pools.values()), None
        else:
            pools = [p for name in (want.tenant, GLOBAL_POOL) if (p := self._pools.get(name)) is not None]
            coded = self.codes.coded(want)
        limit = self.settings.exact_limit
        found = [hit for pool in pools for hit in pool.search(query, k, coded, limit)]
        return heapq.nlargest(k, found, key=lambda hit: hit[1]) if len(pools) > 1 else found

    def _among(self, query: Vector, labels: Sequence[int]) -> Hits:
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
            pool = Partition(dim, labels, cols, rows)
            if p["graph"]:
                pool.graph = hnswlib.Index(space="cosine", dim=dim)
                pool.graph.load_index(str(path.parent / p["graph"]), allow_replace_deleted=False)
                pool.graph.set_ef(ef)
                pool.tombstones = int(p["tombstones"])
            index._pools[str(p["name"])] = pool
            index._home.update(dict.fromkeys(labels.tolist(), str(p["name"])))
        del data
        return index
