"""Async embedding with micro-batching.

The model call blocks (ONNX Runtime), so it runs on one worker thread, never on the event
loop. Requests that arrive while the worker is busy, or within ``max_wait_s`` of each other,
share one model call: under load the batch grows and per-request cost falls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from proxy.embedding.backends import SyncEmbedder


@dataclass
class _Job:
    texts: Sequence[str]
    future: asyncio.Future[np.ndarray] = field(repr=False)


class BatchingEmbedder:
    def __init__(self, backend: SyncEmbedder, *, max_batch: int = 32, max_wait_s: float = 0.002) -> None:
        self.backend = backend
        self.dim = backend.dim
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.model_calls = 0
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
        self._worker: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="embedder")

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        self._executor.shutdown(wait=True)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.start()
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(list(texts), future))
        return await future

    def count_tokens(self, text: str) -> int:
        return self.backend.count_tokens(text)

    async def _collect(self) -> list[_Job]:
        jobs = [await self._queue.get()]
        size = len(jobs[0].texts)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while size < self.max_batch:
            remaining = deadline - loop.time()
            try:
                job = (
                    self._queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(self._queue.get(), remaining)
                )
            except (asyncio.QueueEmpty, TimeoutError):
                break
            jobs.append(job)
            size += len(job.texts)
        return jobs

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self._collect()
            texts = [t for job in jobs for t in job.texts]
            try:
                vectors = await loop.run_in_executor(self._executor, self.backend.embed, texts)
                self.model_calls += 1
            except Exception as exc:
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            start = 0
            for job in jobs:
                end = start + len(job.texts)
                if not job.future.done():
                    job.future.set_result(np.asarray(vectors[start:end], dtype=np.float32))
                start = end
