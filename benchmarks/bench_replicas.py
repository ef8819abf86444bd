"""The SQLite and Redis record stores side by side: what the store adds to a hit and to a miss,
hit throughput with 1 and 2 replicas, how fast a change made through one replica reaches
the other's index, and what a restarted Redis replica's start costs: reading every record,
levelling its snapshot with the records, or resuming from its checkpoint (the snapshot and the
stream position saved beside it, applying only the events it missed).

The store's share of each request is measured, not the embedding (the same for both stores and
measured in bench_embedding.py): a hit reads the session's last answer, reads the top-k
candidate records and counts the hit; a miss reads the same, then writes the answer and the
session's last answer. Replicas are processes, each with its own connection; SQLite serves one
replica by design (one proxy per data dir), so its 2-replica row is not measured. A redis-server
is started on a free loopback port (Debian's binary, persistence off).

    .venv/bin/python benchmarks/bench_replicas.py [--records 5000] [--seconds 3] [--concurrency 16] [--missed 100]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import numpy as np

from proxy.core.model import KeyFacts, Record, RecordState, RecordTags, SessionLast
from proxy.service.cache import SemanticCache
from proxy.storage.base import IndexKey, IndexRow, RecordStore, Selector
from proxy.storage.feed import ChangeFeed, FeedCheckpoint
from proxy.storage.hnsw import HnswIndex
from proxy.storage.redis import RedisStore
from proxy.storage.sqlite import SqliteStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.storage.redis_server import RedisServer, free_port

DIM, TOP_K = 384, 8


def record(n: int, rng: np.random.Generator) -> Record:
    v = rng.standard_normal(DIM).astype(np.float32)
    blob = (v / np.linalg.norm(v)).tobytes()
    return Record(
        cache_id=f"sc-{n:08d}-{rng.integers(1 << 30)}", tenant=f"t{n % 20}", user=None, scope="session",
        session=f"s{n % 500}", namespace="", context_fingerprint="fp", intent="general",
        coarse_tags=RecordTags(intent="general", turn=1), vector=blob, qvector=blob, answer_text="answer " * 120,
        key_facts=KeyFacts(), model="m", system_prompt_version="v", policy_version="p", request_hash=f"h{n}",
        state="ready", created_at=time.time(), ready_at=time.time(), expires_at=time.time() + 3600,
    )  # fmt: skip


async def open_store(kind: str, where: str) -> RecordStore:
    return await SqliteStore.open(Path(where)) if kind == "sqlite" else await RedisStore.open(where)


async def hit(store: RecordStore, labels: list[int], rng: np.random.Generator) -> None:
    session = f"s{rng.integers(500)}"
    await store.session_last("t1", session)
    found = await store.get_many([int(x) for x in rng.choice(labels, TOP_K)])
    now = time.time()
    await store.record_served(found[0].cache_id, now, "t1", session, SessionLast(found[0].cache_id, True, "h"))


async def miss(store: RecordStore, labels: list[int], rng: np.random.Generator, n: int) -> None:
    session = f"s{rng.integers(500)}"
    await store.session_last("t1", session)
    await store.get_many([int(x) for x in rng.choice(labels, TOP_K)])
    fresh = record(n, rng)
    await store.insert(fresh)
    await store.set_session_last("t1", session, SessionLast(fresh.cache_id, False, "h"))


async def timed(op: Callable[[], Awaitable[None]], rounds: int) -> tuple[float, float]:
    """Median and p99 in ms."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await op()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


async def throughput(kind: str, where: str, labels: list[int], seconds: float, concurrency: int) -> int:
    store = await open_store(kind, where)
    rng = np.random.default_rng()
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await hit(store, labels, rng)
            done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await store.close()
    return done


def _replica(args: tuple[str, str, list[int], float, int]) -> int:
    return asyncio.run(throughput(*args))


class Mirror:
    """A replica's index as the feed sees it: labels only."""

    def __init__(self) -> None:
        self.keys: dict[int, IndexKey] = {}

    async def adopt(self, rows: Sequence[IndexRow]) -> int:
        for row in rows:
            self.keys[row.label] = row.key
        return len(rows)

    def forget(self, labels: list[int]) -> None:
        for label in labels:
            self.keys.pop(label, None)

    async def load(self) -> int:
        return 0


async def propagation(url: str, rounds: int) -> tuple[float, float, float, float]:
    """Median and p99 ms from a write through replica A's store to replica B's index (insert, then
    invalidation), B following the stream with its own connection."""
    a, b = await RedisStore.open(url), await RedisStore.open(url)
    mirror = Mirror()
    feed = ChangeFeed(b, mirror)
    await feed.start()
    task = asyncio.create_task(feed.run())
    rng = np.random.default_rng(7)
    ins, inv = [], []
    for n in range(rounds):
        r = record(10_000_000 + n, rng)
        t0 = time.perf_counter()
        label = await a.insert(r)
        while label not in mirror.keys:
            await asyncio.sleep(0)
        ins.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        await a.set_state(Selector(cache_ids=(r.cache_id,)), RecordState.INVALID)
        while label in mirror.keys:
            await asyncio.sleep(0)
        inv.append((time.perf_counter() - t0) * 1000)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await a.close()
    await b.close()
    ins.sort()
    inv.sort()
    return statistics.median(ins), ins[int(rounds * 0.99) - 1], statistics.median(inv), inv[int(rounds * 0.99) - 1]


