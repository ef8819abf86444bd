"""Background upkeep: pending → ready promotion, expiry, hit-weighted LRU eviction under a
capacity, index compaction, and the gauges that describe the store."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import structlog

from proxy.core.model import RecordState
from proxy.observability.metrics import Metrics
from proxy.service.cache import SemanticCache
from proxy.service.feedback import HitJudge
from proxy.storage.base import Selector, Usage

log = structlog.get_logger("smartcache")
HIT_WEIGHT_SECONDS = 3600.0  # each doubling of hits buys a record about an hour of coldness
RETAIN_SECONDS = 7 * 86400.0  # rejected/invalid records (audit) and idle sessions' last answers
DEAD_STATES = (RecordState.REJECTED, RecordState.INVALID)


@dataclass(frozen=True, slots=True)
class Capacity:
    """High-water marks. Passing one evicts down to ``LOW_WATER`` of both, so a full cache pays for
    the full-table usage scan once per 5 % of turnover, not on every sweep."""

    max_records: int
    max_answer_bytes: int

    LOW_WATER = 0.95

    def exceeded(self, records: int, answer_bytes: int) -> bool:
        return records > self.max_records or answer_bytes > self.max_answer_bytes

    def targets(self) -> tuple[int, int]:
        return int(self.max_records * self.LOW_WATER), int(self.max_answer_bytes * self.LOW_WATER)


def coldness(last_use: float, hit_count: int) -> float:
    """Hit-weighted LRU: the last use, pushed forward by log-scaled hit count. Lowest goes first."""
    return last_use + HIT_WEIGHT_SECONDS * math.log2(1 + hit_count)


def pick_evictions(rows: Sequence[Usage], max_records: int, max_bytes: int) -> list[int]:
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
    def __init__(
        self,
        cache: SemanticCache,
        metrics: Metrics,
        judge: HitJudge,
        capacity: Capacity,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache, self.metrics, self.judge, self.capacity, self.clock = cache, metrics, judge, capacity, clock

    async def tick(self) -> dict[str, int]:
        now = self.clock()
        promoted = await self.cache.store.promote_due(now)
        for _ in promoted:
            self.metrics.write("ready")
        for _ in range(self.judge.expire(now)):
            self.metrics.hit_judged("accepted")
        expired = await self._drop(Selector(expired_before=now), "ttl")
        evicted = await self._evict_capacity(now)
        if self.cache.index.deleted_fraction > 0.3:
            await self.cache.load()
        await self._gauges()
        return {"promoted": len(promoted), "expired": expired, "evicted": evicted}

    async def _drop(self, selector: Selector, reason: str) -> int:
        dropped = await self.cache.retire(selector, to=None)
        if dropped:
            self.metrics.eviction(reason, len(dropped))
        return len(dropped)

    async def _evict_capacity(self, now: float) -> int:
        pools, labels = self.cache.pools, []
        if self.capacity.exceeded(len(pools.keys), pools.answer_bytes):
            labels = pick_evictions(await self.cache.store.usage(), *self.capacity.targets())
        evicted = await self._drop(Selector(labels=tuple(labels)), "capacity") if labels else 0
        # rejected and invalid records are kept a while for audit, then removed
        await self._drop(Selector(states=DEAD_STATES, created_before=now - RETAIN_SECONDS), "purge")
        await self.cache.store.purge_session_last(now - RETAIN_SECONDS)
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
            stop_if_cancelled()
            await asyncio.sleep(interval)


def stop_if_cancelled() -> None:
    """Raise a cancellation that a client library absorbed: redis-py 8 can return normally from a
    command cancelled mid-flight, and a loop that only ever sleeps and retries would never stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@contextlib.asynccontextmanager
async def running(lifecycle: Lifecycle, interval: float) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(lifecycle.run(interval), name="lifecycle")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
