"""Background upkeep: pending → ready promotion, expiry, hit-weighted LRU eviction under a
capacity, index compaction, and the gauges that describe the store (seed §4.1, §4.3)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from proxy.cache import SemanticCache
from proxy.chat import HitJudge
from proxy.metrics import Metrics

log = structlog.get_logger("smartcache")
HIT_WEIGHT_SECONDS = 3600.0  # each doubling of hits buys a record about an hour of coldness


@dataclass(frozen=True, slots=True)
class Capacity:
    max_records: int
    max_answer_bytes: int


def coldness(last_use: float, hit_count: int) -> float:
    """Hit-weighted LRU: the last use, pushed forward by log-scaled hit count. Lowest goes first."""
    return last_use + HIT_WEIGHT_SECONDS * math.log2(1 + hit_count)


def pick_evictions(rows: list[tuple[int, str, float, int, int]], max_records: int, max_bytes: int) -> list[int]:
    """Labels to evict, coldest first, until both the record count and the byte budget fit."""
    ordered = sorted(rows, key=lambda r: coldness(r[2], r[3]))
    count, size = len(rows), sum(r[4] for r in rows)
    out = []
    for label, _, _, _, nbytes in ordered:
        if count <= max_records and size <= max_bytes:
            break
        out.append(label)
        count, size = count - 1, size - nbytes
    return out


class Lifecycle:
    def __init__(self, cache: SemanticCache, metrics: Metrics, judge: HitJudge, capacity: Capacity,
                 *, clock: Callable[[], float] = time.time) -> None:
        self.cache, self.metrics, self.judge, self.capacity, self.clock = cache, metrics, judge, capacity, clock

    async def tick(self) -> dict[str, int]:
        now = self.clock()
        promoted = await self.cache.store.promote_due(now)
        for _ in promoted:
            self.metrics.write("ready")
        for _ in range(self.judge.expire(now)):
            self.metrics.hit_judged("accepted")
        expired = await self._drop("state IN ('pending', 'ready') AND expires_at <= ?", (now,), "ttl")
        evicted = await self._evict_capacity(now)
        if self.cache.index.deleted_fraction > 0.3:
            await self.cache.load()
        await self._gauges()
        return {"promoted": len(promoted), "expired": expired, "evicted": evicted}

    async def _drop(self, where: str, params: tuple[object, ...], reason: str) -> int:
        rows = await self.cache.store.select_labels(where, params)
        if rows:
            self.cache.forget([lab for lab, _ in rows])
            await self.cache.store.delete([cid for _, cid in rows])
            self.metrics.eviction(reason, len(rows))
        return len(rows)

    async def _evict_capacity(self, now: float) -> int:
        rows = await self.cache.store.usage_rows()
        labels = pick_evictions(rows, self.capacity.max_records, self.capacity.max_answer_bytes)
        evicted = 0
        for i in range(0, len(labels), 500):
            chunk = labels[i : i + 500]
            marks = ", ".join("?" for _ in chunk)
            evicted += await self._drop(f"label IN ({marks})", tuple(chunk), "capacity")
        # rejected and invalid rows are kept a while for audit, then removed
        await self._drop("state IN ('rejected', 'invalid') AND created_at <= ?", (now - 7 * 86400,), "purge")
        return evicted

    async def _gauges(self) -> None:
        counts: dict[tuple[str, str], int] = {}
        for state, scope, _, n in await self.cache.store.counts():
            counts[(state, scope)] = counts.get((state, scope), 0) + n
        self.metrics.set_records(counts)
        self.metrics.set_index_size(len(self.cache.index))

    async def run(self, interval: float) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("lifecycle.tick_failed")
            await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def running(lifecycle: Lifecycle, interval: float):  # type: ignore[no-untyped-def]
    task = asyncio.create_task(lifecycle.run(interval), name="lifecycle")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
