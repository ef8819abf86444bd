"""The RecordStore contract on the embedded SQLite store, a real file per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.storage.sqlite import SqliteStore
from tests.storage.contract import RecordStoreContract


class TestSqliteStore(RecordStoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SqliteStore]:
        store = await SqliteStore.open(tmp_path / "cache.sqlite3")
        yield store
        await store.close()
