"""The RecordStore contract on the Redis store, against a real redis-server on loopback, plus
what only a shared store has: the change stream replicas apply, and an outage seen as
``StoreUnavailable``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.core.model import RecordState
from proxy.observability.metrics import Metrics
from proxy.service.compose import report_vector_search
from proxy.settings import Settings
from proxy.storage.base import IndexKey, IndexRow, Selector, StoreUnavailable
from proxy.storage.feed import ChangeFeed, lag
from proxy.storage.redis import RedisStore
from proxy.storage.redis_probe import VectorSearch
from tests.storage.contract import RecordStoreContract, make_label, put
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


async def test_a_refusal_is_every_replicas_and_leaves_nothing_behind_its_record(redis_url: str) -> None:
    a, b = await RedisStore.open(redis_url), await RedisStore.open(redis_url)
    r, other = await put(a, 1), await put(a, 2)
    await a.refuse("t1", "w1", [r.cache_id, other.cache_id], 0.0)
    assert await b.refused("t1", "w1") == {r.cache_id, other.cache_id}
    assert await b.refused("t2", "w1") == frozenset()
    raw = a._r
    # the refusals expire with the records they name: the tenant's with the longest-lived
    expiry = {x.label: await raw.pexpiretime(f"sc:r:{x.label}") for x in (r, other)}
    assert await raw.pexpiretime("sc:no:t1") == max(expiry.values()) > 0
    assert all([await raw.pexpiretime(f"sc:nor:{label}") == at for label, at in expiry.items()])
    await b.set_state(Selector(cache_ids=(r.cache_id,)), RecordState.INVALID)
    assert await a.refused("t1", "w1") == {other.cache_id}
    await b.delete(Selector(cache_ids=(other.cache_id,)))
    assert await a.refused("t1", "w1") == frozenset()
    assert await raw.exists("sc:no:t1", f"sc:nor:{r.label}", f"sc:nor:{other.label}") == 0
    await a.close()
    await b.close()


async def test_labels_are_every_replicas(redis_url: str) -> None:
    a, b = await RedisStore.open(redis_url), await RedisStore.open(redis_url)
    await a.add_labels("t1", [make_label(1), make_label(2, intent="code")])
    await b.add_labels("t1", [make_label(3)])
    for store in (a, b):
        assert await store.labels("t1", "general") == [make_label(1), make_label(3)]
        assert await store.labels("t1", "code") == [make_label(2, intent="code")]
    # a purge on one replica leaves nothing of the tenant's labels on the server
    await b.delete(Selector(tenant="t1", states=None))
    assert await a.labels("t1", "general") == []
    assert await a._r.keys("sc:lb*") == []
    await a.close()
    await b.close()


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


class Gauges:
    def __init__(self) -> None:
        self.lags: list[tuple[int, float]] = []
        self.rebuilt: list[str] = []

    def feed_lag(self, events: int, seconds: float) -> None:
        self.lags.append((events, seconds))

    def feed_rebuilt(self, reason: str) -> None:
        self.rebuilt.append(reason)


async def test_a_feed_resumed_from_a_saved_position_applies_only_what_it_missed(redis_url: str) -> None:
    store = await RedisStore.open(redis_url)
    mirror, gauges = Mirror(), Gauges()
    first = ChangeFeed(store, mirror, block_ms=10)
    await first.start()
    a = await put(store, 1)
    await first.catch_up()
    saved, store_id = first.position, first.store_id
    # while this replica is away: one record arrives, the one it holds is invalidated
    b = await put(store, 2)
    await store.set_state(Selector(cache_ids=(a.cache_id,)), RecordState.INVALID)
    again = ChangeFeed(store, mirror, block_ms=10, gauges=gauges)
    again.resume(store_id, saved)
    applied = await again.catch_up()
    assert (applied.added, applied.forgotten, applied.rebuilt) == (1, 1, False)
    assert set(mirror.keys) == {b.label} and mirror.loads == 0
    assert again.position == await store.stream_position() and gauges.lags[-1] == (0, 0.0)
    # a saved position the stream was trimmed past: the records are read instead
    store.stream_maxlen = 1
    for n in range(3, 300):
        await put(store, n)
    behind = ChangeFeed(store, mirror, block_ms=10, gauges=gauges)
    behind.resume(store_id, saved)
    assert (await behind.catch_up()).rebuilt and mirror.loads == 1 and gauges.rebuilt == ["stream_trimmed"]
    assert behind.position == await store.stream_position()
    await store.close()


async def test_a_read_says_where_the_stream_head_is(redis_url: str) -> None:
    store = await RedisStore.open(redis_url)
    start = await store.stream_position()
    for n in range(1, 6):
        await put(store, n)
    changes = await store.changes(start, block_ms=0, count=2)
    assert len(changes.events) == 2 and changes.head == await store.stream_position()
    assert lag(changes.position, changes.head)[0] == 3
    await store.close()


async def test_a_replica_indexes_only_the_policy_version_it_serves(redis_url: str) -> None:
    store = await RedisStore.open(redis_url)
    serving = ["p"]
    store.follow_policy(lambda: serving[0])
    mine, theirs = await put(store, 1, policy_version="p"), await put(store, 2, policy_version="p2")
    assert [r.label for r in await store.index_rows([mine.label or 0, theirs.label or 0])] == [mine.label]
    assert [r.label async for r in store.iter_index_rows(vectors=False)] == [mine.label]
    serving[0] = "p2"  # a reload: the feed adopts the new version's records from now on
    assert [r.label for r in await store.index_rows([mine.label or 0, theirs.label or 0])] == [theirs.label]
    await store.close()


async def test_a_policy_version_is_retired_only_once_no_replica_stamps_it(redis_url: str) -> None:
    store = await RedisStore.open(redis_url)
    old, new = store.versions(grace_s=1.0), store.versions()
    assert await old.beat("v1") == [] and await new.beat("v2") == []
    assert await new.beat("v2") == []  # v1 was stamped within the grace: its replica still serves it
    await asyncio.sleep(2.1)  # the server's clock has whole seconds
    assert await old.beat("v2") == ["v1"]
    assert await old.forget("v1") and await old.beat("v2") == []
    await old.beat("v1")  # a v1 replica back before the record sweep: its stamp stops the forget
    await asyncio.sleep(2.1)
    assert await old.beat("v2") == ["v1"]
    await old.beat("v1")
    assert not await old.forget("v1")
    await store.close()


async def test_vector_search_is_detected_on_the_server_not_assumed(redis_url: str) -> None:
    store = await RedisStore.open(redis_url)
    found = await store.vector_search()  # Debian's Redis 7: no query engine
    assert not found.available and "FT.SEARCH" in found.detail
    await store.close()


@pytest.mark.parametrize(
    ("commands", "modules", "available", "detail"),
    [
        ([0, 0], [], False, "no FT.CREATE, FT.SEARCH; modules: none"),
        ([1, 0], [{b"name": b"other", b"ver": 1}], False, "no FT.SEARCH; modules: other 1"),
        ([1, 1], [{b"name": b"search", b"ver": 21005}], True, "commands FT.CREATE, FT.SEARCH (module search 21005)"),
        ([1, 1], [], True, "commands FT.CREATE, FT.SEARCH"),  # Redis 8: the query engine is built in
    ],
)
def test_vector_search_from_the_probe(
    commands: list[int], modules: list[dict[bytes, Any]], available: bool, detail: str
) -> None:
    assert VectorSearch.from_probe(commands, modules) == VectorSearch(available, detail)


@pytest.mark.parametrize("setting", ["auto", "off"])
async def test_the_vector_search_probe_is_reported_at_start_unless_off(redis_url: str, setting: str) -> None:
    store = await RedisStore.open(redis_url)
    metrics = Metrics()
    with capture_logs() as logs:
        await report_vector_search(store, Settings(redis_vector_search=setting), metrics)
    (line,) = [e for e in logs if e["event"] == "store.vector_search"]
    assert line["search"] == "in-process"
    if setting == "off":
        assert line["probed"] is False and "available" not in line
    else:
        assert line["available"] is False and "FT.CREATE" in line["detail"]
        assert "smartcache_store_vector_search 0.0" in metrics.render()[0].decode()
    await store.close()
