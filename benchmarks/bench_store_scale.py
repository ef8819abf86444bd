"""bench_store.py's scale mode: the filtered search, memory and start-up at a million records.

Records are bulk-loaded into a real SQLite store (one transaction per 20k rows: what a store
that grew over months holds, without a million commits), with random unit vectors of the
embedding's dimension. Tenants are even in size, or ``--zipf s`` skewed (tenant r holds a share
~ 1/r^s). A session is 5 records of one user; scopes are half tenant, 40 % session, 10 % user;
each tenant has two system-prompt versions (80/20). Then:

- start from the store: ``SemanticCache.load()`` (every key into the mirror, every vector into
  the per-tenant index), its time and the process RSS it holds afterwards;
- the snapshot: saving it with the mirror's keys, and the next process's start from both as the
  proxy starts (``HnswIndex.from_snapshot``, ``load_keys`` and ``load(snapshot=..., saved_keys=...)``,
  levelled with SQLite), and from the snapshot alone (every key read from SQLite);
- the filtered lookup as ``SemanticCache.nearest`` runs it, widened to the tenant: the session's
  own records exactly, then the caller's tenant and the shared partition; p50/p99 over queries
  from callers drawn in proportion to their tenant's records (a tenant with more records has
  more traffic). Timed in the thread the cache runs it in, and through ``nearest`` (the hop to
  the executor included);
- up to ``--old-max`` records, the single graph over every tenant walked with the cache's Python
  filter (what the per-tenant index replaced), on the same vectors and the same queries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import hnswlib
import numpy as np
from bench_store import release_heap, rss_bytes, unit_vectors

from proxy.core.identity import Identity
from proxy.service.cache import SemanticCache
from proxy.service.reach import visible
from proxy.storage.base import IndexKey
from proxy.storage.hnsw import HnswIndex
from proxy.storage.keyfile import keys_path, load_keys, save_keys
from proxy.storage.mirror import Want
from proxy.storage.sqlite import SqliteStore

MODEL = "qwen2.5-7b-instruct"
CHUNK = 20_000
COLUMNS = (
    "cache_id, tenant, user, scope, session, namespace, context_fingerprint, intent, coarse_tags, vector, "
    "qvector, answer_text, key_facts, model, system_prompt_version, policy_version, request_hash, state, "
    "created_at, ready_at, expires_at"
)


@dataclass(frozen=True)
class Scale:
    records: int
    tenants: int
    zipf: float
    largest_tenant: int
    graph_partitions: int
    exact_partitions: int
    insert_s: float
    rss_before_mib: float
    rss_after_load_mib: float
    load_store_s: float
    load_store_cpu_s: float  # of every thread: on a shared machine the wall time includes waiting for a core
    snapshot_save_s: float
    snapshot_bytes: int
    load_snapshot_s: float
    load_snapshot_cpu_s: float
    load_snapshot_store_keys_s: float  # the snapshot alone: every key read from SQLite
    new_p50_ms: float
    new_p99_ms: float
    new_cpu_p50_ms: float
    new_cpu_p99_ms: float
    nearest_p50_ms: float
    nearest_p99_ms: float
    old_build_s: float | None
    old_p50_ms: float | None
    old_p99_ms: float | None
    same_top8: float | None  # of queries where old and new agree on the top-8 label set


def progress(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def tenant_sizes(n: int, tenants: int, zipf: float, rng: np.random.Generator) -> np.ndarray:
    """The tenant of each session of 5, by the tenants' shares."""
    weights = 1.0 / np.arange(1, tenants + 1) ** zipf
    sessions = (n + 4) // 5
    return rng.choice(tenants, size=sessions, p=weights / weights.sum())


