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
