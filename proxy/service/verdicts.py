"""The judge's refusals, remembered: a record the judge said no to for one wording is not offered
to it again for that wording (its yes becomes an alias record instead: ``new_record.alias_of``).

They live in the record store (``RecordStore.refuse``), keyed by tenant and the request's hash, so a
verdict never crosses tenants, survives a restart and is every replica's over a shared store. They
save judge calls and nothing else: a store that cannot say knows of none, and one that cannot keep
one only costs a judge call asked again, never a request.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import structlog

from proxy.storage.base import RecordStore

__all__ = ["VerdictMemory"]


class VerdictMemory:
    def __init__(self, store: RecordStore, clock: Callable[[], float]) -> None:
        self.store, self.clock = store, clock

    async def refused(self, tenant: str, request_hash: str) -> frozenset[str]:
        """The records the judge refused for this wording; none where the store cannot say."""
        try:
            return await self.store.refused(tenant, request_hash)
        except Exception as exc:  # the request goes on as if none were known
            structlog.get_logger("smartcache").warning("judge.refusals_unread", error=repr(exc)[:200])
            return frozenset()

    async def refuse(self, tenant: str, request_hash: str, cache_ids: Collection[str]) -> None:
        try:
            await self.store.refuse(tenant, request_hash, cache_ids, self.clock())
        except Exception as exc:  # not kept: the judge is asked again, nothing else is lost
            structlog.get_logger("smartcache").warning("judge.refusal_unkept", error=repr(exc)[:200])
