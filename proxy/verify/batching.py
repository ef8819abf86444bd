"""The async front of the pair verifier, micro-batched like the embedder (proxy.embedding.batching).

``Verifier.score`` blocks (model inference), so it runs on one worker thread, never on the event
loop. Pairs of requests that arrive while the worker is busy, or within ``max_wait_s`` of each
other, share one call: one call over many pairs costs far less than many calls. The queue is
bounded: when it is full, or a result takes longer than ``timeout_s``, the caller gets
:class:`VerifierBusy` at once and decides without the verifier (a half-hit, never a wait
without end and never an unverified hit).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from proxy.model import Candidate, Record, Signature
from proxy.verify.protocol import Verifier
from proxy.verify.sides import PairSide

__all__ = ["BatchingVerifier", "VerifierBusy", "record_side", "request_side"]

Pair = tuple[PairSide, PairSide]


class VerifierBusy(Exception):
    """The verifier cannot answer in time: its queue is full or the answer came too late."""


def request_side(sig: Signature) -> PairSide:
    return PairSide(sig.question_raw or sig.current_text, sig.previous_question, sig.previous_reply_head)


def record_side(record: Record) -> PairSide:
    """The side a record stored when it was written; records from before the verifier kept only
    the normalised question and reply, which still read better than nothing."""
    tags: Mapping[str, Any] = record.coarse_tags
    return PairSide(
        str(tags.get("question_raw") or tags.get("question", "")),
        str(tags.get("previous_question", "")),
        str(tags.get("previous_reply_head") or tags.get("previous_reply", "")),
    )


@dataclass
class _Job:
    pairs: Sequence[Pair]
    future: asyncio.Future[list[float]] = field(repr=False)


class BatchingVerifier:
    def __init__(
        self,
        verifier: Verifier,
        *,
        max_batch: int = 16,
        max_wait_s: float = 0.002,
        max_pending: int = 64,
        timeout_s: float | None = 1.0,
    ) -> None:
        self.verifier = verifier
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.timeout_s = timeout_s
        self.model_calls = 0
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(maxsize=max_pending)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
        self._worker: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="verifier")

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        self._executor.shutdown(wait=True)

    async def score(self, pairs: Sequence[Pair]) -> list[float]:
        """One probability per pair, in order; :class:`VerifierBusy` rather than a long wait."""
        if not pairs:
            return []
        self.start()
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Job(list(pairs), future))
        except asyncio.QueueFull:
            raise VerifierBusy(f"{self._queue.maxsize} verifications already waiting") from None
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            raise VerifierBusy(f"no verdict within {self.timeout_s} s") from None

    async def verdicts(self, candidates: Sequence[Candidate], sig: Signature) -> dict[str, float]:
        """cache_id -> probability that the candidate's answer answers this request."""
        if not candidates:
            return {}
        side = request_side(sig)
        scores = await self.score([(side, record_side(c.record)) for c in candidates])
        return {c.record.cache_id: p for c, p in zip(candidates, scores, strict=True)}

    async def _collect(self) -> list[_Job]:
        jobs = [await self._queue.get()]
        size = len(jobs[0].pairs)
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
            size += len(job.pairs)
        return jobs

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # a caller that gave up (timed out, cancelled) needs no verdict: skip its pairs
            jobs = [job for job in await self._collect() if not job.future.done()]
            if not jobs:
                continue
            pairs = [p for job in jobs for p in job.pairs]
            try:
                scores = await loop.run_in_executor(self._executor, self.verifier.score, pairs)
                self.model_calls += 1
            except Exception as exc:
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            start = 0
            for job in jobs:
                end = start + len(job.pairs)
                if not job.future.done():
                    job.future.set_result([float(p) for p in scores[start:end]])
                start = end
