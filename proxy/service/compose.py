"""Composition of the cache's service parts, shared by the HTTP app, offline replay and warm-up,
so all three run the very same signer, index, store, policy, planner and decision. Only service
parts are composed here: the HTTP edge builds its chat handler over them (proxy.http.app), so the
offline tools never load it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import structlog

from proxy.core.policy import Policy, check_embedding_model, load_policy
from proxy.core.text.normalize import Segmenter
from proxy.embedding.backends import SyncEmbedder
from proxy.embedding.batching import BatchingEmbedder
from proxy.embedding.packs import load_embedder
from proxy.observability.metrics import Metrics
from proxy.service.cache import SemanticCache
from proxy.service.feedback import FeedbackReader, HitJudge
from proxy.service.indexing import open_cache
from proxy.service.judging import Judging
from proxy.service.learning import LearnedLevels
from proxy.service.planner import Planner, PolicyBox
from proxy.service.settling import Settling
from proxy.service.writeback import WriteBack
from proxy.settings import DEFAULT_POLICY, Settings
from proxy.signing.intent import IntentClassifier
from proxy.signing.signer import ContextSigner, SignerSettings
from proxy.storage.backends import BACKENDS, Backend, Store, open_store
from proxy.storage.shared import SharedRecordStore
from proxy.upstream.client import Upstream
from proxy.upstream.coalesce import Coalescer
from proxy.upstream.judge import Judge
from proxy.upstream.judge_exam import Qualification
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
    planner: Planner
    write_back: WriteBack
    settling: Settling  # the bookkeeping after a reply: a write-back, a hit's count
    prewarmer: Prewarmer
    coalescer: Coalescer | None  # None: coalescing is off
    loaded: int
    store: Store
    verifier: BatchingVerifier | None = None
    # the model that judges the gray zone, and which models passed its exam; None: judging is off
    judging: Judging | None = None


def load_policy_for(s: Settings) -> Policy:
    policy = load_policy(s.policy_file)
    check_embedding_model(
        policy, s.embedding_model, shipped_fallback=s.policy is None and s.policy_file == DEFAULT_POLICY
    )
    return policy


async def load_backend(s: Settings) -> SyncEmbedder:
    return await asyncio.to_thread(
        load_embedder, s.embedding_model, s.models_root, threads=s.embed_threads or model_threads(), auto_install=True
    )


def model_threads() -> int:
    """Threads for one model's runs when the settings leave it open: half the cores this process
    may use, at least one. ONNX Runtime's own choice, every core for each run, takes them from the
    event loop and the other model under load (bench_domains.py: a miss's overhead over no cache)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // 2)


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
        i.cache
        and (
            i.verify_accept is not None
            or i.verify_previous is not None
            or (s.judge and i.judges and i.judge_verify is not None)  # the verifier ranks what the judge reads
        )
        for i in policy.intents.values()
    )


async def load_pair_verifier(s: Settings, policy: Policy) -> Verifier:
    """The shipped verifier, its graph built now rather than on the first request; a policy that
    asks for verification and a verifier that cannot load fail the start, as a bad policy does."""
    try:
        verifier = load_verifier(
            threads=s.verify_threads or model_threads(), cache_dir=s.models_root / "models" / "verifier"
        )
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


def open_judging(
    stack: contextlib.AsyncExitStack,
    s: Settings,
    upstream: Upstream,
    write_back: WriteBack,
    segmenter: Segmenter | None = None,
) -> Judging | None:
    """The judge over the upstream (or a judge URL of its own), examined before it decides, and the
    levels learned from its verdicts, kept in the record store."""
    if not s.judge:
        return None
    own = upstream
    if s.judge_url is not None:
        own = Upstream(s.judge_url, timeout=s.judge_timeout, connect_timeout=s.upstream_connect_timeout)
        stack.push_async_callback(own.close)
    judge = Judge(own, model=s.judge_model, max_concurrent=s.judge_max_concurrent, timeout=s.judge_timeout)
    qualification = Qualification(judge, interval=s.judge_exam_interval)
    stack.push_async_callback(qualification.close)  # before the client its exams use
    levels = LearnedLevels(write_back.cache.store, write_back.cache.clock)
    judging = Judging(judge, qualification, write_back, levels, segmenter)
    stack.push_async_callback(judging.close)  # verdicts under way land before the store closes
    return judging


def batching_embedder(s: Settings, backend: SyncEmbedder) -> BatchingEmbedder:
    return BatchingEmbedder(
        backend,
        max_batch=s.embed_max_batch,
        max_wait_s=s.embed_max_wait_ms / 1000,
        max_pending=s.embed_max_pending,
        timeout_s=s.embed_timeout_ms / 1000,
    )


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
        store = await open_store(s.store, s, backends)  # ``backends``: tests may add one
        stack.push_async_callback(store.records.close)
        stack.push_async_callback(store.chains.close)
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
        # jieba's dictionary and tagger are slow to build: now, off the loop, before the port
        # opens, rather than inside the first request, which every fresh process would pay (the
        # `sign` stage of a fresh proxy's first `chat.request` log line shows the cost). The app's
        # own, handed to every part that reads text: nothing it serves builds the default one
        segmenter = await asyncio.to_thread(Segmenter)
        cache, loaded = await open_cache(
            stack, s, store, dim=backend.dim, box=box, verifier=verifying, metrics=metrics, segmenter=segmenter
        )
        judge = HitJudge(window=max(s.ready_after, 1.0))
        signer = ContextSigner(embedder, classifier, SignerSettings(view_tokens=s.view_tokens), segmenter=segmenter)
        settling = Settling()
        stack.push_async_callback(settling.close)  # first: answers given are kept before the index is saved
        write_back = WriteBack(cache, box)
        judging = open_judging(stack, s, upstream, write_back, segmenter)
        feedback = FeedbackReader(
            cache=cache,
            judge=judge,
            metrics=metrics,
            regenerate_window=s.regenerate_window,
            clock=time.time,
            corrected=None if judging is None else judging.corrected,
        )
        planner = Planner(cache=cache, signer=signer, policy_box=box, feedback=feedback, settling=settling)
        yield Parts(
            embedder=embedder,
            cache=cache,
            signer=signer,
            policy_box=box,
            upstream=upstream,
            judge=judge,
            planner=planner,
            write_back=write_back,
            settling=settling,
            prewarmer=prewarmer,
            coalescer=Coalescer() if s.coalesce else None,
            loaded=loaded,
            store=store,
            verifier=verifying,
            judging=judging,
        )
