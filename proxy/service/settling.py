"""What a request still does for the cache after its answer went out.

An answer goes to the client before it is written back (the record, its index entry, the
session's last answer) or before a served hit is counted: that bookkeeping is SQLite and hnswlib
work (bench_request_parts.py) the client need not wait for, and a keep-alive connection's next request
must not queue behind it. Whoever reads what it writes waits for it instead, so nothing can tell
the bookkeeping came after the reply:

- the session's own next request, before its feedback is read: a regenerate or a correction sent
  the moment the answer arrived finds that answer as the session's last, and a reset finds the
  record to invalidate;
- any request of the tenant, before its lookup, for the answers being written whose conversation
  is near its own (the lookup's floor, below which a record cannot change its decision): an answer
  given before the request arrived is in the index it searches, as when the write came first.
  Unrelated writes and hit counts are not waited for: under load some write is nearly always in
  flight, and a lookup that waited for each would queue behind every other request's bookkeeping;
- the admin API and the metrics, before they read: a record, a thumbs target, a counter.

Only the work in flight when the reader arrives is waited for, so a wait is bounded by one
write-back, never by a queue of them. At shutdown everything in flight is finished, not
cancelled: the answer was given and its keeping was promised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import numpy as np
import structlog

from proxy.core.identity import Identity

__all__ = ["Settling"]


class Settling:
    """Background bookkeeping of answered requests, by tenant and session, and waits on it."""

    def __init__(self) -> None:
        self._all: set[asyncio.Task[None]] = set()
        self._sessions: dict[tuple[str, str], set[asyncio.Task[None]]] = {}
        # record writes in flight, by tenant, with the conversation vector each record is indexed by
        self._writes: dict[str, dict[asyncio.Task[None], np.ndarray]] = {}

    @property
    def in_flight(self) -> int:
        return len(self._all)

    def start(
        self, who: Identity, work: Coroutine[Any, Any, None], *, record_vector: np.ndarray | None = None
    ) -> asyncio.Task[None]:
        """Run ``work`` now, in the background; readers of ``who``'s session wait for it, and so
        do lookups near ``record_vector`` when the work writes a record indexed by that (unit)
        vector. A failure is logged here (``settling.failed``) and reaches no one: the client has
        its answer, and a waiter only needs the work to be over."""
        task = asyncio.get_running_loop().create_task(work)
        session = (who.tenant, who.session)
        self._all.add(task)
        self._sessions.setdefault(session, set()).add(task)
        if record_vector is not None:
            self._writes.setdefault(who.tenant, {})[task] = record_vector
        task.add_done_callback(lambda done: self._forget(done, who.tenant, session))
        return task

    def _forget(self, task: asyncio.Task[None], tenant: str, session: tuple[str, str]) -> None:
        self._all.discard(task)
        _discard(self._sessions, session, task)
        writes = self._writes.get(tenant)
        if writes is not None and writes.pop(task, None) is not None and not writes:
            del self._writes[tenant]
        if not task.cancelled() and (exc := task.exception()) is not None:
            structlog.get_logger("smartcache").error("settling.failed", exc_info=exc)

    async def session(self, who: Identity) -> bool:
        """Until the session's bookkeeping in flight now is done; whether there was any."""
        return await _wait(self._sessions.get((who.tenant, who.session)))

    async def writes_near(self, vector: np.ndarray, floor: float, tenant: str | None) -> bool:
        """Until the record writes in flight now whose vector scores at least ``floor`` against
        ``vector`` (cosine) are done: the tenant's, or every tenant's when ``tenant`` is None (a
        lookup that reads the shared pool). Whether there were any."""
        tables = self._writes.values() if tenant is None else [self._writes.get(tenant, {})]
        near = {task for writes in tables for task, v in writes.items() if float(v @ vector) >= floor}
        return await _wait(near)

    async def everything(self) -> None:
        """Until all bookkeeping in flight now is done."""
        await _wait(self._all)

    async def close(self) -> None:
        """Finish everything, including what finishing starts (a shutdown waits for the last write)."""
        while self._all:
            await _wait(self._all)


def _discard(table: dict[Any, set[asyncio.Task[None]]], key: Any, task: asyncio.Task[None]) -> None:
    tasks = table.get(key)
    if tasks is not None:
        tasks.discard(task)
        if not tasks:
            del table[key]


async def _wait(tasks: set[asyncio.Task[None]] | None) -> bool:
    # the common case, nothing in flight, returns without suspending the caller
    if not tasks:
        return False
    # a copy: tasks leave the set as they finish; asyncio.wait raises none of their errors
    await asyncio.wait(set(tasks))
    return True