async def started(store: RedisStore, index: HnswIndex) -> tuple[SemanticCache, ChangeFeed]:
    cache = SemanticCache(store, index, ready_after=0, top_k=TOP_K)
    return cache, ChangeFeed(store, cache)


async def restart(url: str, missed: int) -> tuple[int, float, float, float]:
    """Live records, and the seconds a replica takes to start when ``missed`` records were written
    while it was away: from the records, from its snapshot levelled with the records, from its
    checkpoint (the start-up paths of proxy.service.compose)."""
    store = await RedisStore.open(url)
    cache, feed = await started(store, HnswIndex(DIM))
    await feed.start()
    await cache.load()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "index.hnsw"
        cache.index.save(path, stamp="bench")  # a clean stop
        FeedCheckpoint(feed.store_id, "p", feed.position, dict(cache.keys)).save(Path(f"{path}.feed"))
        rng = np.random.default_rng(3)
        for n in range(missed):
            await store.insert(record(40_000_000 + n, rng))
        t0 = time.perf_counter()
        fresh, feed = await started(store, HnswIndex(DIM))
        await feed.start()
        live = await fresh.load()
        t1 = time.perf_counter()
        levelled, feed = await started(store, HnswIndex(DIM))
        await feed.start()
        await levelled.load(snapshot=HnswIndex.from_snapshot(path, dim=DIM, stamp="bench"))
        t2 = time.perf_counter()
        saved = FeedCheckpoint.read(Path(f"{path}.feed"))
        snapshot = HnswIndex.from_snapshot(path, dim=DIM, stamp="bench")
        assert saved is not None and snapshot is not None and set(saved.keys) == snapshot.labels()
        resumed, feed = await started(store, snapshot)
        for label, key in saved.keys.items():
            resumed.pools.add(label, key)
        feed.resume(saved.store_id, saved.position)
        await feed.catch_up()
        t3 = time.perf_counter()
    assert set(resumed.keys) == set(levelled.keys) == set(fresh.keys)
    await store.close()
    return live, t1 - t0, t2 - t1, t3 - t2


async def fill(kind: str, where: str, records: int) -> list[int]:
    store = await open_store(kind, where)
    rng = np.random.default_rng(1)
    labels = [await store.insert(record(n, rng)) for n in range(records)]
    await store.close()
    return labels


async def measure(kind: str, where: str, labels: list[int], rounds: int) -> dict[str, tuple[float, float]]:
    store = await open_store(kind, where)
    rng = np.random.default_rng(2)
    counter = iter(range(20_000_000, 30_000_000))
    out = {
        "hit": await timed(lambda: hit(store, labels, rng), rounds),
        "miss": await timed(lambda: miss(store, labels, rng, next(counter)), rounds),
    }
    await store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--missed", type=int, default=100, help="records written while a replica restarts")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(free_port(), Path(tmp))
        server.start()
        try:
            targets = {"sqlite": str(Path(tmp) / "cache.sqlite3"), "redis": server.url}
            print(f"{args.records} records, top-k {TOP_K}, {args.concurrency} concurrent hits per replica")
            print(f"{'store':7} {'hit ms p50/p99':>16} {'miss ms p50/p99':>17} {'hits/s 1 rep':>13} {'2 reps':>8}")
            for kind, where in targets.items():
                labels = asyncio.run(fill(kind, where, args.records))
                lat = asyncio.run(measure(kind, where, labels, args.rounds))
                one = _replica((kind, where, labels, args.seconds, args.concurrency)) / args.seconds
                two = "n/a"
                if kind == "redis":
                    with multiprocessing.get_context("spawn").Pool(2) as pool:
                        both = pool.map(_replica, [(kind, where, labels, args.seconds, args.concurrency)] * 2)
                    two = f"{sum(both) / args.seconds:.0f}"
                (h50, h99), (m50, m99) = lat["hit"], lat["miss"]
                print(f"{kind:7} {h50:7.2f}/{h99:<8.2f} {m50:8.2f}/{m99:<8.2f} {one:13.0f} {two:>8}")
            p = asyncio.run(propagation(server.url, min(args.rounds, 200)))
            print(f"redis: replica A's write to replica B's index: insert {p[0]:.2f}/{p[1]:.2f} ms, "
                  f"invalidation {p[2]:.2f}/{p[3]:.2f} ms (p50/p99)")  # fmt: skip
            live, full, level, resume = asyncio.run(restart(server.url, args.missed))
            print(f"redis: a replica's start with {live} live records, {args.missed} written while it was away: "
                  f"from the records {full:.2f} s, snapshot levelled {level:.2f} s, "
                  f"checkpoint resumed {resume:.2f} s")  # fmt: skip
        finally:
            server.stop()


if __name__ == "__main__":
    main()
