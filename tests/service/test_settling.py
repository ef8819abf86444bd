"""Settling: the bookkeeping after a reply, and who waits for it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from structlog.testing import capture_logs

from proxy.core.identity import Identity
from proxy.service.settling import Settling


def who(tenant: str = "t-a", session: str = "s-1") -> Identity:
    return Identity(tenant=tenant, session=session, user=None, session_explicit=True)


async def held(gate: asyncio.Event, done: list[str], name: str) -> None:
    await gate.wait()
    done.append(name)


async def test_a_session_waits_for_its_own_work_only() -> None:
    settling, gate, other_gate, done = Settling(), asyncio.Event(), asyncio.Event(), []
    settling.start(who(session="s-1"), held(gate, done, "mine"))
    settling.start(who(session="s-2"), held(other_gate, done, "other session"))
    waiter = asyncio.create_task(settling.session(who(session="s-1")))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    gate.set()
    await asyncio.wait_for(waiter, 1)
    assert done == ["mine"]  # the other session's work is still held, and was not waited for
    other_gate.set()
    await settling.close()
    assert settling.in_flight == 0


def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


async def test_a_lookup_waits_for_the_near_writes_of_its_tenant_only() -> None:
    settling, gate, rest, done = Settling(), asyncio.Event(), asyncio.Event(), []
    here = unit(1, 0, 0)
    settling.start(who("t-a", "s-1"), held(gate, done, "near"), record_vector=unit(1, 0.1, 0))
    settling.start(who("t-a", "s-2"), held(rest, done, "far"), record_vector=unit(0, 1, 0))
    settling.start(who("t-a", "s-3"), held(rest, done, "a hit's count"))  # writes no record
    settling.start(who("t-b", "s-1"), held(rest, done, "other tenant"), record_vector=here)
    waiter = asyncio.create_task(settling.writes_near(here, 0.9, "t-a"))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    gate.set()
    await asyncio.wait_for(waiter, 1)
    assert done == ["near"]  # the far write, the count and the other tenant's write are still held
    rest.set()
    await settling.close()
    assert settling.in_flight == 0


async def test_a_lookup_of_the_shared_pool_waits_for_every_tenants_near_writes() -> None:
    settling, gates, done = Settling(), [asyncio.Event(), asyncio.Event()], []
    here = unit(0, 0, 1)
    settling.start(who("t-a", "s-1"), held(gates[0], done, "a"), record_vector=here)
    settling.start(who("t-b", "s-1"), held(gates[1], done, "b"), record_vector=here)
    waiter = asyncio.create_task(settling.writes_near(here, 0.9, None))
    gates[0].set()
    await asyncio.sleep(0.01)
    assert not waiter.done()  # t-b's write is near too
    gates[1].set()
    await asyncio.wait_for(waiter, 1)
    assert sorted(done) == ["a", "b"]
    everything = asyncio.create_task(settling.everything())
    await asyncio.wait_for(everything, 1)
    assert settling.in_flight == 0


async def test_nothing_in_flight_returns_without_suspending() -> None:
    settling, ran = Settling(), []
    asyncio.get_running_loop().call_soon(ran.append, "other")
    await settling.session(who())
    await settling.writes_near(unit(1, 0), 0.5, "t-a")
    await settling.everything()
    assert ran == []  # the loop never ran anything else meanwhile


async def test_a_wait_is_bounded_by_what_was_in_flight_when_it_began() -> None:
    settling, first, later, done = Settling(), asyncio.Event(), asyncio.Event(), []
    settling.start(who(), held(first, done, "first"))
    waiter = asyncio.create_task(settling.session(who()))
    await asyncio.sleep(0)
    settling.start(who(), held(later, done, "later"))  # began after the wait did
    first.set()
    await asyncio.wait_for(waiter, 1)
    assert done == ["first"]
    later.set()
    await settling.close()


async def test_a_failure_is_the_works_own_and_never_reaches_a_waiter() -> None:
    settling = Settling()

    async def broken() -> None:
        raise RuntimeError("disk on fire")

    with capture_logs() as logs:
        task = settling.start(who(), broken())
        await settling.session(who())
        await asyncio.sleep(0)  # the done callbacks run after the waiter wakes
    assert settling.in_flight == 0
    with pytest.raises(RuntimeError):
        task.result()
    assert [entry["event"] for entry in logs] == ["settling.failed"]


async def test_close_finishes_work_that_starts_more_work() -> None:
    settling, done = Settling(), []

    async def chained() -> None:
        await asyncio.sleep(0.01)
        settling.start(who(), held(_set(), done, "second"))
        done.append("first")

    settling.start(who(), chained())
    await settling.close()
    assert sorted(done) == ["first", "second"] and settling.in_flight == 0


def _set() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event
