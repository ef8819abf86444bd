"""Micro-batching in front of the real default pack: concurrent callers share one model call, batches
stay bounded, the event loop keeps running while the model does, and a failed call fails only its
own batch."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from proxy.embedding.backends import Matrix, SyncEmbedder
from proxy.embedding.batching import BatchingEmbedder

TEXTS = [
    "What is the tallest mountain in Europe?",
    "北京有哪些适合带孩子去的景点？",
    "帮我把这段话改写得更正式一些",
    "How do I reset my router password?",
    "预算八千以内的笔记本电脑推荐",
    "Write a haiku about autumn rain.",
    "明天上海会下雨吗",
    "Summarise the plot of Hamlet in two sentences.",
]


class Recording:
    """The real backend, recording the size of every model call (and optionally slowed or failing)."""

    def __init__(self, inner: SyncEmbedder, *, delay: float = 0.0) -> None:
        self.inner = inner
        self.name, self.dim, self.max_tokens = inner.name, inner.dim, inner.max_tokens
        self.delay = delay
        self.calls: list[int] = []
        self.counted: list[str] = []
        self.threads: set[int] = set()
        self.fail_next = False

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.calls.append(len(texts))
        self.threads.add(threading.get_ident())
        if self.delay:
            time.sleep(self.delay)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("model crashed")
        return self.inner.embed(texts)

    def count_tokens(self, text: str) -> int:
        self.counted.append(text)
        return self.inner.count_tokens(text)


async def test_fits_tokenizes_only_a_text_its_length_cannot_settle(sync_embedder: SyncEmbedder) -> None:
    backend = Recording(sync_embedder)
    embedder = BatchingEmbedder(backend)
    short, long = TEXTS[1], " ".join(TEXTS * 3)
    assert embedder.fits(short, len(short.encode()) + 16)
    assert backend.counted == []
    tokens = sync_embedder.count_tokens(long)
    assert len(long.encode()) > tokens + 16  # its bytes alone would not say it fits
    assert embedder.fits(long, tokens) and not embedder.fits(long, tokens - 1)
    assert backend.counted == [long, long]


async def test_concurrent_callers_share_one_model_call(sync_embedder: SyncEmbedder) -> None:
    backend = Recording(sync_embedder)
    embedder = BatchingEmbedder(backend, max_batch=32, max_wait_s=0.05)
    try:
        results = await asyncio.gather(*(embedder.embed([t]) for t in TEXTS))
    finally:
        await embedder.close()
    assert backend.calls == [len(TEXTS)] and embedder.model_calls == 1
    alone = sync_embedder.embed(TEXTS)
    for text_result, expected in zip(results, alone, strict=True):
        assert text_result.shape == (1, sync_embedder.dim) and text_result.dtype == np.float32
        assert float(text_result[0] @ expected) > 0.9999  # each caller gets its own row back


async def test_texts_queued_while_the_model_is_busy_ride_the_next_call(sync_embedder: SyncEmbedder) -> None:
    backend = Recording(sync_embedder, delay=0.2)
    embedder = BatchingEmbedder(backend, max_batch=32, max_wait_s=0.0)
    try:
        first = asyncio.ensure_future(embedder.embed(TEXTS[:1]))
        await asyncio.sleep(0.05)  # the first call is now running in the worker thread
        rest = await asyncio.gather(*(embedder.embed([t]) for t in TEXTS[1:]))
        await first
    finally:
        await embedder.close()
    assert backend.calls == [1, len(TEXTS) - 1]
    assert [r.shape[0] for r in rest] == [1] * (len(TEXTS) - 1)


async def test_batches_are_bounded_and_multi_text_jobs_stay_whole(sync_embedder: SyncEmbedder) -> None:
    backend = Recording(sync_embedder)
    embedder = BatchingEmbedder(backend, max_batch=3, max_wait_s=0.05)
    try:
        jobs = [TEXTS[0:2], TEXTS[2:3], TEXTS[3:6], TEXTS[6:7], TEXTS[7:8]]
        results = await asyncio.gather(*(embedder.embed(j) for j in jobs))
    finally:
        await embedder.close()
    # a batch closes once it holds max_batch texts; a job is never split across calls
    assert backend.calls == [3, 3, 2]
    for job, got in zip(jobs, results, strict=True):
        assert got.shape == (len(job), sync_embedder.dim)
        # each row is its own text's vector: the int8 pack quantises activations per call, so a
        # vector moves by up to ~1e-3 in cosine with its batch companions; another text's is far off
        alone = sync_embedder.embed(job)
        assert np.all(np.sum(got * alone, axis=1) > 0.995)


async def test_the_event_loop_runs_while_the_model_works(sync_embedder: SyncEmbedder) -> None:
    backend = Recording(sync_embedder, delay=0.3)
    embedder = BatchingEmbedder(backend, max_batch=32, max_wait_s=0.0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    try:
        await embedder.embed(TEXTS[:2])
    finally:
        task.cancel()
        await embedder.close()
    assert ticks >= 10  # a blocked loop would tick once, after the call
    assert threading.get_ident() not in backend.threads


async def test_a_failed_model_call_fails_its_batch_and_the_next_one_works(sync_embedder: SyncEmbedder) -> None:
    backend = Recording(sync_embedder)
    backend.fail_next = True
    embedder = BatchingEmbedder(backend, max_batch=32, max_wait_s=0.05)
    try:
        failed = await asyncio.gather(*(embedder.embed([t]) for t in TEXTS[:3]), return_exceptions=True)
        assert all(isinstance(f, RuntimeError) for f in failed)
        again = await embedder.embed(TEXTS[:1])
    finally:
        await embedder.close()
    assert again.shape == (1, sync_embedder.dim) and backend.calls == [3, 1]


async def test_empty_input_needs_no_model_call(sync_embedder: SyncEmbedder) -> None:
    backend = Recording(sync_embedder)
    embedder = BatchingEmbedder(backend)
    try:
        assert (await embedder.embed([])).shape == (0, sync_embedder.dim)
    finally:
        await embedder.close()
    assert backend.calls == []


@pytest.mark.parametrize("pack", ["e5-small-multilingual", "use-multilingual"])
@pytest.mark.slow
async def test_thread_count_setting_reaches_the_onnx_session(pack: str, model_home: Path) -> None:
    from proxy.embedding.packs import install_pack
    from proxy.service.compose import load_backend
    from proxy.settings import load_settings

    install_pack(pack, model_home, progress=False)
    for threads in (1, 2):
        s = load_settings(
            environ={"SMARTCACHE_EMBED_THREADS": str(threads)},
            overrides={"embedding_model": pack, "model_home": model_home},
        )
        backend = await load_backend(s)
        session = getattr(backend, "_session", None) or backend._model.model.model  # type: ignore[attr-defined]
        assert session.get_session_options().intra_op_num_threads == threads
