"""Micro-batching of a blocking model call, with a bounded queue.

Model inference (ONNX Runtime) blocks, so it runs on one worker thread, never on the event loop.
Requests that arrive while the worker is busy, or within ``max_wait_s`` of each other, share one
call: under load the batch grows and the cost per item falls. The worker lingers those
``max_wait_s`` for company only while company comes (the last call was shared): a lone client's
request would wait for nobody, on every miss. The queue is bounded, and so is the
wait: when either runs out the caller gets :class:`Overloaded` at once and serves the request
without the model (forwarded uncached), instead of queueing without end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from proxy.core.errors import ServiceError

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["BatchedFront", "MicroBatcher", "Overloaded"]


class Overloaded(ServiceError):
    """The model cannot answer in time: its queue is full or the answer would come too late."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name} overloaded: {why}")
        self.name = name
        self.why = why


@dataclass
class _Job(Generic[T, R]):
    items: Sequence[T]
    future: asyncio.Future[Sequence[R]] = field(repr=False)


class MicroBatcher(Generic[T, R]):
    """``await submit(items)`` returns ``call(items)`` as if called alone, sharing calls with
    whoever else is waiting; ``call`` must return one result per item, in order."""

    def __init__(
        self,
        call: Callable[[list[T]], Sequence[R]],
        *,
        name: str,
        max_batch: int = 32,
        max_wait_s: float = 0.002,
        max_pending: int = 256,
        timeout_s: float | None = None,
    ) -> None:
        self.name = name
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.timeout_s = timeout_s
        self.model_calls = 0
        self.overloaded = 0  # requests refused (queue full or too late)
        self._call = call
        self._queue: asyncio.Queue[_Job[T, R]] = asyncio.Queue(maxsize=max_pending)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._worker: asyncio.Task[None] | None = None
        self._company = False  # whether the last call was shared: only then is lingering worth it

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        self._executor.shutdown(wait=True)

    async def submit(self, items: Sequence[T], *, bounded: bool = True) -> Sequence[R]:
        """``bounded=False`` waits as long as it takes: for work done once at start (exemplars),
        which has no client to answer and must not be refused."""
        self.start()
        future: asyncio.Future[Sequence[R]] = asyncio.get_running_loop().create_future()
        job = _Job(list(items), future)
        if not bounded:
            await self._queue.put(job)
            return await future
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.overloaded += 1
            raise Overloaded(self.name, f"{self._queue.maxsize} requests already waiting") from None
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            # the worker may still compute it; nobody is waiting for the result any more
            future.cancel()
            self.overloaded += 1
            raise Overloaded(self.name, f"no answer within {self.timeout_s} s") from None

    async def _collect(self) -> list[_Job[T, R]]:
        jobs = [await self._queue.get()]
        size = len(jobs[0].items)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.max_wait_s if self._company else 0.0)
        while size < self.max_batch:
            remaining = deadline - loop.time()
            try:
                job = (
                    self._queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(self._queue.get(), remaining)
                )
            except (asyncio.QueueEmpty, TimeoutError):
                break
            jobs.append(job)
            size += len(job.items)
        self._company = len(jobs) > 1
        return [job for job in jobs if not job.future.done()]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self._collect()
            if not jobs:
                continue
            items = [item for job in jobs for item in job.items]
            try:
                results = await loop.run_in_executor(self._executor, self._call, items)
                self.model_calls += 1
            except Exception as exc:
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            start = 0
            for job in jobs:
                end = start + len(job.items)
                if not job.future.done():
                    job.future.set_result(results[start:end])
                start = end


class BatchedFront:
    """What every async model front built on a :class:`MicroBatcher` shows: its counters, and
    start and close of its worker."""

    _batcher: MicroBatcher[Any, Any]

    @property
    def model_calls(self) -> int:
        return self._batcher.model_calls

    @property
    def overloaded(self) -> int:
        return self._batcher.overloaded

    @property
    def pending(self) -> int:
        return self._batcher.pending

    def start(self) -> None:
        self._batcher.start()

    async def close(self) -> None:
        await self._batcher.close()
