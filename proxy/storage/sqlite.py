"""Records: the RecordStore protocol and its SQLite implementation (aiosqlite, WAL).

SQLite is the source of truth. A record's integer ``label`` is its row id and its label in
the vector index, so the index can always be rebuilt from this file.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiosqlite
import orjson

from proxy.model import LIVE_STATES, Record, SessionLast

# what the vector index and its filter need of a record (see SemanticCache.load), in this order
INDEX_COLUMNS = (
    "label",
    "vector",
    "LENGTH(CAST(answer_text AS BLOB))",
    "tenant",
    "session",
    "user",
    "scope",
    "model",
    "system_prompt_version",
    "namespace",
    "intent",
)
FETCH_BATCH = 1000  # rows per hop to aiosqlite's thread when reading many


_COLUMNS = [f.name for f in dataclasses.fields(Record)]
_JSON_COLUMNS = ("coarse_tags", "key_facts")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
  label INTEGER PRIMARY KEY AUTOINCREMENT,
  cache_id TEXT UNIQUE NOT NULL,
  tenant TEXT NOT NULL, user TEXT, scope TEXT NOT NULL, session TEXT NOT NULL, namespace TEXT NOT NULL,
  context_fingerprint TEXT NOT NULL, intent TEXT NOT NULL, coarse_tags TEXT NOT NULL, vector BLOB NOT NULL,
  qvector BLOB NOT NULL,
  answer_text TEXT NOT NULL, key_facts TEXT NOT NULL, model TEXT NOT NULL,
  system_prompt_version TEXT NOT NULL, policy_version TEXT NOT NULL, request_hash TEXT NOT NULL,
  state TEXT NOT NULL, created_at REAL NOT NULL, ready_at REAL NOT NULL, expires_at REAL NOT NULL,
  hit_count INTEGER NOT NULL DEFAULT 0, last_hit_at REAL NOT NULL DEFAULT 0,
  feedback_score REAL NOT NULL DEFAULT 1.0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
  completion_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS records_session ON records(tenant, session, state);
CREATE INDEX IF NOT EXISTS records_state ON records(state, ready_at);
CREATE INDEX IF NOT EXISTS records_fp ON records(context_fingerprint);
CREATE INDEX IF NOT EXISTS records_request ON records(tenant, session, request_hash);
-- the sweeper's queries, every few seconds: expiry reads only what expired, the gauges only this index
CREATE INDEX IF NOT EXISTS records_expiry ON records(expires_at);
CREATE INDEX IF NOT EXISTS records_counts ON records(state, scope, intent);
CREATE TABLE IF NOT EXISTS session_last (
  tenant TEXT NOT NULL, session TEXT NOT NULL, cache_id TEXT NOT NULL, served INTEGER NOT NULL,
  request_hash TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (tenant, session)
);
CREATE INDEX IF NOT EXISTS session_last_at ON session_last(at);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StoreMismatch(ValueError):
    """A data directory written under another embedding model: its vectors live in another space."""


class RecordStore(Protocol):
    async def insert(self, record: Record) -> int: ...
    async def get_many(self, labels: Sequence[int]) -> list[Record]: ...
    async def get(self, cache_id: str) -> Record | None: ...
    async def set_state(self, cache_ids: Iterable[str], state: str) -> int: ...
    async def promote_due(self, now: float) -> list[Record]: ...
    async def find_by_request(self, tenant: str, session: str, request_hash: str) -> list[Record]: ...
    async def record_hit(self, cache_id: str, now: float) -> None: ...
    async def add_feedback(self, cache_id: str, delta: float) -> float | None: ...
    async def set_session_last(self, tenant: str, session: str, last: SessionLast) -> None: ...
    async def session_last(self, tenant: str, session: str) -> SessionLast | None: ...
    async def select_labels(self, where: str, params: Sequence[Any]) -> list[tuple[int, str]]: ...
    def iter_live(self) -> AsyncIterator[Record]: ...
    def iter_index_rows(self, *, vectors: bool = True) -> AsyncIterator[tuple[Any, ...]]: ...
    async def vectors_of(self, labels: Sequence[int]) -> list[tuple[int, bytes]]: ...
    async def counts(self) -> list[tuple[str, str, str, int]]: ...
    async def close(self) -> None: ...


class SqliteStore:
    def __init__(self, conn: aiosqlite.Connection, path: Path) -> None:
        self._db = conn
        self.path = path

    @classmethod
    async def open(cls, path: Path) -> SqliteStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = await aiosqlite.connect(path)
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=NORMAL")
        await conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        await conn.executescript(_SCHEMA)
        await conn.commit()
        return cls(conn, path)

    async def close(self) -> None:
        await self._db.close()

    async def store_id(self) -> str:
        """A random id minted with the database: files derived from it (the index snapshot) name
        it, so a database deleted and created afresh, whose labels restart at 1, never adopts them."""
        async with self._db.execute("SELECT value FROM meta WHERE key = 'store_id'") as cur:
            row = await cur.fetchone()
        if row is not None:
            return str(row[0])
        minted = uuid.uuid4().hex
        await self._db.execute("INSERT INTO meta (key, value) VALUES ('store_id', ?)", (minted,))
        await self._db.commit()
        return minted

    async def claim_embedding(self, model: str, dim: int) -> None:
        """Stamp an empty store with the embedding model, or refuse one stamped with another: vectors of
        two models are not comparable even at the same dimension, so a mixed index matches nonsense."""
        stamp = f"{model} dim={dim}"
        async with self._db.execute("SELECT value FROM meta WHERE key = 'embedding'") as cur:
            row = await cur.fetchone()
        if row is None:
            async with self._db.execute("SELECT COUNT(*) FROM records") as cur:
                count = (await cur.fetchone() or (0,))[0]
            if count:
                # Written before stamps existed (the default pack then); trust it only at that shape.
                stamp_old = f"e5-small-multilingual dim={dim}"
                if stamp != stamp_old:
                    raise StoreMismatch(self._mismatch(stamp, "an unrecorded model", count))
            await self._db.execute("INSERT INTO meta (key, value) VALUES ('embedding', ?)", (stamp,))
            await self._db.commit()
        elif row[0] != stamp:
            async with self._db.execute("SELECT COUNT(*) FROM records") as cur:
                count = (await cur.fetchone() or (0,))[0]
            if count == 0:
                await self._db.execute("UPDATE meta SET value = ? WHERE key = 'embedding'", (stamp,))
                await self._db.commit()
            else:
                raise StoreMismatch(self._mismatch(stamp, row[0], count))

    def _mismatch(self, want: str, have: str, count: int) -> str:
        return (
            f"{self.path}: the cache holds {count} records embedded with {have}, but this run embeds with "
            f"{want}; vectors of different models cannot be compared. Run with the model the cache was "
            f"built with, use another data_dir, or delete {self.path.name}* to start the cache afresh"
        )

    @staticmethod
    def _row(row: Sequence[Any], names: Sequence[str]) -> Record:
        values = dict(zip(names, row, strict=True))
        for key in _JSON_COLUMNS:
            values[key] = orjson.loads(values[key])
        return Record(**values)

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Record]:
        async with self._db.execute(sql, params) as cur:
            names = [d[0] for d in cur.description]
            return [self._row(r, names) for r in await cur.fetchall()]

    async def insert(self, record: Record) -> int:
        values = dataclasses.asdict(record)
        values.pop("label")
        for key in _JSON_COLUMNS:
            values[key] = orjson.dumps(values[key]).decode()
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        cur = await self._db.execute(f"INSERT INTO records ({cols}) VALUES ({marks})", list(values.values()))
        await self._db.commit()
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    async def get_many(self, labels: Sequence[int]) -> list[Record]:
        if not labels:
            return []
        marks = ", ".join("?" for _ in labels)
        return await self._fetch(f"SELECT * FROM records WHERE label IN ({marks})", list(labels))

    async def get(self, cache_id: str) -> Record | None:
        rows = await self._fetch("SELECT * FROM records WHERE cache_id = ?", (cache_id,))
        return rows[0] if rows else None

    async def set_state(self, cache_ids: Iterable[str], state: str) -> int:
        ids = list(cache_ids)
        if not ids:
            return 0
        marks = ", ".join("?" for _ in ids)
        cur = await self._db.execute(f"UPDATE records SET state = ? WHERE cache_id IN ({marks})", [state, *ids])
        await self._db.commit()
        return cur.rowcount

    async def promote_due(self, now: float) -> list[Record]:
        due = await self._fetch("SELECT * FROM records WHERE state = 'pending' AND ready_at <= ?", (now,))
        if due:
            await self.set_state([r.cache_id for r in due], "ready")
        return [dataclasses.replace(r, state="ready") for r in due]

    async def find_by_request(self, tenant: str, session: str, request_hash: str) -> list[Record]:
        return await self._fetch(
            "SELECT * FROM records WHERE tenant = ? AND session = ? AND request_hash = ? AND state IN (?, ?)",
            (tenant, session, request_hash, *LIVE_STATES),
        )

    async def record_hit(self, cache_id: str, now: float) -> None:
        await self._db.execute(
            "UPDATE records SET hit_count = hit_count + 1, last_hit_at = ? WHERE cache_id = ?", (now, cache_id)
        )
        await self._db.commit()

    async def add_feedback(self, cache_id: str, delta: float) -> float | None:
        await self._db.execute(
            "UPDATE records SET feedback_score = MAX(0.0, MIN(1.0, feedback_score + ?)) WHERE cache_id = ?",
            (delta, cache_id),
        )
        await self._db.commit()
        async with self._db.execute("SELECT feedback_score FROM records WHERE cache_id = ?", (cache_id,)) as cur:
            row = await cur.fetchone()
        return float(row[0]) if row else None

    async def set_session_last(self, tenant: str, session: str, last: SessionLast) -> None:
        await self._db.execute(
            "INSERT INTO session_last (tenant, session, cache_id, served, request_hash, at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(tenant, session) DO UPDATE SET cache_id = excluded.cache_id, "
            "served = excluded.served, request_hash = excluded.request_hash, at = excluded.at",
            (tenant, session, last.cache_id, int(last.served), last.request_hash, last.at or time.time()),
        )
        await self._db.commit()

    async def purge_session_last(self, before: float) -> int:
        """Forget the last answers of sessions idle since ``before``: one row per conversation ever
        seen would otherwise grow without bound."""
        cur = await self._db.execute("DELETE FROM session_last WHERE at <= ?", (before,))
        await self._db.commit()
        return cur.rowcount

    async def session_last(self, tenant: str, session: str) -> SessionLast | None:
        async with self._db.execute(
            "SELECT cache_id, served, request_hash, at FROM session_last WHERE tenant = ? AND session = ?",
            (tenant, session),
        ) as cur:
            row = await cur.fetchone()
        return SessionLast(str(row[0]), bool(row[1]), str(row[2]), float(row[3])) if row else None

    async def select_labels(self, where: str, params: Sequence[Any]) -> list[tuple[int, str]]:
        """Labels and ids matching a WHERE clause built by trusted code (never from user text)."""
        async with self._db.execute(f"SELECT label, cache_id FROM records WHERE {where}", params) as cur:
            return [(int(r[0]), str(r[1])) for r in await cur.fetchall()]

    async def expired(self, now: float) -> list[tuple[int, str]]:
        """Labels and ids of live records past their TTL. Through the expiry index by name: without
        statistics SQLite would pick the state index, i.e. read every live record each sweep."""
        async with self._db.execute(
            "SELECT label, cache_id FROM records INDEXED BY records_expiry WHERE expires_at <= ? AND state IN (?, ?)",
            (now, *LIVE_STATES),
        ) as cur:
            return [(int(r[0]), str(r[1])) for r in await cur.fetchall()]

    async def delete(self, cache_ids: Iterable[str]) -> int:
        ids = list(cache_ids)
        if not ids:
            return 0
        marks = ", ".join("?" for _ in ids)
        cur = await self._db.execute(f"DELETE FROM records WHERE cache_id IN ({marks})", ids)
        await self._db.commit()
        await self._db.execute("PRAGMA incremental_vacuum(256)")
        return cur.rowcount

    async def iter_live(self) -> AsyncIterator[Record]:
        async with self._db.execute("SELECT * FROM records WHERE state IN (?, ?) ORDER BY label", LIVE_STATES) as cur:
            names = [d[0] for d in cur.description]
            # batched: iterating an aiosqlite cursor row by row costs one thread hop per row
            while rows := await cur.fetchmany(FETCH_BATCH):
                for row in rows:
                    yield self._row(row, names)

    async def iter_index_rows(self, *, vectors: bool = True) -> AsyncIterator[tuple[Any, ...]]:
        """``INDEX_COLUMNS`` of every live record in label order: start-up and compaction read every
        record, so they skip answers and tags (no JSON to parse, far less garbage). Without
        ``vectors`` the vector column is None (a start from an index snapshot needs none)."""
        columns = INDEX_COLUMNS if vectors else tuple("NULL" if c == "vector" else c for c in INDEX_COLUMNS)
        async with self._db.execute(
            f"SELECT {', '.join(columns)} FROM records WHERE state IN (?, ?) ORDER BY label", LIVE_STATES
        ) as cur:
            while rows := await cur.fetchmany(FETCH_BATCH):
                for row in rows:
                    yield tuple(row)

    async def vectors_of(self, labels: Sequence[int]) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        for start in range(0, len(labels), FETCH_BATCH):
            chunk = list(labels[start : start + FETCH_BATCH])
            marks = ", ".join("?" for _ in chunk)
            async with self._db.execute(
                f"SELECT label, vector FROM records WHERE label IN ({marks}) ORDER BY label", chunk
            ) as cur:
                out += [(int(a), bytes(b)) for a, b in await cur.fetchall()]
        return out

    async def counts(self) -> list[tuple[str, str, str, int]]:
        async with self._db.execute(
            "SELECT state, scope, intent, COUNT(*) FROM records GROUP BY state, scope, intent"
        ) as cur:
            return [(str(a), str(b), str(c), int(n)) for a, b, c, n in await cur.fetchall()]

    async def usage_rows(self) -> list[tuple[int, str, float, int, int]]:
        """(label, cache_id, last use, hit count, answer bytes) of live records, for eviction."""
        async with self._db.execute(
            "SELECT label, cache_id, MAX(last_hit_at, created_at), hit_count, LENGTH(CAST(answer_text AS BLOB)) "
            "FROM records WHERE state IN (?, ?)",
            LIVE_STATES,
        ) as cur:
            return [(int(a), str(b), float(c), int(d), int(e)) for a, b, c, d, e in await cur.fetchall()]

    async def answer_bytes(self) -> int:
        async with self._db.execute(
            "SELECT COALESCE(SUM(LENGTH(CAST(answer_text AS BLOB))), 0) FROM records WHERE state IN (?, ?)",
            LIVE_STATES,
        ) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0
