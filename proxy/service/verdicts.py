"""The judge's refusals, remembered: a record the judge said no to for one wording is not offered
to it again for that wording (its yes becomes an alias record instead: ``new_record.alias_of``).
Keyed by tenant and the request's hash, so a verdict never crosses tenants."""

from __future__ import annotations

from proxy.core.lru import LruDict

__all__ = ["VerdictMemory"]


class VerdictMemory:
    def __init__(self, capacity: int = 200_000) -> None:
        self._refused: LruDict[tuple[str, str], frozenset[str]] = LruDict(capacity)

    def refused(self, tenant: str, request_hash: str) -> frozenset[str]:
        return self._refused.get((tenant, request_hash)) or frozenset()

    def refuse(self, tenant: str, request_hash: str, cache_ids: frozenset[str]) -> None:
        key = (tenant, request_hash)
        self._refused.put(key, self.refused(tenant, request_hash) | cache_ids)