async def bulk_load(store: SqliteStore, n: int, tenants: int, zipf: float, dim: int) -> None:
    rng = np.random.default_rng(7)
    tenant_of = tenant_sizes(n, tenants, zipf, rng)
    now = time.time()
    for start in range(0, n, CHUNK):
        vectors = unit_vectors(rng, min(CHUNK, n - start), dim)
        scopes = rng.choice(["tenant", "session", "user"], size=len(vectors), p=[0.5, 0.4, 0.1])
        versions = np.where(rng.random(len(vectors)) < 0.8, "v0", "v1")
        rows = []
        for j, vec in enumerate(vectors):
            i = start + j
            session = i // 5
            rows.append(
                (
                    "sc-" + uuid.uuid4().hex[:20],
                    f"t-{tenant_of[session]:024x}",
                    f"u-{session % 997}",
                    str(scopes[j]),
                    f"d-{session:024x}",
                    "",
                    "",
                    "general",
                    "{}",
                    vec.tobytes(),
                    b"",
                    "an answer",
                    "{}",
                    MODEL,
                    str(versions[j]),
                    "p1",
                    "",
                    "ready",
                    now,
                    now,
                    now + 86400,
                )
            )
        await store._db.executemany(f"INSERT INTO records ({COLUMNS}) VALUES ({', '.join('?' * 21)})", rows)
        await store._db.commit()
    await store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def callers(cache: SemanticCache, count: int, rng: np.random.Generator) -> list[tuple[Identity, IndexKey]]:
    """Callers drawn by record, so in proportion to their tenant's size."""
    labels = np.fromiter(cache.keys, dtype=np.int64)
    out = []
    for label in rng.choice(labels, size=count):
        key = cache.keys[int(label)]
        out.append((Identity(key.tenant, key.session, key.user, True), key))
    return out


def admit_of(cache: SemanticCache, who: Identity, key: IndexKey) -> Callable[[int], bool]:
    """The cache's own filter (SemanticCache.candidates), for the session search and the old walk."""

    def admit(label: int) -> bool:
        k = cache.keys.get(label)
        return (
            k is not None
            and k.model == key.model
            and k.namespace == key.namespace
            and k.system_prompt_version == key.system_prompt_version
            and visible(k, who, "tenant")
        )

    return admit


