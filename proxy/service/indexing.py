"""The cache's index over its store, from start to a clean stop: loaded from the snapshot beside
the data (with the keys saved at the last stop, or on a shared store resumed by the change feed's
checkpoint), kept level while the proxy runs (policy versions at start and after a reload; on a
shared store the change feed and the versions' beat), and saved with its keys and checkpoint at a
clean stop. ``open_cache`` enters each step into the composition's exit stack, in the order they
must close in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import structlog

from proxy.core.text.normalize import Cutter
from proxy.observability.metrics import Metrics
from proxy.service.cache import SemanticCache
from proxy.service.planner import PolicyBox
from proxy.settings import Settings
from proxy.storage.backends import Store
from proxy.storage.base import IndexKey, Selector, StoreUnavailable
from proxy.storage.feed import ChangeFeed, FeedCheckpoint
from proxy.storage.hnsw import HnswIndex
from proxy.storage.keyfile import keys_path, load_keys, save_keys
from proxy.storage.redis_versions import BEAT_S
from proxy.storage.shared import SharedRecordStore, VersionRegister
from proxy.verify.batching import BatchingVerifier

log = structlog.get_logger("smartcache")


def _snapshot(path: Path, dim: int, stamp: str) -> HnswIndex | None:
    try:
        return HnswIndex.from_snapshot(path, dim=dim, stamp=stamp)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        # a damaged snapshot costs a rebuild from SQLite, never the start
        log.warning("index.snapshot_unusable", path=str(path), error=str(exc))
        return None


def _saved_keys(path: Path, stamp: str) -> dict[int, IndexKey] | None:
    try:
        return load_keys(keys_path(path), stamp=stamp)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # unusable saved keys cost reading every key from the store, never the start
        log.warning("index.saved_keys_unusable", path=str(keys_path(path)), error=str(exc)[:200])
        return None


async def _save_snapshot(cache: SemanticCache, path: Path, stamp: str) -> None:
    try:
        await asyncio.to_thread(cache.index.save, path, stamp=stamp)
    except (OSError, RuntimeError) as exc:
        log.warning("index.snapshot_not_saved", path=str(path), error=str(exc))
    keys = dict(cache.keys)  # copied on the loop: the thread must not read a dict that changes
    try:
        await asyncio.to_thread(save_keys, keys_path(path), keys, stamp=stamp)
    except OSError as exc:
        log.warning("index.keys_not_saved", path=str(keys_path(path)), error=str(exc))


def checkpoint_path(s: Settings) -> Path:
    return Path(f"{s.index_snapshot_path}.feed")


def resume_point(
    s: Settings, snapshot: HnswIndex | None, store_id: str, version: str, *, shared: bool
) -> FeedCheckpoint | None:
    """The checkpoint saved beside ``snapshot`` at the last shutdown, when the index can go on from
    it: a shared store, the same store, the same policy version, and exactly the snapshot's labels
    (a snapshot saved without its checkpoint, or the other way round, is caught here)."""
    if snapshot is None or not shared:
        return None
    saved = FeedCheckpoint.read(checkpoint_path(s))
    if saved is None:
        return None
    why = (
        "another store"
        if saved.store_id != store_id
        else "another policy version"
        if saved.policy_version != version
        else "labels differ from the snapshot's"
        if set(saved.keys) != snapshot.labels()
        else None
    )
    if why is not None:
        log.info("feed.checkpoint_not_used", reason=why)
        return None
    return saved


@contextlib.asynccontextmanager
async def following(
    feed: ChangeFeed | None,
    cache: SemanticCache,
    *,
    snapshot: HnswIndex | None,
    resume: FeedCheckpoint | None,
    saved_keys: dict[int, IndexKey] | None = None,
) -> AsyncIterator[int]:
    """The index loaded (how many records it holds) and, for a store other replicas write to (one
    with a ``feed``), the change feed that keeps it level until the parts close. Resuming (``cache``
    holds the index ``resume`` describes), only the events since are applied; otherwise the feed is
    positioned before the index reads the records, so nothing written meanwhile is missed.

    ``saved_keys`` serve a store this process alone writes: a shared one's live labels include
    records of policy versions this replica does not serve, and it resumes by its checkpoint."""
    if feed is None:
        yield await cache.load(snapshot=snapshot, saved_keys=saved_keys)
        return
    if resume is not None:
        feed.resume(resume.store_id, resume.position)
        applied = await feed.catch_up()
        loaded = len(cache.keys)
        log.info(
            "feed.resumed", records=loaded, added=applied.added, forgotten=applied.forgotten, rebuilt=applied.rebuilt
        )
    else:
        await feed.start()
        loaded = await cache.load(snapshot=snapshot)
    task = asyncio.create_task(feed.run(), name="change-feed")
    try:
        yield loaded
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _save_checkpoint(feed: ChangeFeed, cache: SemanticCache, version: str, path: Path) -> None:
    saved = FeedCheckpoint(feed.store_id, version, feed.position, dict(cache.keys))
    try:
        await asyncio.to_thread(saved.save, path)
    except OSError as exc:
        log.warning("feed.checkpoint_not_saved", path=str(path), error=str(exc))


@contextlib.asynccontextmanager
async def saving_index(
    s: Settings, cache: SemanticCache, stamp: str, feed: ChangeFeed | None, box: PolicyBox
) -> AsyncIterator[None]:
    """At a clean stop, the index snapshot and its keys, then (following a shared store) the feed's
    checkpoint. Entered before what changes the index, so it saves once they have stopped; after a
    failure nothing is saved, since a checkpoint of an index that may not reflect it would be
    trusted at the next start."""
    yield
    await _save_snapshot(cache, s.index_snapshot_path, stamp)
    if feed is not None:
        await _save_checkpoint(feed, cache, box.policy.version, checkpoint_path(s))


async def retire_unserved_versions(versions: VersionRegister, cache: SemanticCache, serving: str) -> int:
    """Stamp ``serving`` as served and retire the records of versions no replica serves any more."""
    retired = 0
    for version in await versions.beat(serving):
        if version == serving:
            continue
        refs = await cache.retire(Selector(policy_version=version))
        await versions.forget(version)
        log.info("cache.policy_version_invalidated", records=len(refs), version=version, served_by="no replica")
        retired += len(refs)
    return retired


async def policy_changed(shared: SharedRecordStore | None, cache: SemanticCache, serving: str) -> int:
    """After a reload to ``serving``: one process per store (``shared`` None) retires every other
    version's records; on a shared store the index is rebuilt with the new version's records (which
    replicas already on it may have written) and only versions no replica serves any more are
    retired, so the replicas still on the old version keep their answers through a rolling deploy."""
    if shared is None:
        return len(await cache.retire(Selector(other_policy_version=serving)))
    await cache.load()
    return await retire_unserved_versions(shared.versions(), cache, serving)


@contextlib.asynccontextmanager
async def keeping_versions(
    shared: SharedRecordStore | None, cache: SemanticCache, box: PolicyBox
) -> AsyncIterator[None]:
    """Policy versions at start and while running. One process per store: a version that changed
    while the proxy was down invalidates as a reload would. A shared store: this replica indexes
    only its own version's records and retires only versions no replica serves
    (proxy.storage.redis_versions)."""
    if shared is None:
        stale = await cache.retire(Selector(other_policy_version=box.policy.version))
        if stale:
            log.info("cache.policy_version_invalidated", records=len(stale), version=box.policy.version)
        yield
        return
    shared.follow_policy(lambda: box.policy.version)
    versions = shared.versions()
    await retire_unserved_versions(versions, cache, box.policy.version)

    async def beat() -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            try:
                await retire_unserved_versions(versions, cache, box.policy.version)
            except StoreUnavailable:
                pass  # the feed says so; the next beat tries again
            except Exception:  # the stamp must outlive any one failure, or the version dies with it
                log.exception("cache.policy_versions_failed")
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # redis-py 8 can absorb a cancellation
                raise asyncio.CancelledError

    task = asyncio.create_task(beat(), name="policy-versions")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def open_cache(
    stack: contextlib.AsyncExitStack,
    s: Settings,
    store: Store,
    *,
    dim: int,
    box: PolicyBox,
    verifier: BatchingVerifier | None,
    metrics: Metrics,
    segmenter: Cutter | None = None,
) -> tuple[SemanticCache, int]:
    """The cache over ``store`` and how many records its index holds: the index from the snapshot
    (resumed by the feed's checkpoint on a shared store), kept level (versions, feed) and saved at
    a clean stop by contexts entered into ``stack``, in the order they must close in reverse."""
    store_id = await store.records.store_id()
    stamp = f"{s.embedding_model} dim={dim} store={store_id}"
    snapshot = await asyncio.to_thread(_snapshot, s.index_snapshot_path, dim, stamp)
    resume = resume_point(s, snapshot, store_id, box.policy.version, shared=store.shared is not None)
    saved = None
    if snapshot is not None and store.shared is None:
        saved = await asyncio.to_thread(_saved_keys, s.index_snapshot_path, stamp)
    index = snapshot if resume is not None and snapshot is not None else HnswIndex(dim)
    cache = SemanticCache(
        store.records, index, ready_after=s.ready_after, top_k=s.top_k, verifier=verifier, segmenter=segmenter
    )
    for label, key in (resume.keys if resume is not None else {}).items():
        cache.pools.add(label, key)
    feed = None if store.shared is None else ChangeFeed(store.shared, cache, gauges=metrics)
    await stack.enter_async_context(saving_index(s, cache, stamp, feed, box))  # after the two below stop
    await stack.enter_async_context(keeping_versions(store.shared, cache, box))
    loaded = await stack.enter_async_context(
        following(feed, cache, snapshot=None if resume else snapshot, resume=resume, saved_keys=saved)
    )
    return cache, loaded
