"""Memory and disk used per 100k cache records, measured on the real store and index.

Synthetic records (random unit vectors of the embedding's dimension, answers of a realistic
length, coarse tags and key facts of the shape the proxy writes) are inserted one by one
through ``SqliteStore.insert`` (the proxy's write path: one commit per answer). Then the
proxy's start-up path runs: ``SemanticCache.load()`` reads every live record and builds the
per-tenant index and the in-memory filter maps. Reported:

- disk: the SQLite file after a WAL checkpoint (what a backup copies), and bytes per record;
- memory: the process RSS before and after ``load()`` (after returning freed heap to the OS),
  which counts the index, the filter maps and SQLite's page cache; and the index alone as
  its snapshot file holds it;
- the cost of keeping that many records: insert rate, load time, filtered top-k search
  latency, and one lifecycle sweep (expiry, capacity check, gauges) with nothing to evict and
  when one record over capacity (it evicts down to the 95 % low-water mark); and the start of
the next process from the index snapshot and the mirror's keys saved at shutdown, against the
rebuild.

    .venv/bin/python benchmarks/bench_store.py [--records 100000] [--answer-chars 800] [--lang en|zh]

With ``--tenants``, the scale mode instead (bench_store_scale.py): records bulk-loaded into
SQLite, filtered search latency of the per-tenant index (and of the single graph walked with a
Python filter it replaced, side by side, up to ``--old-max`` records), RSS, and the start from the
store and from the snapshot:

    .venv/bin/python benchmarks/bench_store.py --records 1000000 --tenants 1000 [--zipf 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from proxy.core.decision.validate import extract_key_facts
from proxy.core.model import Record, RecordTags
from proxy.core.text.entities import Entities
from proxy.core.text.normalize import NormalText
from proxy.core.text.numbers import NumericConstraint
from proxy.observability.metrics import Metrics
from proxy.service.cache import SemanticCache
from proxy.service.feedback import HitJudge
from proxy.service.lifecycle import Capacity, Lifecycle
from proxy.storage.hnsw import HnswIndex
from proxy.storage.keyfile import keys_path, load_keys, save_keys
from proxy.storage.mirror import Want
from proxy.storage.sqlite import SqliteStore

PER = 100_000
INTENTS = ("travel", "shopping", "code", "general", "chitchat", "doc_rewrite", "after_sales", "refund")
EN_WORDS = (
    "the",
    "hotel",
    "budget",
    "day",
    "trip",
    "museum",
    "train",
    "station",
    "ticket",
    "price",
    "about",
    "walk",
    "minutes",
    "from",
    "breakfast",
    "included",
    "recommend",
    "option",
    "evening",
    "morning",
    "2024-06-01",
    "3",
    "nights",
    "$120",
    "and",
    "with",
    "a",
    "for",
    "to",
    "near",
    "old",
    "town",
)


@dataclass(frozen=True)
class Result:
    records: int
    insert_s: float
    db_bytes: int
    rss_before: int
    rss_after_load: int
    rss_steady: int
    index_file_bytes: int
    load_s: float
    snapshot_save_s: float
    snapshot_load_s: float
    search_ms_any: float
    search_ms_tenant: float
    tick_ms_idle: float
    tick_ms_evict: float
    answer_bytes: int


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def release_heap() -> None:
    """Collect, and hand freed malloc arenas back to the OS, so RSS shows what is really held."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def answer_text(rng: np.random.Generator, chars: int, lang: str) -> str:
    if lang == "zh":  # CJK unified ideographs: 3 bytes each in UTF-8
        return "".join(chr(int(c)) for c in rng.integers(0x4E00, 0x9FA6, size=chars))
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append(str(rng.choice(EN_WORDS)))
    return " ".join(words)[:chars]


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def make_records(n: int, dim: int, chars: int, lang: str, seed: int = 7) -> Callable[[int], Record]:
    """A factory of record i: 50 tenants, sessions of 5 records, answers from 64 templates (SQLite
    does not compress, so byte counts are those of distinct answers)."""
    rng = np.random.default_rng(seed)
    templates = [answer_text(rng, chars, lang) for _ in range(64)]
    facts = [extract_key_facts(t) for t in templates]
    now = time.time()

    def record(i: int) -> Record:
        vec, qvec = unit_vectors(rng, 2, dim)
        t = i % len(templates)
        intent = INTENTS[i % len(INTENTS)]
        question = f"question {i}: " + templates[(t + 1) % 64][:48]
        tags = RecordTags(
            intent=intent,
            entities=Entities(places=frozenset({"杭州"}), numbers=(NumericConstraint("budget", 5000.0, "CNY", "<="),)),
            question=NormalText(question),
            previous_reply=templates[(t + 2) % 64][:160],
            turn=1 + i % 5,
            question_raw=question,
            history=f"h-{i // 5:024x}",
        )
        return Record(
            cache_id="sc-" + uuid.uuid4().hex[:20],
            tenant=f"t-{i % 50:024x}",
            user=None,
            scope="tenant",
            session=f"d-{i // 5:024x}",
            namespace="",
            context_fingerprint=uuid.uuid4().hex,
            intent=intent,
            coarse_tags=tags,
            vector=vec.tobytes(),
            qvector=qvec.tobytes(),
            answer_text=templates[t],
            key_facts=facts[t],
            model="qwen2.5-7b-instruct",
            system_prompt_version=f"{i % 7:016x}",
            policy_version="2024-06-seed-1",
            request_hash=uuid.uuid4().hex,
            state="ready",
            created_at=now - i,
            ready_at=now - i,
            expires_at=now + 86400,
            prompt_tokens=420,
            completion_tokens=260,
        )

    return record


