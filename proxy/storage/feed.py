"""The change feed: keeps this replica's vector index level with a store that other replicas write
to, by applying the store's append-only stream of events (insert, state change, delete).

The index is only where candidates come from; every candidate is read back from the store and
checked (state, expiry, scope) before it is served, so a feed running behind costs recall for
a moment, never a wrong answer. Events of this replica's own writes come back too and are no-ops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from proxy.storage.base import IndexKey, IndexRow, StoreUnavailable
from proxy.storage.redis_codec import LIVE, Changes, Event, StreamPosition

log = structlog.get_logger("smartcache")


class SharedStore(Protocol):
    """What the feed asks of a store shared by replicas."""

    async def store_id(self) -> str: ...
    async def stream_position(self) -> StreamPosition: ...
    async def changes(self, after: StreamPosition, *, block_ms: int = 1000, count: int = 1000) -> Changes: ...
    async def index_rows(self, labels: Sequence[int], *, vectors: bool = True) -> list[IndexRow]: ...


class LocalIndex(Protocol):
    """What the feed changes: the replica's index and its label mirror (SemanticCache)."""

    @property
    def keys(self) -> dict[int, IndexKey]: ...
    async def adopt(self, rows: Sequence[IndexRow]) -> int: ...
    def forget(self, labels: list[int]) -> None: ...
    async def load(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Applied:
    added: int
    forgotten: int
    rebuilt: bool = False


def last_word(events: Sequence[Event]) -> dict[int, bool]:
    """Whether each label ends up live: its last event decides (a state or a delete after an insert
    takes it out; a later insert or a revival puts it back)."""
    out: dict[int, bool] = {}
    for e in events:
        out[e.label] = e.op != "delete" and e.state in LIVE
    return out


class ChangeFeed:
    """Reads the stream from ``position`` on and applies it; ``run`` does so until cancelled,
    riding out store outages, and rebuilds the index from the records when it fell behind a
    trimmed stream or the store was replaced by an empty one (labels then restart)."""

    def __init__(self, store: SharedStore, index: LocalIndex, *, block_ms: int = 500, retry_s: float = 0.5) -> None:
        self.store, self.index = store, index
        self.block_ms, self.retry_s = block_ms, retry_s
        self.position = StreamPosition("0-0", 0)
        self.store_id = ""
        self.rebuilds = 0

    async def start(self) -> None:
        """Mark where the stream stands: call before the index reads the records, so nothing
        written meanwhile is missed (what is read twice is applied twice, harmlessly)."""
        self.store_id = await self.store.store_id()
        self.position = await self.store.stream_position()

    async def poll(self) -> Applied:
        changes = await self.store.changes(self.position, block_ms=self.block_ms)
        if changes.trimmed:
            return await self.rebuild("stream_trimmed")
        applied = await self.apply(changes.events)
        self.position = changes.position
        return applied

    async def apply(self, events: Sequence[Event]) -> Applied:
        final = last_word(events)
        gone = [label for label, live in final.items() if not live and label in self.index.keys]
        wanted = [label for label, live in final.items() if live and label not in self.index.keys]
        self.index.forget(gone)
        added = await self.index.adopt(await self.store.index_rows(wanted)) if wanted else 0
        return Applied(added, len(gone))

    async def rebuild(self, why: str) -> Applied:
        log.warning("feed.rebuild", reason=why)
        await self.start()
        await self.index.load()
        self.rebuilds += 1
        return Applied(0, 0, rebuilt=True)

    async def run(self) -> None:
        down = False
        while True:
            try:
                if down and await self.store.store_id() != self.store_id:
                    await self.rebuild("store_replaced")
                down = False
                await self.poll()
            except StoreUnavailable as exc:
                if not down:
                    log.warning("feed.store_unavailable", error=str(exc)[:200])
                down = True
                await asyncio.sleep(self.retry_s)
            except Exception:  # the feed must outlive any one bad event
                log.exception("feed.apply_failed")
                await asyncio.sleep(self.retry_s)
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # redis-py 8 can absorb a cancellation
                raise asyncio.CancelledError
