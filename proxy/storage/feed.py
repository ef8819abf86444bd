"""The change feed: keeps this replica's vector index level with a store that other replicas write
to, by applying the store's append-only stream of events (insert, state change, delete).

The index is only where candidates come from; every candidate is read back from the store and
checked (state, expiry, scope) before it is served, so a feed running behind costs recall for
a moment, never a wrong answer. Events of this replica's own writes come back too and are no-ops.

At shutdown the replica saves, beside its index snapshot, a ``FeedCheckpoint``: the stream
position the index reflects and every indexed label's key. The next start loads both and applies
only the events after that position, instead of reading every record's key from the store; it
reads the records after all when the checkpoint does not match the snapshot, names another store
or policy version, or the stream has been trimmed past it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson
import structlog

from proxy.storage.base import INTERNED_ORDER, IndexKey, IndexRow, StoreUnavailable
from proxy.storage.redis_codec import LIVE, Changes, Event, StreamPosition, id_seconds

log = structlog.get_logger("smartcache")
CHECKPOINT_FORMAT = 1


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


class FeedGauges(Protocol):
    """Where the feed reports how far behind it is (proxy.observability.metrics.Metrics)."""

    def feed_lag(self, events: int, seconds: float) -> None: ...
    def feed_rebuilt(self, reason: str) -> None: ...


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


def lag(position: StreamPosition, head: StreamPosition | None) -> tuple[int, float]:
    """Events the stream holds past ``position``, and how much newer the newest is than the last
    applied (0 when caught up): how stale this replica's index may be."""
    if head is None or head.seq <= position.seq:
        return 0, 0.0
    behind = id_seconds(head.id) - id_seconds(position.id) if position.seq else 0.0
    return head.seq - position.seq, max(0.0, behind)


@dataclass(frozen=True, slots=True)
class FeedCheckpoint:
    """What a replica's index reflected when it stopped: the store, the policy version its records
    were chosen under, the last stream position applied and every indexed label's key (a label's
    key never changes, so keys and labels name the index's whole content)."""

    store_id: str
    policy_version: str
    position: StreamPosition
    keys: dict[int, IndexKey]

    def save(self, path: Path) -> None:
        """Written beside and renamed into place: a crash mid-save leaves the previous one."""
        rows = [[label, *(getattr(k, f) for f in INTERNED_ORDER)] for label, k in self.keys.items()]
        body = {
            "format": CHECKPOINT_FORMAT,
            "store_id": self.store_id,
            "policy_version": self.policy_version,
            "position": [self.position.id, self.position.seq],
            "keys": rows,
        }
        tmp = Path(f"{path}.tmp")
        tmp.write_bytes(orjson.dumps(body))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> FeedCheckpoint | None:
        """The saved checkpoint; None when there is none or it cannot be read (a start that reads
        the records instead)."""
        try:
            body = orjson.loads(path.read_bytes())
            if not isinstance(body, dict) or body.get("format") != CHECKPOINT_FORMAT:
                return None
            keys = {int(r[0]): IndexKey.interned(int(r[1]), *r[2:]) for r in body["keys"] if len(r) == 10}
            position = StreamPosition(str(body["position"][0]), int(body["position"][1]))
            return cls(str(body["store_id"]), str(body["policy_version"]), position, keys)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            if not isinstance(exc, FileNotFoundError):
                log.warning("feed.checkpoint_unusable", path=str(path), error=str(exc)[:200])
            return None


class ChangeFeed:
    """Reads the stream from ``position`` on and applies it; ``run`` does so until cancelled,
    riding out store outages, and rebuilds the index from the records when it fell behind a
    trimmed stream or the store was replaced by an empty one (labels then restart).

    ``position`` only moves once what it names is in the index, so at any moment the index
    reflects at least every event up to it: what a checkpoint needs."""

    def __init__(
        self,
        store: SharedStore,
        index: LocalIndex,
        *,
        block_ms: int = 500,
        retry_s: float = 0.5,
        gauges: FeedGauges | None = None,
    ) -> None:
        self.store, self.index, self.gauges = store, index, gauges
        self.block_ms, self.retry_s = block_ms, retry_s
        self.position = StreamPosition("0-0", 0)
        self.store_id = ""
        self.rebuilds = 0

    async def start(self) -> None:
        """Mark where the stream stands: call before the index reads the records, so nothing
        written meanwhile is missed (what is read twice is applied twice, harmlessly)."""
        self.store_id = await self.store.store_id()
        self.position = await self.store.stream_position()

    def resume(self, store_id: str, position: StreamPosition) -> None:
        """Go on from a saved position, the index being what it was when the position was saved."""
        self.store_id, self.position = store_id, position

    async def poll(self, block_ms: int | None = None) -> Applied:
        wait = self.block_ms if block_ms is None else block_ms
        changes = await self.store.changes(self.position, block_ms=wait)
        if changes.trimmed:
            return await self.rebuild("stream_trimmed")
        applied = await self.apply(changes.events)
        self.position = changes.position
        if self.gauges is not None:
            self.gauges.feed_lag(*lag(self.position, changes.head))
        return applied

    async def catch_up(self) -> Applied:
        """Apply every event already in the stream, without waiting for new ones."""
        added = forgotten = 0
        while True:
            before = self.position
            applied = await self.poll(block_ms=0)
            if applied.rebuilt:
                return applied
            added, forgotten = added + applied.added, forgotten + applied.forgotten
            if self.position == before:
                return Applied(added, forgotten)

    async def apply(self, events: Sequence[Event]) -> Applied:
        final = last_word(events)
        gone = [label for label, live in final.items() if not live and label in self.index.keys]
        wanted = [label for label, live in final.items() if live and label not in self.index.keys]
        self.index.forget(gone)
        added = await self.index.adopt(await self.store.index_rows(wanted)) if wanted else 0
        return Applied(added, len(gone))

    async def rebuild(self, why: str) -> Applied:
        log.warning("feed.rebuild", reason=why)
        t0 = time.perf_counter()
        store_id, position = await self.store.store_id(), await self.store.stream_position()
        await self.index.load()
        self.store_id, self.position = store_id, position  # only now does the index reflect it
        self.rebuilds += 1
        if self.gauges is not None:
            self.gauges.feed_rebuilt(why)
        log.info("feed.rebuilt", reason=why, records=len(self.index.keys), seconds=round(time.perf_counter() - t0, 3))
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
