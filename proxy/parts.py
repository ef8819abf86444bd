"""Composition of the cache's parts, shared by the HTTP app, offline replay and warm-up, so all
three run the very same signer, index, store, policy and decision."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from proxy.cache import SemanticCache
from proxy.embedding.backends import SyncEmbedder
from proxy.embedding.batching import BatchingEmbedder
from proxy.embedding.packs import load_embedder
from proxy.feedback import HitJudge
from proxy.http.chat import ChatService
from proxy.http.race import races
from proxy.observability.metrics import Metrics
from proxy.planner import PolicyBox
from proxy.policy import Policy, check_embedding_model, load_policy
from proxy.settings import DEFAULT_POLICY, Settings
from proxy.settling import Settling
from proxy.signing.intent import IntentClassifier
from proxy.signing.signer import ContextSigner, SignerSettings
from proxy.storage.backends import BACKENDS, Backend, Store
from proxy.storage.backends import open_store as open_backend
from proxy.storage.base import IndexKey, Selector, StoreUnavailable
from proxy.storage.feed import ChangeFeed, FeedCheckpoint
from proxy.storage.hnsw import HnswIndex
from proxy.storage.keyfile import keys_path, load_keys, save_keys
from proxy.storage.redis_versions import BEAT_S
from proxy.storage.shared import SharedRecordStore, VersionRegister
from proxy.text.normalize import default_segmenter
from proxy.upstream.client import Upstream
from proxy.upstream.coalesce import Coalescer
from proxy.upstream.prewarm import Prewarmer
from proxy.verify import Verifier, VerifierError, load_verifier
from proxy.verify.batching import BatchingVerifier

log = structlog.get_logger("smartcache")

NOWHERE = "http://127.0.0.1:9/v1"  # for offline users of the parts (replay, warm): never called


@dataclass
class Parts:
    embedder: BatchingEmbedder
    cache: SemanticCache
    signer: ContextSigner
    policy_box: PolicyBox
    upstream: Upstream
    judge: HitJudge
    chat: ChatService
    loaded: int
    store: Store
    verifier: BatchingVerifier | None = None


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


def load_policy_for(s: Settings) -> Policy:
    policy = load_policy(s.policy_file)
    check_embedding_model(
        policy, s.embedding_model, shipped_fallback=s.policy is None and s.policy_file == DEFAULT_POLICY
    )
    return policy


async def load_backend(s: Settings) -> SyncEmbedder:
    return await asyncio.to_thread(
        load_embedder, s.embedding_model, s.models_root, threads=s.embed_threads or None, auto_install=True
    )


async def open_store(s: Settings, backends: Mapping[str, Backend] = BACKENDS) -> Store:
    """The record store the settings name, from the registry of backends (``backends``: tests may
    add one)."""
    return await open_backend(s.store, s, backends)


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


async def report_vector_search(shared: SharedRecordStore | None, s: Settings, metrics: Metrics) -> None:
    """Say at start whether the shared store could search vectors itself; the search stays here."""
    if shared is None:
        return
    if s.redis_vector_search == "off":
        log.info("store.vector_search", setting="off", probed=False, search="in-process")
        return
    found = await shared.vector_search()
    metrics.store_vector_search(found.available)
    log.info(
        "store.vector_search",
        setting=s.redis_vector_search,
        available=found.available,
        detail=found.detail,
        search="in-process",
    )


def wants_verifier(s: Settings, policy: Policy) -> bool:
    return s.verify and any(
        i.cache and (i.verify_accept is not None or i.verify_previous is not None) for i in policy.intents.values()
    )


async def load_pair_verifier(s: Settings, policy: Policy) -> Verifier:
    """The shipped verifier, its graph built now rather than on the first request; a policy that
    asks for verification and a verifier that cannot load fail the start, as a bad policy does."""
    try:
        verifier = load_verifier(threads=s.verify_threads or None, cache_dir=s.models_root / "models" / "verifier")
        await asyncio.to_thread(verifier.warm)
    except VerifierError as exc:
        raise VerifierError(
            f"{exc}; {policy.source} sets verify_accept or verify_previous: ship the verifier's weights, or set "
            "verify: false (those intents then serve no hits)"
        ) from exc
    return verifier


async def pair_verifier(s: Settings, policy: Policy, given: Verifier | None) -> Verifier | None:
    """The pair verifier the policy asks for: ``given`` or the shipped one; None when none is asked."""
    if not wants_verifier(s, policy):
        return None
    return given or await load_pair_verifier(s, policy)


def batching_verifier(s: Settings, verifier: Verifier) -> BatchingVerifier:
    return BatchingVerifier(
        verifier,
        max_batch=s.verify_max_batch,
        max_pending=s.verify_max_pending,
        timeout_s=s.verify_timeout_ms / 1000 or None,
    )


def batching_embedder(s: Settings, backend: SyncEmbedder) -> BatchingEmbedder:
    return BatchingEmbedder(
        backend,
        max_batch=s.embed_max_batch,
        max_wait_s=s.embed_max_wait_ms / 1000,
        max_pending=s.embed_max_pending,
        timeout_s=s.embed_timeout_ms / 1000,
    )


async def open_cache(
    stack: contextlib.AsyncExitStack,
    s: Settings,
    store: Store,
    *,
    dim: int,
    box: PolicyBox,
    verifier: BatchingVerifier | None,
    metrics: Metrics,
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
    cache = SemanticCache(store.records, index, ready_after=s.ready_after, top_k=s.top_k, verifier=verifier)
    for label, key in (resume.keys if resume is not None else {}).items():
        cache.pools.add(label, key)
    feed = None if store.shared is None else ChangeFeed(store.shared, cache, gauges=metrics)
    await stack.enter_async_context(saving_index(s, cache, stamp, feed, box))  # after the two below stop
    await stack.enter_async_context(keeping_versions(store.shared, cache, box))
    loaded = await stack.enter_async_context(
        following(feed, cache, snapshot=None if resume else snapshot, resume=resume, saved_keys=saved)
    )
    return cache, loaded


@contextlib.asynccontextmanager
async def open_parts(
    s: Settings,
    *,
    upstream_url: str,
    metrics: Metrics,
    backend: SyncEmbedder | None = None,
    policy: Policy | None = None,
    verifier: Verifier | None = None,
    backends: Mapping[str, Backend] = BACKENDS,
) -> AsyncIterator[Parts]:
    """``verifier``: the pair verifier to use instead of loading the shipped one (tests, benchmarks);
    either is used only when an intent of the policy sets verify_accept and ``s.verify`` is on.

    Shutdown is one exit stack: each resource enters it as it opens and they close in reverse, so
    the bookkeeping after replies ends first, the feed and the version beat stop, the index is
    saved, the prewarmer closes before the upstream client it uses, and the store closes last."""
    backend = backend or await load_backend(s)
    policy = policy or load_policy_for(s)
    pair = await pair_verifier(s, policy, verifier)
    async with contextlib.AsyncExitStack() as stack:
        store = await open_store(s, backends)
        stack.push_async_callback(store.records.close)
        await store.records.claim_embedding(s.embedding_model, backend.dim)
        verifying = None if pair is None else batching_verifier(s, pair)
        if verifying is not None:
            stack.push_async_callback(verifying.close)
        embedder = batching_embedder(s, backend)
        stack.push_async_callback(embedder.close)
        upstream = Upstream(upstream_url, timeout=s.upstream_timeout, connect_timeout=s.upstream_connect_timeout)
        stack.push_async_callback(upstream.close)
        prewarmer = Prewarmer(upstream, concurrency=s.prewarm_concurrency)
        stack.push_async_callback(prewarmer.close)  # its tasks use the upstream client
        classifier = await IntentClassifier.build(policy, embedder)
        box = PolicyBox(policy, classifier)
        await report_vector_search(store.shared, s, metrics)
        cache, loaded = await open_cache(stack, s, store, dim=backend.dim, box=box, verifier=verifying, metrics=metrics)
        flavour = s.upstream_flavour if s.upstream else "llamacpp"
        judge = HitJudge(window=max(s.ready_after, 1.0))
        signer = ContextSigner(embedder, classifier, SignerSettings(view_tokens=s.view_tokens))
        # jieba's dictionary and tagger are slow to build: now, off the loop, before the port
        # opens, rather than inside the first request, which every fresh process would pay (the
        # `sign` stage of a fresh proxy's first `chat.request` log line shows the cost)
        await asyncio.to_thread(default_segmenter)
        settling = Settling()
        stack.push_async_callback(settling.close)  # first: answers given are kept before the index is saved
        chat = ChatService(
            cache=cache,
            signer=signer,
            policy_box=box,
            upstream=upstream,
            flavour=flavour,
            # llama.cpp restores a returning conversation from its RAM prompt cache only when it picks
            # the slot itself: pinning id_slot measured 27 % cached vs 83 % (tests/upstream/test_engine.py)
            slot_count=None,
            metrics=metrics,
            judge=judge,
            debug_headers=s.debug_headers,
            regenerate_window=s.regenerate_window,
            coalescer=Coalescer() if s.coalesce else None,
            prewarmer=prewarmer,
            prewarm_all=s.prewarm,
            race=races(s.race_upstream, flavour),
            retry=s.upstream_retry,
            route_min_shared_chars=s.route_related_min_chars,
            settling=settling,
        )
        yield Parts(
            embedder=embedder,
            cache=cache,
            signer=signer,
            policy_box=box,
            upstream=upstream,
            judge=judge,
            chat=chat,
            loaded=loaded,
            store=store,
            verifier=verifying,
        )