def search_ms(index: HnswIndex, rng: np.random.Generator, want: Want | None) -> float:
    queries = unit_vectors(rng, 200, index.dim)
    t = time.perf_counter()
    for q in queries:
        index.search(q, 8, want=want)
    return (time.perf_counter() - t) / len(queries) * 1000


async def measure(n: int, dim: int, chars: int, lang: str, directory: Path) -> Result:
    record = make_records(n, dim, chars, lang)
    path = directory / "cache.sqlite3"
    store = await SqliteStore.open(path)
    t = time.perf_counter()
    for i in range(n):
        await store.insert(record(i))
    insert_s = time.perf_counter() - t
    await store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db_bytes = path.stat().st_size
    del record
    release_heap()
    rss_before = rss_bytes()
    cache = SemanticCache(store, HnswIndex(dim), ready_after=0.0, top_k=8)
    t = time.perf_counter()
    loaded = await cache.load()
    load_s = time.perf_counter() - t
    assert loaded == n
    rss_after_load = rss_bytes()
    release_heap()
    rss_steady = rss_bytes()
    index_file = directory / "index.hnsw"
    t = time.perf_counter()
    cache.index.save(index_file, stamp="bench")
    save_keys(keys_path(index_file), cache.keys, stamp="bench")
    snapshot_save_s = time.perf_counter() - t
    # the start of the next process: the saved graph and keys, levelled with SQLite, instead of a rebuild
    t = time.perf_counter()
    snapshot, saved = (
        HnswIndex.from_snapshot(index_file, dim=dim, stamp="bench"),
        load_keys(keys_path(index_file), stamp="bench"),
    )
    restarted = SemanticCache(store, HnswIndex(dim), ready_after=0.0, top_k=8)
    assert await restarted.load(snapshot=snapshot, saved_keys=saved) == n
    assert restarted.index.labels() == cache.index.labels() and restarted.keys == cache.keys
    snapshot_load_s = time.perf_counter() - t
    del restarted, snapshot, saved
    release_heap()
    rng = np.random.default_rng(11)
    tenant = "t-" + f"{3:024x}"
    ms_any = search_ms(cache.index, rng, None)
    ms_tenant = search_ms(cache.index, rng, Want(tenant, None, "qwen2.5-7b-instruct", "", f"{3:016x}", "tenant"))
    answer_bytes = await store.answer_bytes()
    lifecycle = Lifecycle(cache, Metrics(), HitJudge(window=60.0), Capacity(n + 1, 1 << 40))
    t = time.perf_counter()
    await lifecycle.tick()
    tick_idle = (time.perf_counter() - t) * 1000
    lifecycle.capacity = Capacity(n - 1, 1 << 40)  # one over: evicts down to the low-water mark
    t = time.perf_counter()
    evicted = (await lifecycle.tick())["evicted"]
    tick_evict = (time.perf_counter() - t) * 1000
    assert evicted == n - lifecycle.capacity.targets()[0]
    await store.close()
    return Result(
        n,
        insert_s,
        db_bytes,
        rss_before,
        rss_after_load,
        rss_steady,
        index_file.stat().st_size,
        load_s,
        snapshot_save_s,
        snapshot_load_s,
        ms_any,
        ms_tenant,
        tick_idle,
        tick_evict,
        answer_bytes,
    )


