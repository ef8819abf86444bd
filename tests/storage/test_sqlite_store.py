"""The RecordStore contract on the embedded SQLite store, a real file per test."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.model import SessionLast
from proxy.storage.sqlite import SqliteStore
from tests.storage.contract import RecordStoreContract, make_record


class TestSqliteStore(RecordStoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SqliteStore]:
        store = await SqliteStore.open(tmp_path / "cache.sqlite3")
        yield store
        await store.close()


class TestOneHopWrites:
    """An answer, a hit's count, a session's last answer and a thumb are each written as one hop
    of the connection's thread, statements and commit together (SqliteStore._at_once)."""

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SqliteStore]:
        store = await SqliteStore.open(tmp_path / "cache.sqlite3")
        yield store
        await store.close()

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
    answers from memory, the same as the file holds (proxy.storage.lasts)."""

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SqliteStore]:
        store = await SqliteStore.open(tmp_path / "cache.sqlite3")
        yield store
        await store.close()

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
        store._lasts.limit = 3
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
