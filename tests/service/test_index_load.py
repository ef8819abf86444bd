"""The cache's index read from its store: a fresh graph filled in batches, or a saved snapshot
brought level with the store, over a real SQLite store and index."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from proxy.core.model import RecordState
from proxy.service import index_load
from proxy.service.index_load import read_index
from proxy.storage.base import IndexKey, IndexRow, Selector
from proxy.storage.hnsw import HnswIndex
from proxy.storage.sqlite import SqliteStore
from tests.factories import make_record


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = await SqliteStore.open(tmp_path / "cache.sqlite3")
    try:
        yield opened
    finally:
        await opened.close()


def vector(i: int) -> np.ndarray:
    v = np.zeros(4, dtype=np.float32)
    v[i % 4] = 1.0
    return v


async def write(store: SqliteStore, i: int) -> tuple[int, IndexKey]:
    record = make_record(cache_id=f"sc-{i}", vector=vector(i).tobytes(), qvector=vector(i).tobytes())
    label = await store.insert(record)
    return label, IndexKey.of(dataclasses.replace(record, label=label))


def snapshot_of(rows: Sequence[tuple[int, IndexKey]]) -> HnswIndex:
    index = HnswIndex(4)
    labels = [label for label, _ in rows]
    index.add(labels, np.stack([vector(label) for label in labels]), [key for _, key in rows])
    return index


async def test_without_a_snapshot_every_live_record_fills_a_fresh_graph_a_batch_at_a_time(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_load, "LOAD_BATCH", 2)
    rows = [await write(store, i) for i in range(5)]
    await store.set_state(Selector(cache_ids=("sc-0",)), RecordState.INVALID)
    current = HnswIndex(4)
    index, pools = await read_index(store, current)
    live = {label for label, _ in rows[1:]}
    assert index is not current and len(current) == 0
    assert index.labels() == live and set(pools.keys) == live
    assert pools.keys == dict(rows[1:])


async def test_a_stale_snapshot_loses_what_died_and_gains_what_was_written_since(store: SqliteStore) -> None:
    first, dead = await write(store, 0), await write(store, 1)
    snapshot = snapshot_of([first, dead])
    await store.set_state(Selector(cache_ids=("sc-1",)), RecordState.INVALID)
    written = await write(store, 2)
    index, pools = await read_index(store, HnswIndex(4), snapshot=snapshot)
    assert index is snapshot
    assert index.labels() == set(pools.keys) == {first[0], written[0]}


async def test_with_the_saved_keys_the_store_is_asked_only_for_the_keys_not_saved(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved, unsaved = await write(store, 0), await write(store, 1)
    asked: list[list[int]] = []
    index_rows = store.index_rows

    async def spied(labels: Sequence[int], *, vectors: bool = True) -> list[IndexRow]:
        asked.append(list(labels))
        return await index_rows(labels, vectors=vectors)

    monkeypatch.setattr(store, "index_rows", spied)
    index, pools = await read_index(store, HnswIndex(4), snapshot=snapshot_of([saved]), saved_keys=dict([saved]))
    assert asked == [[unsaved[0]]]
    assert pools.keys == dict([saved, unsaved]) and index.labels() == {saved[0], unsaved[0]}


async def test_the_collector_is_left_as_it_was_found(store: SqliteStore) -> None:
    await write(store, 0)
    assert gc.isenabled()
    await read_index(store, HnswIndex(4))
    assert gc.isenabled()
    gc.disable()
    try:
        await read_index(store, HnswIndex(4))
        assert not gc.isenabled()
    finally:
        gc.enable()