def report(r: Result, chars: int, lang: str) -> str:
    scale = PER / r.records
    mib = 1024 * 1024
    held = r.rss_steady - r.rss_before
    rows = [
        ("records inserted", f"{r.records:,} ({lang} answers of {chars} chars, {r.answer_bytes / r.records:,.0f} B)"),
        ("insert rate (one commit each)", f"{r.records / r.insert_s:,.0f} records/s"),
        ("disk: SQLite file", f"{r.db_bytes / mib:,.1f} MiB  = {r.db_bytes / r.records:,.0f} B/record"),
        ("disk per 100k records", f"{r.db_bytes * scale / mib:,.0f} MiB"),
        ("memory: RSS held after load()", f"{held / mib:,.1f} MiB  = {held / r.records:,.0f} B/record"),
        (
            "memory per 100k records",
            f"{held * scale / mib:,.0f} MiB  (peak during load "
            f"+{(r.rss_after_load - r.rss_before) * scale / mib:,.0f} MiB)",
        ),
        (
            "  of which the index (its snapshot file)",
            f"{r.index_file_bytes * scale / mib:,.0f} MiB per 100k = {r.index_file_bytes / r.records:,.0f} B/record",
        ),
        ("load() rebuilding the index (start without a snapshot)", f"{r.load_s:,.1f} s"),
        (
            "start from the shutdown snapshot and keys (load + level with SQLite)",
            f"{r.snapshot_load_s:,.1f} s  (saving both: {r.snapshot_save_s:,.1f} s)",
        ),
        ("top-8 search, no filter (every partition: no lookup does this)", f"{r.search_ms_any:.2f} ms"),
        ("top-8 search, one tenant of 50 (one version of 7)", f"{r.search_ms_tenant:.2f} ms"),
        ("lifecycle tick, nothing to evict", f"{r.tick_ms_idle:,.0f} ms"),
        ("lifecycle tick, evicting 5 % (low water)", f"{r.tick_ms_evict:,.0f} ms"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=PER)
    parser.add_argument("--dim", type=int, default=384, help="embedding dimension (e5-small: 384)")
    parser.add_argument("--answer-chars", type=int, default=800)
    parser.add_argument("--lang", choices=("en", "zh"), default="en", help="zh: 3 UTF-8 bytes per character")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the database (default: a temp dir)")
    parser.add_argument("--tenants", type=int, default=None, help="the scale mode: bulk-loaded records of this many")
    parser.add_argument("--zipf", type=float, default=0.0, help="scale mode: tenant sizes ~ 1/rank^s (0: even)")
    parser.add_argument("--old-max", type=int, default=200_000, help="scale mode: walk the old graph up to this size")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument(
        "--old-queries", type=int, default=300, help="scale mode: of those, how many walk the old graph"
    )
    parser.add_argument("--json", type=Path, default=None, help="scale mode: also write the figures here")
    args = parser.parse_args()
    if args.tenants is not None:
        from bench_store_scale import run_scale

        run_scale(args)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = asyncio.run(measure(args.records, args.dim, args.answer_chars, args.lang, Path(tmp)))
    print(report(result, args.answer_chars, args.lang))


if __name__ == "__main__":
    main()
