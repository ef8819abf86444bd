"""What only a store shared by replicas offers, beyond ``RecordStore``: the change feed's reads
(``proxy.storage.feed.SharedStore``), the policy versions the replicas serve, a filter that hands
the index only the serving version's records, and a probe of what the server could search.

The composition holds this face of a store where its backend declares itself shared
(``proxy.storage.backends``), so every call below is checked against a type, not found by class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from proxy.storage.base import RecordStore
from proxy.storage.feed import SharedStore
from proxy.storage.redis_probe import VectorSearch


class VersionRegister(Protocol):
    """The shared register of served policy versions (``proxy.storage.redis_versions``)."""

    async def beat(self, version: str) -> list[str]:
        """Say ``version`` is served; returns the versions nobody serves any more."""
        ...

    async def forget(self, version: str) -> bool:
        """Drop a version whose records were retired, unless a replica stamped it meanwhile."""
        ...


class SharedRecordStore(RecordStore, SharedStore, Protocol):
    """A record store other replicas write to as well."""

    def follow_policy(self, version: Callable[[], str]) -> None:
        """Hand the index (its start-up load and the feed) only records of the version ``version()``
        names, so replicas on two versions never serve each other's answers."""
        ...

    def versions(self) -> VersionRegister: ...

    async def vector_search(self) -> VectorSearch:
        """What the server could search itself (reported at start; the search stays in-process)."""
        ...
