"""The Redis record store: several proxy replicas share one cache, one feedback state and one
invalidation history through one Redis 7 server (no modules needed).

Records are hashes; sorted sets and sets index them by state, time, tenant, session and intent
(see ``redis_lua``); every change of a record's life (insert, state change, delete) is one Lua
script, atomic on the server, that also appends an event to a stream. Each replica keeps its own
HNSW index and applies that stream (``proxy.storage.feed``, reading it through ``redis_stream``).
Redis errors leave this module as ``StoreUnavailable``: the proxy then forwards uncached instead
of failing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from proxy.core.learning import Label
from proxy.core.model import Record, RecordState, SessionLast
from proxy.storage import redis_lua
from proxy.storage.base import LABELS_KEPT, REFUSALS_PER_WORDING, Count, IndexRow, Ref, Selector, StoreMismatch, Usage
from proxy.storage.redis_codec import (
    DEAD,
    INDEX,
    INDEX_TAIL,
    LIVE,
    META,
    Changes,
    ErrorTypes,
    StreamPosition,
    as_labels,
    decode,
    encode,
    index_row,
    label_json,
    label_of,
    pairs,
    states_arg,
    text,
)
from proxy.storage.redis_codec import unavailable as _unavailable
from proxy.storage.redis_probe import PROBE, SEARCH_COMMANDS, VectorSearch
from proxy.storage.redis_stream import EventStream
from proxy.storage.redis_versions import GRACE_S, PolicyVersions

BATCH = 500  # records per pipeline or script call
STREAM_MAXLEN = 100_000  # events kept; a replica further behind rebuilds from the records
BACKSTOP_SECONDS = 7 * 86400.0  # a record's hash outlives its TTL by this, then Redis drops it
SESSION_LAST_SECONDS = 7 * 86400.0


class RedisStore:
    """``RecordStore`` on one Redis server, shared by every replica that names it."""

    def __init__(self, client: aioredis.Redis, *, prefix: str = "sc:", stream_maxlen: int = STREAM_MAXLEN) -> None:
        self._r = client
        self.prefix = prefix
        self.stream_maxlen = stream_maxlen
        self._insert = client.register_script(redis_lua.INSERT)
        self._set_state = client.register_script(redis_lua.SET_STATE)
        self._delete = client.register_script(redis_lua.DELETE)
        self._dangling = client.register_script(redis_lua.DANGLING)
        self._hit = client.register_script(redis_lua.HIT)
        self._feedback = client.register_script(redis_lua.FEEDBACK)
        self._purge_last = client.register_script(redis_lua.PURGE_SESSION_LAST)
        self._refuse = client.register_script(redis_lua.REFUSE)
        self._forget_labels = client.register_script(redis_lua.FORGET_LABELS)
        self._probe = client.register_script(PROBE)
        self._serving: Callable[[], str] | None = None
        self._stream = EventStream(client, self._k("events"))

    @classmethod
    async def open(cls, url: str, *, prefix: str = "sc:", timeout: float = 2.0) -> RedisStore:
        # one retry on a connection error: after an outage, each connection pooled before it died
        # with the old server and fails its next command, which that server never ran. A retry
        # of a command that did run is harmless: an insert refuses a cache id already stored,
        # state changes are conditional, and a hit or feedback counted twice is noise
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            health_check_interval=15,
            retry=Retry(NoBackoff(), 1),
        )
        with _unavailable():
            await client.ping()
        return cls(client, prefix=prefix)

    async def close(self) -> None:
        await self._r.aclose()

    async def scrub(self) -> None:
        """Deleted keys are gone from the server's memory at once; what its persistence (an
        append-only file, snapshots) still holds is the server operator's to rewrite, since a
        client-triggered rewrite would load every replica's server."""

    def follow_policy(self, version: Callable[[], str]) -> None:
        """Hand the index only records written under the policy version ``version()`` names (the
        one this replica serves now): the start-up load and the change feed read through here,
        so replicas on two versions (a rolling deploy) never serve each other's answers."""
        self._serving = version

    def versions(self, *, grace_s: float = GRACE_S) -> PolicyVersions:
        return PolicyVersions(self._r, self.prefix, grace_s=grace_s)

    async def vector_search(self) -> VectorSearch:
        with _unavailable():
            commands = await self._probe(args=list(SEARCH_COMMANDS))
            modules: Any = await self._r.module_list()
        return VectorSearch.from_probe(commands, modules)

    def _k(self, name: str) -> str:
        return self.prefix + name

    async def ping(self) -> bool:
        try:
            return bool(await self._r.ping())
        except ErrorTypes:
            return False

    async def store_id(self) -> str:
        with _unavailable():
            await self._r.hsetnx(self._k("meta"), "store_id", uuid.uuid4().hex)
            return text(await self._r.hget(self._k("meta"), "store_id"))

    async def tenant_salt(self, proposed: str) -> str:
        with _unavailable():
            await self._r.hsetnx(self._k("meta"), "tenant_salt", proposed)
            return text(await self._r.hget(self._k("meta"), "tenant_salt"))

    async def claim_embedding(self, model: str, dim: int) -> None:
        stamp = f"{model} dim={dim}"
        with _unavailable():
            if await self._r.hsetnx(self._k("meta"), "embedding", stamp):
                return
            have = text(await self._r.hget(self._k("meta"), "embedding"))
            if have == stamp:
                return
            count = int(await self._r.zcard(self._k("all")))
            if count:
                raise StoreMismatch(
                    f"redis {self.prefix!r}: the cache holds {count} records embedded with {have}, but this run "
                    f"embeds with {stamp}; vectors of different models cannot be compared. Run with the model "
                    "the cache was built with or use another redis key prefix or database"
                )
            await self._r.hset(self._k("meta"), "embedding", stamp)

    async def insert(self, record: Record) -> int:
        fields = encode(record)
        # the sweeper deletes an expired record (and tells every replica); Redis expiry is the backstop
        # for a cache no replica sweeps any more, so it never drops a record before its TTL
        now = time.time()
        backstop = int((min(max(record.expires_at, now), now + 3650 * 86400.0) + BACKSTOP_SECONDS) * 1000)
        args: list[bytes | str | int] = [self.prefix, self.stream_maxlen, backstop, record.cache_id, record.tenant]
        args += [record.session, record.intent, str(record.state), str(record.scope), fields["answer_bytes"]]
        args += [repr(record.created_at), repr(record.ready_at), repr(record.expires_at)]
        for name, value in fields.items():
            args += [name, value]
        with _unavailable():
            return int(await self._insert(args=args))

    async def _hashes(self, labels: Sequence[int], fields: Sequence[str] | None = None) -> list[dict[bytes, bytes]]:
        """The hashes of these labels in order, an empty dict where a label has none."""
        out: list[dict[bytes, bytes]] = []
        with _unavailable():
            for i in range(0, len(labels), BATCH):
                pipe = self._r.pipeline(transaction=False)
                for label in labels[i : i + BATCH]:
                    if fields is None:
                        pipe.hgetall(self._k(f"r:{label}"))
                    else:
                        pipe.hmget(self._k(f"r:{label}"), list(fields))
                for got in await pipe.execute():
                    if fields is None:
                        out.append(dict(got))
                    else:
                        out.append({f.encode(): v for f, v in zip(fields, got, strict=True) if v is not None})
        return out

    async def get(self, cache_id: str) -> Record | None:
        with _unavailable():
            label = await self._r.hget(self._k("id"), cache_id)
        if label is None:
            return None
        found = await self.get_many([int(label)])
        return found[0] if found else None

    async def get_many(self, labels: Sequence[int]) -> list[Record]:
        return [decode(h) for h in await self._hashes(list(labels)) if h]

    async def _candidates(self, sel: Selector) -> tuple[list[int], str]:
        """Labels that may match (a superset, from the narrowest index at hand) and the set they
        came from, so labels whose hash Redis expired can be cleaned from it."""
        r, k = self._r, self._k
        states = None if sel.states is None else frozenset(sel.states)
        with _unavailable():
            if sel.labels is not None:
                return list(sel.labels), ""
            if sel.cache_ids is not None:
                if not sel.cache_ids:
                    return [], ""
                got = await r.hmget(k("id"), list(sel.cache_ids))
                return [int(v) for v in got if v is not None], ""
            for key, wanted in (
                (f"s:{sel.tenant}\x1f{sel.session}", sel.tenant is not None and sel.session is not None),
                (f"t:{sel.tenant}", sel.tenant is not None),
                (f"i:{sel.intent}", sel.intent is not None),
            ):
                if wanted:
                    return as_labels(await r.smembers(k(key))), k(key)
            if states is not None and states <= LIVE:
                if sel.expired_before is not None:
                    return as_labels(await r.zrangebyscore(k("exp"), "-inf", sel.expired_before)), ""
                if states == {RecordState.PENDING} and sel.ready_before is not None:
                    return as_labels(await r.zrangebyscore(k("pending"), "-inf", sel.ready_before)), ""
                return as_labels(await r.zrange(k("live"), 0, -1)), ""
            if states is not None and states <= DEAD:
                top = "+inf" if sel.created_before is None else sel.created_before
                return as_labels(await r.zrangebyscore(k("dead"), "-inf", top)), ""
            return as_labels(await r.zrange(k("all"), 0, -1)), ""

    async def _select(self, sel: Selector, limit: int | None = None) -> list[Record]:
        """Selected records, large fields left empty, newest first; read a page at a time, so a
        ``limit`` (the admin listing) stops reading once it is reached."""
        candidates, source = await self._candidates(sel)
        ordered = sorted(set(candidates), reverse=True)
        out: list[Record] = []
        for i in range(0, len(ordered), BATCH):
            page = ordered[i : i + BATCH]
            metas = await self._hashes(page, META)
            gone = [label for label, h in zip(page, metas, strict=True) if not h]
            if gone:
                await self._clean(gone, source)
            out += [r for r in (decode(h) for h in metas if h) if sel.matches(r)]
            if limit is not None and len(out) >= limit:
                return out[:limit]
        return out

    async def _clean(self, labels: Sequence[int], source: str) -> None:
        with _unavailable():
            for i in range(0, len(labels), BATCH):
                await self._dangling(args=[self.prefix, self.stream_maxlen, source, *labels[i : i + BATCH]])

    async def find(self, selector: Selector, *, limit: int | None = None) -> list[Record]:
        chosen = await self._select(selector, limit)
        labels = [r.label for r in chosen if r.label is not None]
        full = {r.label: r for r in await self.get_many(labels)}
        return [full[label] for label in labels if label in full]

    async def refs(self, selector: Selector) -> list[Ref]:
        return [Ref(r.label or 0, r.cache_id) for r in await self._select(selector)]

    async def set_state(self, selector: Selector, state: RecordState) -> list[Ref]:
        labels = [r.label for r in await self._select(selector) if r.label is not None]
        out: list[Ref] = []
        with _unavailable():
            for i in range(0, len(labels), BATCH):
                args: list[Any] = [self.prefix, self.stream_maxlen, str(state), states_arg(selector.states)]
                out += pairs(await self._set_state(args=[*args, *labels[i : i + BATCH]]))
        return out

    async def promote_due(self, now: float) -> list[Ref]:
        return await self.set_state(Selector(states=(RecordState.PENDING,), ready_before=now), RecordState.READY)

    async def delete(self, selector: Selector) -> list[Ref]:
        labels = [r.label for r in await self._select(selector) if r.label is not None]
        out: list[Ref] = []
        with _unavailable():
            for i in range(0, len(labels), BATCH):
                args: list[Any] = [self.prefix, self.stream_maxlen, states_arg(selector.states), *labels[i : i + BATCH]]
                out += pairs(await self._delete(args=args))
            if selector.tenant is not None and selector.session is None:
                await self._r.delete(self._k(f"no:{selector.tenant}"))
                await self._forget_labels(args=[self.prefix, selector.tenant])
        return out

    async def refuse(self, tenant: str, request_hash: str, cache_ids: Collection[str], now: float) -> None:
        # ``now`` is not kept: the script orders a wording's refusals as they reach the server
        args: list[Any] = [self.prefix, tenant, request_hash, REFUSALS_PER_WORDING, *sorted(cache_ids)]
        with _unavailable():
            await self._refuse(args=args)

    async def refused(self, tenant: str, request_hash: str) -> frozenset[str]:
        with _unavailable():
            found = await self._r.hget(self._k(f"no:{tenant}"), request_hash)
        return frozenset(text(found).split())

    def _labels_key(self, tenant: str, intent: str) -> str:
        return self._k(f"lb:{tenant}\x1f{intent}")

    async def add_labels(self, tenant: str, labels: Sequence[Label]) -> None:
        """Each intent's list keeps the newest pushed, which are the newest labels but for one that
        reaches the server after newer ones of its intent (another replica's, a moment late)."""
        if not labels:
            return
        pushed: dict[str, list[bytes]] = {}
        for label in labels:
            pushed.setdefault(label.intent, []).append(label_json(label))
        with _unavailable():
            pipe = self._r.pipeline(transaction=True)
            for intent, encoded in pushed.items():
                key = self._labels_key(tenant, intent)
                pipe.rpush(key, *encoded)
                pipe.ltrim(key, -LABELS_KEPT, -1)
            pipe.sadd(self._k(f"lbi:{tenant}"), *pushed)
            await pipe.execute()

    async def labels(self, tenant: str, intent: str) -> list[Label]:
        """In time order: replicas push as their labels come, not always in the order they were made."""
        with _unavailable():
            raw: Any = await self._r.lrange(self._labels_key(tenant, intent), 0, -1)
        return sorted((label_of(intent, item) for item in raw), key=lambda label: label.at)

    async def add_feedback(self, cache_id: str, delta: float) -> float | None:
        with _unavailable():
            score = await self._feedback(args=[self.prefix, cache_id, repr(delta)])
        return None if score is None else float(score)

    def _last_key(self, tenant: str, session: str) -> str:
        return self._k(f"last:{tenant}\x1f{session}")

    async def set_session_last(self, tenant: str, session: str, last: SessionLast) -> None:
        with _unavailable():
            pipe = self._r.pipeline(transaction=True)
            self._queue_session_last(pipe, tenant, session, last)
            await pipe.execute()

    async def record_served(self, cache_id: str, now: float, tenant: str, session: str, last: SessionLast) -> None:
        with _unavailable():
            pipe = self._r.pipeline(transaction=True)
            await self._hit(args=[self.prefix, cache_id, repr(now)], client=pipe)
            self._queue_session_last(pipe, tenant, session, last)
            await pipe.execute()

    def _queue_session_last(self, pipe: Any, tenant: str, session: str, last: SessionLast) -> None:
        at = last.at or time.time()
        key = self._last_key(tenant, session)
        mapping = {"cache_id": last.cache_id, "served": int(last.served), "request_hash": last.request_hash, "at": at}
        pipe.hset(key, mapping=mapping)
        pipe.expire(key, int(SESSION_LAST_SECONDS))
        pipe.zadd(self._k("last_at"), {key: at})

    async def session_last(self, tenant: str, session: str) -> SessionLast | None:
        with _unavailable():
            h: Any = await self._r.hgetall(self._last_key(tenant, session))
        if not h:
            return None
        return SessionLast(text(h[b"cache_id"]), h[b"served"] == b"1", text(h[b"request_hash"]), float(h[b"at"]))

    async def purge_session_last(self, before: float) -> int:
        with _unavailable():
            return int(await self._purge_last(args=[self.prefix, repr(before)]))

    async def live_labels(self) -> list[int]:
        """Every live label, of every policy version (``index_rows`` reads only the serving one's)."""
        with _unavailable():
            return as_labels(await self._r.zrange(self._k("live"), 0, -1))

    async def iter_live(self) -> AsyncIterator[Record]:
        labels = await self.live_labels()
        for i in range(0, len(labels), BATCH):
            for record in await self.get_many(labels[i : i + BATCH]):
                if record.state in LIVE:
                    yield record

    async def index_rows(self, labels: Sequence[int], *, vectors: bool = True) -> list[IndexRow]:
        """The live ones of these labels as the index sees them (a replica applying the stream)."""
        fields = (*INDEX, *INDEX_TAIL) if vectors else (*(f for f in INDEX if f != "vector"), *INDEX_TAIL)
        version = None if self._serving is None else self._serving().encode()
        return [
            index_row(h)
            for h in await self._hashes(labels, (*fields, "policy_version"))
            if h and text(h[b"state"]) in LIVE and (version is None or h.get(b"policy_version") == version)
        ]

    async def iter_index_rows(self, *, vectors: bool = True) -> AsyncIterator[IndexRow]:
        labels = await self.live_labels()
        for i in range(0, len(labels), BATCH):
            for row in await self.index_rows(labels[i : i + BATCH], vectors=vectors):
                yield row

    async def vectors_of(self, labels: Sequence[int]) -> list[tuple[int, bytes]]:
        ordered = sorted(labels)
        found = await self._hashes(ordered, ("vector",))
        return [(label, bytes(h[b"vector"])) for label, h in zip(ordered, found, strict=True) if h]

    async def usage(self) -> list[Usage]:
        labels = await self.live_labels()
        fields = ("label", "cache_id", "last_hit_at", "created_at", "hit_count", "answer_bytes")
        out = []
        for h in await self._hashes(labels, fields):
            if h:
                last_use = max(float(h[b"last_hit_at"]), float(h[b"created_at"]))
                out.append(
                    Usage(
                        int(h[b"label"]),
                        h[b"cache_id"].decode(),
                        last_use,
                        int(h[b"hit_count"]),
                        int(h[b"answer_bytes"]),
                    )
                )
        return out

    async def counts(self) -> list[Count]:
        with _unavailable():
            raw: Any = await self._r.hgetall(self._k("counts"))
        out = []
        for name, n in raw.items():
            if int(n) > 0:
                state, scope, intent = name.decode().split("\x1f")
                out.append(Count(state, scope, intent, int(n)))
        return out

    async def answer_bytes(self) -> int:
        with _unavailable():
            return int(await self._r.get(self._k("bytes")) or 0)

    async def stream_position(self) -> StreamPosition:
        """Where the stream stands: a replica that has read every record applies it from here."""
        return await self._stream.position()

    async def changes(self, after: StreamPosition, *, block_ms: int = 1000, count: int = 1000) -> Changes:
        """Events after ``after``, waiting up to ``block_ms`` for the first (``EventStream.changes``)."""
        return await self._stream.changes(after, block_ms=block_ms, count=count)
