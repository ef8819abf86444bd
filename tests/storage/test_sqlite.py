"""The RecordStore contract on the embedded SQLite store, a real file per test."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from proxy.core.lru import LruDict
from proxy.core.model import Record, RecordState, SessionLast
from proxy.storage.base import Selector
from proxy.storage.recent import RecentRecords
from proxy.storage.sqlite import SqliteStore, StoreMismatch
from tests.factories import unit_vector
from tests.storage.contract import RecordStoreContract, make_label, make_record


class TestSqliteStore(RecordStoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SqliteStore]:
        store = await SqliteStore.open(tmp_path / "cache.sqlite3")
        yield store
        await store.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = await SqliteStore.open(tmp_path / "cache.sqlite3")
    yield store
    await store.close()


class TestOneHopWrites:
    """An answer, a hit's count, a session's last answer and a thumb are each written as one hop
    of the connection's thread, statements and commit together (SqliteStore._at_once)."""

    async def test_a_write_waits_for_a_write_of_several_hops_and_is_not_part_of_it(self, store: SqliteStore) -> None:
        label = await store.insert(make_record(1))
        async with store._writing():
            # an open transaction of several hops: a one-hop write's commit must not end it
            await store._db.execute("UPDATE records SET hit_count = 41 WHERE label = ?", (label,))
            last = asyncio.create_task(store.set_session_last("t", "s", SessionLast("sc-x", False, "h")))
            await asyncio.sleep(0.05)
            assert not last.done()
            await store._db.rollback()  # as a failed write of several hops would
        await asyncio.wait_for(last, 5)
        (record,) = await store.get_many([label])
        assert record.hit_count == 0  # the rolled-back update stayed rolled back
        assert (await store.session_last("t", "s")) is not None

    async def test_each_write_is_on_disk_when_it_returns(self, store: SqliteStore, tmp_path: Path) -> None:
        record = make_record(2)
        label = await store.insert(record)
        await store.record_served(record.cache_id, 123.0, "t", "s", SessionLast(record.cache_id, True, "h"))
        assert await store.add_feedback(record.cache_id, -0.25) is not None
        # another connection sees only what was committed
        with sqlite3.connect(tmp_path / "cache.sqlite3") as other:
            row = other.execute(
                "SELECT hit_count, last_hit_at, feedback_score FROM records WHERE label = ?", (label,)
            ).fetchone()
            served = other.execute("SELECT served FROM session_last WHERE tenant = 't' AND session = 's'").fetchone()
        assert row[0] == 1 and row[1] == 123.0 and row[2] < record.feedback_score
        assert served == (1,)