def percentiles(seconds: list[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(np.asarray(seconds) * 1000, [50, 99])
    return float(p50), float(p99)


def time_new(cache: SemanticCache, queries: np.ndarray, who_keys: list[tuple[Identity, IndexKey]]) -> tuple:
    """Wall and CPU time of each lookup: on a shared machine the wall p99 includes being preempted."""
    index, took, cpu, results = cache.index, [], [], []
    for q, (who, key) in zip(queries, who_keys, strict=True):
        admit = admit_of(cache, who, key)
        want = Want(who.tenant, who.user, key.model, key.namespace, key.system_prompt_version, "tenant")
        t, c = time.perf_counter(), time.thread_time()
        session = [lab for lab in cache.pools.sessions.get((who.tenant, who.session), ()) if admit(lab)]
        found = index.search_among(q, session) + index.search(q, 8, want=want)
        took.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
        results.append(found)
    return percentiles(took), percentiles(cpu), results


async def time_nearest(cache: SemanticCache, queries: np.ndarray, who_keys: list) -> tuple[float, float]:
    took = []
    for q, (who, key) in zip(queries, who_keys, strict=True):
        want = Want(who.tenant, who.user, key.model, key.namespace, key.system_prompt_version, "tenant")
        t = time.perf_counter()
        await cache.nearest(q, who, "tenant", admit_of(cache, who, key), want)
        took.append(time.perf_counter() - t)
    return percentiles(took)


async def old_walk(cache: SemanticCache, store: SqliteStore, queries: np.ndarray, who_keys: list) -> tuple:
    """The single graph over every record, walked with the cache's Python filter, as it was."""
    labels, vectors = [], []
    async for row in store.iter_index_rows():
        labels.append(row.label)
        vectors.append(row.vector or b"")
    matrix = np.frombuffer(b"".join(vectors), dtype=np.float32).reshape(len(labels), -1)
    del vectors
    graph = hnswlib.Index(space="cosine", dim=matrix.shape[1])
    graph.init_index(max_elements=2 * len(labels), ef_construction=200, M=16)
    graph.set_ef(96)
    t = time.perf_counter()
    graph.add_items(matrix, np.asarray(labels, dtype=np.uint64))
    build_s = time.perf_counter() - t
    progress(f"old graph built in {build_s:.0f} s")
    took, results = [], []
    for q, (who, key) in zip(queries, who_keys, strict=True):
        admit = admit_of(cache, who, key)
        t = time.perf_counter()
        session = [lab for lab in cache.pools.sessions.get((who.tenant, who.session), ()) if admit(lab)]
        found = cache.index.search_among(q, session)
        k = 8
        while k > 0:
            try:
                got, distances = graph.knn_query(q.reshape(1, -1), k=k, filter=admit)
            except RuntimeError:
                k //= 2
                continue
            found += [(int(a), 1.0 - float(b)) for a, b in zip(got[0], distances[0], strict=True)]
            break
        took.append(time.perf_counter() - t)
        results.append(found)
    return build_s, percentiles(took), results


def top8(found: list[tuple[int, float]]) -> set[int]:
    best: dict[int, float] = {}
    for label, score in found:
        best[label] = max(score, best.get(label, -1.0))
    return set(sorted(best, key=lambda lab: -best[lab])[:8])


async def measure_scale(args: argparse.Namespace, directory: Path) -> Scale:
    n, dim = args.records, args.dim
    store = await SqliteStore.open(directory / "cache.sqlite3")
    t = time.perf_counter()
    await bulk_load(store, n, args.tenants, args.zipf, dim)
    insert_s = time.perf_counter() - t
    progress(f"inserted {n:,} in {insert_s:.0f} s")
    release_heap()
    rss_before = rss_bytes()
    cache = SemanticCache(store, HnswIndex(dim), ready_after=0.0, top_k=8)
    t, c = time.perf_counter(), time.process_time()
    assert await cache.load() == n
    load_store_s, load_store_cpu_s = time.perf_counter() - t, time.process_time() - c
    progress(f"loaded from the store in {load_store_s:.1f} s")
    release_heap()
    rss_after = rss_bytes()
    parts = cache.index.partitions()
    path = directory / "index.hnsw"
    t = time.perf_counter()
    cache.index.save(path, stamp="bench")
    save_keys(keys_path(path), cache.keys, stamp="bench")
    save_s = time.perf_counter() - t
    snapshot_bytes = sum(f.stat().st_size for f in directory.glob("index.hnsw*"))
    t, c = time.perf_counter(), time.process_time()
    restarted = SemanticCache(store, HnswIndex(dim), ready_after=0.0, top_k=8)
    snapshot, saved = HnswIndex.from_snapshot(path, dim=dim, stamp="bench"), load_keys(keys_path(path), stamp="bench")
    assert saved is not None and await restarted.load(snapshot=snapshot, saved_keys=saved) == n
    load_snapshot_s, load_snapshot_cpu_s = time.perf_counter() - t, time.process_time() - c
    progress(f"loaded from the snapshot and the saved keys in {load_snapshot_s:.1f} s")
    assert restarted.index.partitions() == parts and restarted.keys == cache.keys
    del restarted, snapshot, saved
    release_heap()
    t = time.perf_counter()
    restarted = SemanticCache(store, HnswIndex(dim), ready_after=0.0, top_k=8)
    assert await restarted.load(snapshot=HnswIndex.from_snapshot(path, dim=dim, stamp="bench")) == n
    load_snapshot_store_keys_s = time.perf_counter() - t
    progress(f"loaded from the snapshot, keys from SQLite, in {load_snapshot_store_keys_s:.1f} s")
    del restarted
    release_heap()
    rng = np.random.default_rng(11)
    queries = unit_vectors(rng, args.queries, dim)
    who_keys = callers(cache, args.queries, rng)
    (new_p50, new_p99), (cpu_p50, cpu_p99), new_found = time_new(cache, queries, who_keys)
    near_p50, near_p99 = await time_nearest(cache, queries, who_keys)
    progress(f"new search p50 {new_p50:.2f} ms p99 {new_p99:.2f} ms")
    old: tuple[float | None, float | None, float | None, float | None] = (None, None, None, None)
    if n <= args.old_max:
        few = args.old_queries  # the old walk takes a tenth of a second a query and more here
        build_s, (old_p50, old_p99), old_found = await old_walk(cache, store, queries[:few], who_keys[:few])
        agree = sum(top8(a) == top8(b) for a, b in zip(new_found, old_found, strict=False)) / len(old_found)
        old = (build_s, old_p50, old_p99, agree)
    await store.close()
    return Scale(
        n,
        args.tenants,
        args.zipf,
        max(size for size, _ in parts.values()),
        sum(graph for _, graph in parts.values()),
        sum(not graph for _, graph in parts.values()),
        insert_s,
        rss_before / 2**20,
        rss_after / 2**20,
        load_store_s,
        load_store_cpu_s,
        save_s,
        snapshot_bytes,
        load_snapshot_s,
        load_snapshot_cpu_s,
        load_snapshot_store_keys_s,
        new_p50,
        new_p99,
        cpu_p50,
        cpu_p99,
        near_p50,
        near_p99,
        *old,
    )


def report_scale(r: Scale) -> str:
    def ms(p50: float | None, p99: float | None) -> str:
        return "not run (too slow to build here)" if p50 is None else f"p50 {p50:.2f} ms   p99 {p99:.2f} ms"

    rows = [
        ("records / tenants", f"{r.records:,} / {r.tenants:,} ({'even' if not r.zipf else f'zipf {r.zipf}'})"),
        (
            "partitions",
            f"{r.exact_partitions:,} exact, {r.graph_partitions:,} graph; largest {r.largest_tenant:,} records",
        ),
        ("bulk insert into SQLite", f"{r.insert_s:,.1f} s"),
        ("filtered top-8, per-tenant index (in its thread)", ms(r.new_p50_ms, r.new_p99_ms)),
        ("  CPU time of the same (preemption left out)", ms(r.new_cpu_p50_ms, r.new_cpu_p99_ms)),
        ("  through SemanticCache.nearest (executor hop)", ms(r.nearest_p50_ms, r.nearest_p99_ms)),
        ("filtered top-8, one graph + Python filter (old)", ms(r.old_p50_ms, r.old_p99_ms)),
    ]
    if r.same_top8 is not None:
        rows.append(("  old graph build; same top-8 as new", f"{r.old_build_s:,.0f} s; {r.same_top8:.1%} of queries"))
    rows += [
        ("RSS before load / after (process)", f"{r.rss_before_mib:,.0f} MiB / {r.rss_after_load_mib:,.0f} MiB"),
        ("  held by index + mirror", f"{r.rss_after_load_mib - r.rss_before_mib:,.0f} MiB"),
        ("start from the store (load())", f"{r.load_store_s:,.1f} s  (CPU {r.load_store_cpu_s:,.1f} s)"),
        (
            "start from the snapshot and saved keys (load + level)",
            f"{r.load_snapshot_s:,.1f} s  (CPU {r.load_snapshot_cpu_s:,.1f} s; saving both: "
            f"{r.snapshot_save_s:,.1f} s, {r.snapshot_bytes / 2**20:,.0f} MiB)",
        ),
        ("  the snapshot alone, every key from SQLite", f"{r.load_snapshot_store_keys_s:,.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run_scale(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = asyncio.run(measure_scale(args, Path(tmp)))
    print(report_scale(result))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n", encoding="utf-8")
