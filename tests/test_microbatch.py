"""The micro-batcher: one model call for the requests waiting together, a linger for company only
while company comes, a bounded queue and a bounded wait that refuse at once instead of queueing,
failures kept to their own batch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from proxy.microbatch import MicroBatcher, Overloaded


class Doubler:
    """A blocking model stand-in: records each call; can be held on a gate."""

    def __init__(self, gate: threading.Event | None = None, fail_on: int | None = None) -> None:
        self.calls: list[list[int]] = []
        self.gate = gate
        self.fail_on = fail_on

    def __call__(self, items: list[int]) -> Sequence[int]:
        self.calls.append(items)
        if self.gate is not None:
            self.gate.wait(timeout=10)
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError("bad item")
        return [2 * i for i in items]


async def test_requests_waiting_together_share_one_call_and_get_their_own_results() -> None:
    model = Doubler()
    batcher = MicroBatcher(model, name="t", max_batch=64, max_wait_s=0.05)
    try:
        results = await asyncio.gather(*(batcher.submit([i, i + 100]) for i in range(10)))
    finally:
        await batcher.close()
    assert [list(r) for r in results] == [[2 * i, 2 * (i + 100)] for i in range(10)]
    assert len(model.calls) == 1 and batcher.model_calls == 1


async def test_a_full_queue_refuses_at_once() -> None:
    gate = threading.Event()
    model = Doubler(gate)
    batcher = MicroBatcher(model, name="t", max_batch=1, max_wait_s=0.0, max_pending=2)
    try:
        first = asyncio.ensure_future(batcher.submit([1]))  # taken by the worker, held on the gate
        while not model.calls:
            await asyncio.sleep(0.001)
        waiting = [asyncio.ensure_future(batcher.submit([i])) for i in (2, 3)]  # fill the queue
        await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(Overloaded, match="2 requests already waiting"):
            await batcher.submit([4])
        assert loop.time() - began < 0.5
        assert batcher.overloaded == 1
        gate.set()
        assert [list(await f) for f in (first, *waiting)] == [[2], [4], [6]]
    finally:
        gate.set()
        await batcher.close()


async def test_a_wait_past_the_timeout_is_refused_and_its_work_skipped() -> None:
    gate = threading.Event()
    model = Doubler(gate)
    batcher = MicroBatcher(model, name="t", max_batch=1, max_wait_s=0.0, timeout_s=0.05)
    try:
        held = asyncio.ensure_future(batcher.submit([1]))
        while not model.calls:  # [1] is in the model, held on the gate
            await asyncio.sleep(0.001)
        with pytest.raises(Overloaded, match="no answer within"):
            await batcher.submit([2])  # queued behind the held call
        with pytest.raises(Overloaded):
            await held
        gate.set()
        assert list(await batcher.submit([5])) == [10]
        assert [2] not in model.calls  # nobody waited for it any more: never computed
    finally:
        gate.set()
        await batcher.close()


async def test_a_failing_call_fails_only_its_own_batch() -> None:
    model = Doubler(fail_on=13)
    batcher = MicroBatcher(model, name="t", max_batch=1, max_wait_s=0.0)
    try:
        bad, good = await asyncio.gather(batcher.submit([13]), batcher.submit([1]), return_exceptions=True)
    finally:
        await batcher.close()
    assert isinstance(bad, ValueError) and list(good) == [2]  # type: ignore[arg-type]


async def test_a_lone_request_does_not_wait_for_company_that_is_not_coming() -> None:
    model = Doubler()
    batcher = MicroBatcher(model, name="t", max_batch=64, max_wait_s=30.0)
    try:
        # lingering the full 30 s for a second request would time this out
        assert list(await asyncio.wait_for(batcher.submit([1]), 5)) == [2]
        assert list(await asyncio.wait_for(batcher.submit([2]), 5)) == [4]
    finally:
        await batcher.close()
    assert model.calls == [[1], [2]]


async def test_once_calls_are_shared_the_worker_lingers_for_company() -> None:
    gate = threading.Event()
    model = Doubler(gate)
    batcher = MicroBatcher(model, name="t", max_batch=64, max_wait_s=1.0)
    try:
        first = asyncio.ensure_future(batcher.submit([1]))
        while not model.calls:  # the worker holds the first call on the gate
            await asyncio.sleep(0.01)
        queued = [asyncio.ensure_future(batcher.submit([i])) for i in (2, 3)]
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(first, *queued)
        assert model.calls == [[1], [2, 3]]  # the two that waited together shared a call
        # company came last time: the next request lingers, and one arriving 50 ms later rides along
        later = asyncio.ensure_future(batcher.submit([4]))
        await asyncio.sleep(0.05)
        assert [list(r) for r in await asyncio.gather(later, batcher.submit([5]))] == [[8], [10]]
    finally:
        await batcher.close()
    assert model.calls[2] == [4, 5]