class TestSessionLastsInMemory:
    """A session's last answer is read from the file once; what the store writes or reads it then
    answers from memory, the same as the file holds (SqliteStore.session_last)."""

    @staticmethod
    def file_row(tmp_path: Path, session: str) -> SessionLast | None:
        with sqlite3.connect(tmp_path / "cache.sqlite3") as other:
            row = other.execute(
                "SELECT cache_id, served, request_hash, at FROM session_last WHERE tenant = 't' AND session = ?",
                (session,),
            ).fetchone()
        return None if row is None else SessionLast(str(row[0]), bool(row[1]), str(row[2]), float(row[3]))

    @staticmethod
    def no_reads(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        async def refused(*_: object) -> None:
            raise AssertionError("read the file")

        monkeypatch.setattr(store._db, "execute_fetchall", refused)

    async def test_what_the_store_wrote_is_answered_from_memory_as_the_file_holds_it(
        self, store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        record = make_record(3)
        await store.insert(record)
        await store.set_session_last("t", "a", SessionLast("sc-a", False, "ha"))
        await store.record_served(record.cache_id, 50.0, "t", "b", SessionLast(record.cache_id, True, "hb", at=50.0))
        self.no_reads(store, monkeypatch)
        for session in ("a", "b"):
            assert await store.session_last("t", session) == self.file_row(tmp_path, session)
        assert (await store.session_last("t", "b")) == SessionLast(record.cache_id, True, "hb", 50.0)

    async def test_a_session_not_met_is_read_from_the_file_once(
        self, store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with sqlite3.connect(tmp_path / "cache.sqlite3") as other:  # as a store of an earlier run left it
            other.execute("INSERT INTO session_last VALUES ('t', 'old', 'sc-old', 1, 'h-old', 10.0)")
        assert await store.session_last("t", "old") == SessionLast("sc-old", True, "h-old", 10.0)
        assert await store.session_last("t", "new") is None
        self.no_reads(store, monkeypatch)
        assert await store.session_last("t", "old") == SessionLast("sc-old", True, "h-old", 10.0)
        assert await store.session_last("t", "new") is None  # none yet is known too
        await store.set_session_last("t", "new", SessionLast("sc-n", False, "h-n", at=20.0))
        assert await store.session_last("t", "new") == SessionLast("sc-n", False, "h-n", 20.0)

    async def test_a_purge_forgets_in_memory_what_it_deletes_from_the_file(self, store: SqliteStore) -> None:
        await store.set_session_last("t", "early", SessionLast("sc-e", False, "h", at=100.0))
        await store.set_session_last("t", "late", SessionLast("sc-l", False, "h", at=200.0))
        assert await store.purge_session_last(150.0) == 1
        assert await store.session_last("t", "early") is None
        assert await store.session_last("t", "late") == SessionLast("sc-l", False, "h", 200.0)

    async def test_sessions_past_the_bound_are_read_from_the_file_again(self, store: SqliteStore) -> None:
        store._lasts = LruDict(3)
        for i in range(6):
            await store.set_session_last("t", f"s{i}", SessionLast(f"sc-{i}", False, "h", at=float(i + 1)))
        assert len(store._lasts) == 3
        for i in range(6):  # the three oldest from the file, the rest from memory: all alike
            assert await store.session_last("t", f"s{i}") == SessionLast(f"sc-{i}", False, "h", float(i + 1))
        assert len(store._lasts) == 3

    async def test_a_write_landing_during_a_file_read_is_what_the_read_returns(
        self, store: SqliteStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        fetch, release = store._db.execute_fetchall, asyncio.Event()

        async def slow_fetch(*args: object) -> object:
            rows = await fetch(*args)  # no row yet
            await release.wait()
            return rows

        monkeypatch.setattr(store._db, "execute_fetchall", slow_fetch)
        read = asyncio.create_task(store.session_last("t", "race"))
        await asyncio.sleep(0.05)
        await store.set_session_last("t", "race", SessionLast("sc-r", False, "h", at=5.0))
        release.set()
        assert await read == SessionLast("sc-r", False, "h", 5.0)  # not the row it read before the write
        assert await store.session_last("t", "race") == SessionLast("sc-r", False, "h", 5.0)


class TestRecentRecordsInMemory:
    """Records a lookup read are answered from memory the next time, and never older than the file
    once a change of them has returned (proxy.storage.recent)."""

    @staticmethod
    async def fresh_read(tmp_path: Path, labels: list[int]) -> list[Record]:
        other = await SqliteStore.open(tmp_path / "cache.sqlite3")
        try:
            return await other.find(Selector(labels=tuple(labels), states=None))
        finally:
            await other.close()

    async def test_a_second_read_of_the_same_records_needs_no_file_and_reads_alike(
        self, store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        labels = [await store.insert(make_record(i)) for i in range(5)]
        first = await store.get_many(labels[:3])
        assert first == await self.fresh_read(tmp_path, labels[:3])
        TestSessionLastsInMemory.no_reads(store, monkeypatch)
        assert await store.get_many(labels[:3]) == first
        assert [r.label for r in first] == sorted(labels[:3], reverse=True)

    async def test_what_a_change_returned_is_what_the_next_read_sees(self, store: SqliteStore, tmp_path: Path) -> None:
        labels = [await store.insert(make_record(i)) for i in range(4)]
        await store.get_many(labels)  # all four kept
        (ref,) = await store.set_state(Selector(labels=(labels[0],)), RecordState.INVALID)
        assert ref.label == labels[0]
        assert await store.add_feedback("sc-0001", -0.5) == pytest.approx(0.5)
        assert [r.label for r in await store.delete(Selector(labels=(labels[2],)))] == [labels[2]]
        now = {r.label: r for r in await store.get_many(labels)}
        assert now[labels[0]].state == "invalid" and now[labels[1]].feedback_score == pytest.approx(0.5)
        assert labels[2] not in now and now[labels[3]].state == "ready"
        assert sorted(now.values(), key=lambda r: -(r.label or 0)) == await self.fresh_read(tmp_path, labels)

    async def test_a_read_under_way_when_a_change_begins_keeps_nothing(
        self, store: SqliteStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        label = await store.insert(make_record(7))
        store._recent.forget([label])  # as after a restart: the next read goes to the file
        fetch, release = store._db.execute_fetchall, asyncio.Event()

        async def slow_fetch(*args: object) -> object:
            rows = await fetch(*args)  # the record still ready
            await release.wait()
            return rows

        monkeypatch.setattr(store._db, "execute_fetchall", slow_fetch)
        read = asyncio.create_task(store.get_many([label]))
        await asyncio.sleep(0.05)
        await store.set_state(Selector(labels=(label,)), RecordState.INVALID)
        release.set()
        assert [r.state for r in await read] == ["ready"]  # it read before the change
        monkeypatch.setattr(store._db, "execute_fetchall", fetch)
        assert [r.state for r in await store.get_many([label])] == ["invalid"]  # not kept: read again

    async def test_a_record_just_written_is_read_from_memory_as_the_file_holds_it(
        self, store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        labels = [await store.insert(make_record(i)) for i in range(3)]
        on_file = await self.fresh_read(tmp_path, labels)
        TestSessionLastsInMemory.no_reads(store, monkeypatch)
        assert await store.get_many(labels) == on_file

    async def test_an_insert_overtaken_by_a_change_keeps_nothing(
        self, store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # a retirement of the session sent while the insert was off the loop may reach the new row
        run, release = store._on_thread, asyncio.Event()

        async def slow(write: Any) -> Any:
            out = await run(write)
            await release.wait()
            return out

        monkeypatch.setattr(store, "_on_thread", slow)
        insert = asyncio.create_task(store.insert(make_record(9)))
        await asyncio.sleep(0.05)
        store._recent.changing()
        release.set()
        label = await insert
        monkeypatch.setattr(store, "_on_thread", run)
        assert store._recent.take([label]) == ([], [label])
        assert await store.get_many([label]) == await self.fresh_read(tmp_path, [label])

    async def test_a_hit_count_keeps_the_record(self, store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        label = await store.insert(make_record(8))
        (before,) = await store.get_many([label])
        await store.record_served(before.cache_id, 99.0, "t", "s", SessionLast(before.cache_id, True, "h"))
        TestSessionLastsInMemory.no_reads(store, monkeypatch)
        assert await store.get_many([label]) == [before]  # its count lags in memory; no lookup reads it

    async def test_the_memory_is_bounded(self, store: SqliteStore, tmp_path: Path) -> None:
        store._recent = RecentRecords(3)
        labels = [await store.insert(make_record(i)) for i in range(6)]
        for label in labels:
            await store.get_many([label])
        assert len(store._recent) == 3
        assert await store.get_many(labels) == await self.fresh_read(tmp_path, labels)


# The store is stamped with the embedding model of its vectors and refuses another.
def record_of_dim(dim: int) -> Record:
    vec = unit_vector(dim)
    return make_record(vector=vec, qvector=vec)


async def test_store_is_stamped_and_refuses_another_model(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    store = await SqliteStore.open(path)
    await store.claim_embedding("model-a", 4)
    await store.claim_embedding("model-b", 8)  # empty: re-stamped, nothing to compare
    await store.insert(record_of_dim(dim=8))
    await store.claim_embedding("model-b", 8)
    for model, dim in (("model-a", 8), ("model-b", 4)):
        with pytest.raises(StoreMismatch) as err:
            await store.claim_embedding(model, dim)
        assert "model-b dim=8" in str(err.value) and "data_dir" in str(err.value)
    await store.close()


async def test_a_store_from_before_the_stamp_is_adopted_only_by_the_model_it_was_written_with(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    store = await SqliteStore.open(path)
    await store.insert(record_of_dim(dim=384))  # written by a version that stamped nothing
    with pytest.raises(StoreMismatch, match="an unrecorded model"):
        await store.claim_embedding("use-multilingual", 512)
    await store.claim_embedding("e5-small-multilingual", 384)  # the default of those versions
    with pytest.raises(StoreMismatch, match="e5-small-multilingual dim=384"):
        await store.claim_embedding("use-multilingual", 512)
    await store.close()


# The judge's refusals are rows of the file: a restart keeps them, an older file gains their table.
async def test_a_refusal_survives_reopening_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    store = await SqliteStore.open(path)
    record = make_record(1)
    await store.insert(record)
    await store.refuse("t1", "w1", [record.cache_id], 1.0)
    await store.close()
    store = await SqliteStore.open(path)
    assert await store.refused("t1", "w1") == {record.cache_id}
    assert await store.refused("t2", "w1") == frozenset()
    await store.delete(Selector(cache_ids=(record.cache_id,)))
    await store.close()
    store = await SqliteStore.open(path)
    assert await store.refused("t1", "w1") == frozenset()
    await store.close()


async def test_a_file_written_before_refusals_gains_them_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    store = await SqliteStore.open(path)
    record = make_record(1)
    await store.insert(record)
    await store.close()
    with sqlite3.connect(path) as conn:  # as an older version left it: no table, no triggers
        conn.executescript("DROP TRIGGER refusals_of_deleted; DROP TRIGGER refusals_of_retired; DROP TABLE refusals;")
    store = await SqliteStore.open(path)
    assert await store.refused("t1", "w1") == frozenset()
    await store.refuse("t1", "w1", [record.cache_id], 1.0)
    assert await store.refused("t1", "w1") == {record.cache_id}
    await store.set_state(Selector(cache_ids=(record.cache_id,)), RecordState.INVALID)
    assert await store.refused("t1", "w1") == frozenset()
    await store.close()


# The learned levels' labels too: a restart keeps them, an older file gains their table.
async def test_labels_survive_reopening_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    store = await SqliteStore.open(path)
    labels = [make_label(n) for n in range(4)]
    await store.add_labels("t1", labels)
    await store.close()
    store = await SqliteStore.open(path)
    assert await store.labels("t1", "general") == labels
    assert await store.labels("t2", "general") == []
    await store.close()


async def test_a_file_written_before_labels_gains_them_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    store = await SqliteStore.open(path)
    await store.close()
    with sqlite3.connect(path) as conn:  # as an older version left it
        conn.executescript("DROP TABLE labels;")
    store = await SqliteStore.open(path)
    assert await store.labels("t1", "general") == []
    await store.add_labels("t1", [make_label(1)])
    assert await store.labels("t1", "general") == [make_label(1)]
    await store.close()


async def test_a_refusal_is_known_before_its_write_returns(store: SqliteStore) -> None:
    """The wording's next request may come while the write is on the connection's thread."""
    record = make_record(1)
    await store.insert(record)
    assert await store.refused("t1", "w1") == frozenset()
    writing = asyncio.ensure_future(store.refuse("t1", "w1", [record.cache_id], 1.0))
    await asyncio.sleep(0)
    assert not writing.done() and await store.refused("t1", "w1") == {record.cache_id}
    await writing
