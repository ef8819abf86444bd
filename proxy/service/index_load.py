"""The cache's index read from its store, the source of truth: every live record's key into the
pools the lookup filters by, and its vector into a fresh graph, or a saved snapshot of the graph
brought level with the store. ``SemanticCache.load`` swaps what this reads in for the index in
service, and replays onto it what was written meanwhile."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping

import numpy as np

from proxy.storage.base import IndexKey, IndexRow, RecordStore
from proxy.storage.mirror import Pools
from proxy.storage.vectors import VectorIndex

__all__ = ["LOAD_BATCH", "read_index"]

LOAD_BATCH = 32768  # records per hop to the index's thread at a rebuild: ~50 MB of float32 in flight


async def read_index(
    store: RecordStore,
    current: VectorIndex,
    *,
    snapshot: VectorIndex | None = None,
    saved_keys: Mapping[int, IndexKey] | None = None,
) -> tuple[VectorIndex, Pools]:
    """The index of the store's live records, and their pools: ``snapshot`` brought level with the
    store (the keys of its records read from ``saved_keys`` where given, the store asked only for
    those written since), else a fresh graph of ``current``'s kind filled from the store."""
    pools = Pools()
    collecting = gc.isenabled()
    # a million keys are read here, none of them in a cycle: the collector would walk the growing
    # heap again and again (a third of the time at 1M records)
    gc.disable()
    try:
        if snapshot is None:
            fresh = current.fresh()
            await _read_live(store, pools, fresh)
            return fresh, pools
        if saved_keys is not None:
            await _read_saved(store, pools, saved_keys)
        else:
            await _read_live(store, pools, None)
        await _level(store, snapshot, pools)
        return snapshot, pools
    finally:
        if collecting:
            gc.enable()


async def _read_live(store: RecordStore, pools: Pools, into: VectorIndex | None) -> None:
    """Every live record's key into ``pools`` and, given an index to fill, its vector into that,
    a batch at a time: a million vectors never sit in memory twice."""
    batch: list[IndexRow] = []
    async for row in store.iter_index_rows(vectors=into is not None):
        pools.add(row.label, row.key)
        if into is not None:
            batch.append(row)
            if len(batch) >= LOAD_BATCH:
                await asyncio.to_thread(_add_rows, into, batch)
                batch = []
    if into is not None and batch:
        await asyncio.to_thread(_add_rows, into, batch)


async def _read_saved(store: RecordStore, pools: Pools, saved: Mapping[int, IndexKey]) -> None:
    """Every live record's key into ``pools``: a label's key never changes, so a saved one is its
    key still; the store is asked only for the labels written since the save."""
    known, unsaved = [], []
    for label in await store.live_labels():
        key = saved.get(label)
        if key is None:
            unsaved.append(label)
        else:
            known.append((label, key))
    pools.add_many(known)
    pools.add_many((row.label, row.key) for row in await store.index_rows(sorted(unsaved), vectors=False))


async def _level(store: RecordStore, snapshot: VectorIndex, pools: Pools) -> None:
    """``snapshot`` holding exactly the records ``pools`` holds. Labels are never reused and a
    record's vector and key never change, so the difference of the label sets is all that can be
    stale."""
    have = snapshot.labels()
    wanted = set(pools.keys)
    await asyncio.to_thread(snapshot.delete, have - wanted)
    rows = await store.vectors_of(sorted(wanted - have))
    if rows:
        matrix = np.frombuffer(b"".join(v for _, v in rows), dtype=np.float32).reshape(len(rows), snapshot.dim)
        labels = [lab for lab, _ in rows]
        await asyncio.to_thread(snapshot.add, labels, matrix, [pools.keys[lab] for lab in labels])


def _add_rows(index: VectorIndex, rows: list[IndexRow]) -> None:
    matrix = np.frombuffer(b"".join(r.vector or b"" for r in rows), dtype=np.float32).reshape(len(rows), index.dim)
    index.add([r.label for r in rows], matrix, [r.key for r in rows])
