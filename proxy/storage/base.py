"""The record store seam: what SemanticCache, the lifecycle sweeper and the admin API ask of the
place records live. A backend is one module implementing ``RecordStore``; nothing above it sees
SQL or Redis commands, only these typed values.

A record's integer ``label`` is minted by the store at insert, never reused, and is the record's
label in the vector index, so the index can always be rebuilt from the store.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from proxy.core.errors import ConfigError, ServiceError
from proxy.core.learning import Label
from proxy.core.model import LIVE_STATES, Record, RecordState, SessionLast

# the judge's refusals kept for one wording: the judge reads a few of the nearest records
# (``judge_top``), so a wording refused more often than this is kept by its newest refusals
REFUSALS_PER_WORDING = 16
# each (tenant, intent) keeps its newest labels (learned levels, proxy/core/learning.py); older ones
# no longer count
LABELS_KEPT = 4_096


class StoreMismatch(ConfigError, ValueError):
    """A data directory written under another embedding model: its vectors live in another space."""


class StoreUnavailable(ServiceError, RuntimeError):
    """The store cannot be reached right now; the request goes upstream uncached instead."""


@dataclass(frozen=True, slots=True)
class Selector:
    """Which records an operation touches: every field set must match (AND); None matches all.

    ``states`` defaults to the live ones, so an invalidation never resurrects or re-counts a
    record already rejected or invalid. Conditional transitions (promotion, rejection) are a
    selector naming the state they start from: the store applies it atomically, so two replicas
    racing on one record change it once."""

    tenant: str | None = None
    session: str | None = None
    user: str | None = None
    namespace: str | None = None
    model: str | None = None
    system_prompt_version: str | None = None
    policy_version: str | None = None
    other_policy_version: str | None = None  # written under any version but this (the running one)
    intent: str | None = None
    context_fingerprint: str | None = None
    request_hash: str | None = None
    cache_ids: tuple[str, ...] | None = None
    labels: tuple[int, ...] | None = None
    scopes: tuple[str, ...] | None = None  # the pools the record was written to
    states: tuple[RecordState, ...] | None = LIVE_STATES  # None: any state
    expired_before: float | None = None  # expires_at <= this
    created_before: float | None = None  # created_at <= this
    ready_before: float | None = None  # ready_at <= this (the feedback window has passed)

    def matches(self, r: Record) -> bool:
        """The reference semantics every backend implements (and a backend without an index for a
        field may fall back to): a record is selected when each set field agrees."""
        exact = (
            ("tenant", self.tenant),
            ("session", self.session),
            ("user", self.user),
            ("namespace", self.namespace),
            ("model", self.model),
            ("system_prompt_version", self.system_prompt_version),
            ("policy_version", self.policy_version),
            ("intent", self.intent),
            ("context_fingerprint", self.context_fingerprint),
            ("request_hash", self.request_hash),
        )
        if any(want is not None and getattr(r, name) != want for name, want in exact):
            return False
        return not (
            (self.other_policy_version is not None and r.policy_version == self.other_policy_version)
            or (self.cache_ids is not None and r.cache_id not in self.cache_ids)
            or (self.labels is not None and r.label not in self.labels)
            or (self.scopes is not None and r.scope not in self.scopes)
            or (self.states is not None and r.state not in self.states)
            or (self.expired_before is not None and r.expires_at > self.expired_before)
            or (self.created_before is not None and r.created_at > self.created_before)
            or (self.ready_before is not None and r.ready_at > self.ready_before)
        )


class Ref(NamedTuple):
    """A record named both ways: by its label (the index) and its id (everything else)."""

    label: int
    cache_id: str


class Usage(NamedTuple):
    """What hit-weighted LRU eviction reads of a live record."""

    label: int
    cache_id: str
    last_use: float  # the last hit, or the write when never hit
    hit_count: int
    answer_bytes: int


class Count(NamedTuple):
    state: str
    scope: str
    intent: str
    n: int


INTERNED_ORDER = (
    "answer_bytes",
    "tenant",
    "session",
    "user",
    "scope",
    "model",
    "system_prompt_version",
    "namespace",
    "intent",
)


class IndexKey(NamedTuple):
    """What the index filter needs to know about a label without asking the store. ``INTERNED_ORDER``
    is the order ``interned`` takes its fields in, which rows that carry keys (the SQLite index
    columns, the feed's checkpoint) follow.

    A tuple, like ``IndexRow``: a start makes one per live record, and a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``, which a million of them feel
    (bench_store.py --records 1000000 --tenants 1000 times the start)."""

    tenant: str
    session: str
    user: str | None
    scope: str
    model: str
    system_prompt_version: str
    namespace: str
    intent: str
    answer_bytes: int  # for the byte budget, so the sweeper need not read every answer to sum them

    @classmethod
    def of(cls, r: Record) -> IndexKey:
        return cls.interned(
            len(r.answer_text.encode()),
            r.tenant,
            r.session,
            r.user,
            r.scope,
            r.model,
            r.system_prompt_version,
            r.namespace,
            r.intent,
        )

    @classmethod
    def interned(
        cls,
        answer_bytes: int,
        tenant: str,
        session: str,
        user: str | None,
        scope: str,
        model: str,
        version: str,
        namespace: str,
        intent: str,
    ) -> IndexKey:
        """One key per record stays in memory: tenants, sessions, models and versions repeat across
        records, so each is kept once (measured in benchmarks/bench_store.py)."""
        i = sys.intern
        return cls(
            i(tenant),
            i(session),
            None if user is None else i(user),
            i(scope),
            i(model),
            i(version),
            i(namespace),
            i(intent),
            answer_bytes,
        )


class IndexRow(NamedTuple):
    """A live record as the vector index sees it. A tuple, not a dataclass: start-up reads one per
    record, and a tuple is the cheapest value to make a million of."""

    label: int
    vector: bytes | None  # None when asked for without vectors (a start from a snapshot)
    key: IndexKey


class RecordStore(Protocol):
    """Every operation the cache, the sweeper and the admin API perform on records."""

    async def store_id(self) -> str:
        """A random id minted with the store: files derived from it (the index snapshot) name it, so
        a store created afresh, whose labels restart, never adopts them."""
        ...

    async def tenant_salt(self, proposed: str) -> str:
        """The salt tenant ids are hashed with. A store shared by replicas keeps the first one
        proposed, so every replica names a tenant alike; one of a single replica takes its own."""
        ...

    async def claim_embedding(self, model: str, dim: int) -> None:
        """Stamp an empty store with the embedding model, or raise ``StoreMismatch`` for one written
        with another: vectors of two models are not comparable even at the same dimension."""
        ...

    async def insert(self, record: Record) -> int:
        """Store a new record and return its label (the record's own ``label`` is ignored)."""
        ...

    async def get(self, cache_id: str) -> Record | None: ...

    async def get_many(self, labels: Sequence[int]) -> list[Record]:
        """The records of these labels that still exist, in any state, in no particular order."""
        ...

    async def find(self, selector: Selector, *, limit: int | None = None) -> list[Record]:
        """Selected records, newest (highest label) first."""
        ...

    async def refs(self, selector: Selector) -> list[Ref]: ...

    async def set_state(self, selector: Selector, state: RecordState) -> list[Ref]:
        """Move the selected records to ``state``, each atomically against ``selector.states``: the
        refs returned are those this call changed, so of two racing callers only one sees a record."""
        ...

    async def promote_due(self, now: float) -> list[Ref]:
        """Pending records whose feedback window has passed become ready, each exactly once."""
        ...

    async def delete(self, selector: Selector) -> list[Ref]:
        """Remove the selected records; the refs returned are those this call removed. A delete
        naming a tenant and no session (a purge) forgets that tenant's refusals and labels too."""
        ...

    async def refuse(self, tenant: str, request_hash: str, cache_ids: Collection[str], now: float) -> None:
        """The judge said no to these records for the wording ``request_hash`` of ``tenant``: each is
        not offered to it again for that wording while the record lives. Only live records are
        remembered, a refusal goes with its record (retired, expired, evicted, deleted), and a
        wording keeps its ``REFUSALS_PER_WORDING`` newest."""
        ...

    async def refused(self, tenant: str, request_hash: str) -> frozenset[str]:
        """The cache ids the judge refused for this wording of this tenant (never another's)."""
        ...

    async def add_labels(self, tenant: str, labels: Sequence[Label]) -> None:
        """Keep these labels of ``tenant`` (learned levels, proxy/core/learning.py); each (tenant,
        intent) keeps its ``LABELS_KEPT`` newest. Labels outlive their records: they label a score
        region, not an answer."""
        ...

    async def labels(self, tenant: str, intent: str) -> list[Label]:
        """The tenant's labels for ``intent``, oldest first; never another tenant's."""
        ...

    async def record_served(self, cache_id: str, now: float, tenant: str, session: str, last: SessionLast) -> None:
        """A hit: the record's hit count and last hit time, and the session's last answer (as
        ``set_session_last``), in one write. A record gone since the lookup counts nothing."""
        ...

    async def add_feedback(self, cache_id: str, delta: float) -> float | None:
        """Add ``delta`` to the record's score, kept within [0, 1]; the new score, None if gone."""
        ...

    async def set_session_last(self, tenant: str, session: str, last: SessionLast) -> None: ...

    async def session_last(self, tenant: str, session: str) -> SessionLast | None: ...

    async def purge_session_last(self, before: float) -> int:
        """Forget the last answers of sessions idle since ``before``."""
        ...

    def iter_live(self) -> AsyncIterator[Record]:
        """Every live record, in label order."""
        ...

    def iter_index_rows(self, *, vectors: bool = True) -> AsyncIterator[IndexRow]:
        """Every live record as the index sees it, in label order: start-up and compaction read
        every record, so they skip answers and tags."""
        ...

    async def live_labels(self) -> list[int]:
        """Every live record's label, in no order: a start that has the keys saved at the last
        shutdown (proxy.storage.keyfile) reads only these."""
        ...

    async def index_rows(self, labels: Sequence[int], *, vectors: bool = True) -> list[IndexRow]:
        """The live ones of these labels as the index sees them, in no particular order."""
        ...

    async def vectors_of(self, labels: Sequence[int]) -> list[tuple[int, bytes]]: ...

    async def usage(self) -> list[Usage]:
        """Every live record's use, for eviction."""
        ...

    async def counts(self) -> list[Count]:
        """Records by state, scope and intent."""
        ...

    async def answer_bytes(self) -> int:
        """Bytes of all live answers."""
        ...

    async def scrub(self) -> None:
        """Leave nothing deleted readable in the store's own files (after a revoked tenant's purge)."""
        ...

    async def close(self) -> None: ...
