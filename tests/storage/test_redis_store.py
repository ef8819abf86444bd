"""The RecordStore contract on the Redis store, against a real redis-server on loopback, plus
what only a shared store has: the change stream replicas apply, and an outage seen as
``StoreUnavailable``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from proxy.model import RecordState
from proxy.storage.base import IndexKey, IndexRow, Selector, StoreUnavailable
from proxy.storage.feed import ChangeFeed
from proxy.storage.redis import RedisStore
from tests.storage.contract import RecordStoreContract, put
from tests.storage.redis_server import RedisServer, redis_server, redis_url

__all__ = ["redis_server", "redis_url"]


class TestRedisStore(RecordStoreContract):
    @pytest.fixture
    async def store(self, redis_url: str) -> AsyncIterator[RedisStore]:
        store = await RedisStore.open(redis_url)
        yield store
        await store.close()


async def test_replicas_sharing_a_store_share_its_tenant_salt(redis_url: str) -> None:
    a, b = await RedisStore.open(redis_url), await RedisStore.open(redis_url)
    assert await a.tenant_salt("salt-a") == await b.tenant_salt("salt-b") == "salt-a"
    await a.close()
    await b.close()


async def test_every_change_is_an_event_in_order(redis_url: str) -> None:
    store = await RedisStore.open(redis_url)
    start = await store.stream_position()
    a = await put(store, 1, state="pending", ready_at=0.0)
    b = await put(store, 2)
    await store.promote_due(10.0)
    await store.set_state(Selector(cache_ids=(b.cache_id,)), RecordState.INVALID)
    await store.delete(Selector(cache_ids=(b.cache_id,), states=None))
    changes = await store.changes(start, block_ms=10)
    assert [(e.op, e.label, e.state) for e in changes.events] == [
        ("insert", a.label, "pending"),
        ("insert", b.label, "ready"),
        ("state", a.label, "ready"),
        ("state", b.label, "invalid"),
        ("delete", b.label, "invalid"),
    ]
    assert not changes.trimmed and changes.position.id == changes.events[-1].id
    assert changes.position.seq == start.seq + 5
    assert (await store.changes(changes.position, block_ms=10)).events == ()
    await store.close()


async def test_a_reader_behind_a_trimmed_stream_is_told_to_rebuild(redis_url: str) -> None:
    store = await RedisStore.open(redis_url)
    store.stream_maxlen = 1
    start = await store.stream_position()
    for n in range(300):  # approximate trimming drops whole nodes of ~100 entries
        await put(store, n)
    assert (await store.changes(start, block_ms=10)).trimmed
    assert not (await store.changes(await store.stream_position(), block_ms=10)).trimmed
    await store.close()


async def test_an_outage_is_store_unavailable_and_the_store_recovers(redis_server: RedisServer, redis_url: str) -> None:
    store = await RedisStore.open(redis_url, timeout=0.5)
    r = await put(store, 1)
    redis_server.stop()
    with pytest.raises(StoreUnavailable):
        await store.get(r.cache_id)
    with pytest.raises(StoreUnavailable):
        await store.insert(r)
    redis_server.start()  # persistence is off: the restarted server is empty
    assert await store.get(r.cache_id) is None
    await put(store, 2)
    await store.close()


class Mirror:
    """A replica's index as the feed sees it: labels and how often it was rebuilt."""

    def __init__(self) -> None:
        self.keys: dict[int, IndexKey] = {}
        self.loads = 0

    async def adopt(self, rows: Sequence[IndexRow]) -> int:
        self.keys.update((row.label, row.key) for row in rows)
        return len(rows)

    def forget(self, labels: list[int]) -> None:
        for label in labels:
            self.keys.pop(label, None)

    async def load(self) -> int:
        self.loads += 1
        return 0


async def test_the_feed_applies_changes_and_rebuilds_behind_a_trimmed_stream(redis_url: str) -> None:
    store = await RedisStore.open(redis_url)
    mirror = Mirror()
    feed = ChangeFeed(store, mirror, block_ms=10)
    await feed.start()
    a = await put(store, 1)
    b = await put(store, 2, state="pending")
    await store.set_state(Selector(cache_ids=(a.cache_id,)), RecordState.INVALID)
    applied = await feed.poll()
    assert set(mirror.keys) == {b.label} and (applied.added, applied.rebuilt) == (1, False)
    assert mirror.keys[b.label or 0].session == "s1"
    store.stream_maxlen = 1
    for n in range(3, 300):
        await put(store, n)
    assert (await feed.poll()).rebuilt and mirror.loads == 1 and feed.rebuilds == 1
    c = await put(store, 300)
    await feed.poll()
    assert c.label in mirror.keys
    await store.close()
