"""The SQLite record store (aiosqlite, WAL): the embedded default. Its SQL (schema, selectors as
WHERE clauses, row codecs) is ``proxy.storage.sqlite_sql``; this module is the connection and how
writes take turns on it.

SQLite is the source of truth. A record's integer ``label`` is its row id and its label in
the vector index, so the index can always be rebuilt from this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from proxy.core.learning import Label
from proxy.core.lru import LruDict
from proxy.core.model import LIVE_STATES, Record, RecordState, SessionLast
from proxy.storage.base import (
    LABELS_KEPT,
    REFUSALS_PER_WORDING,
    Count,
    IndexRow,
    Ref,
    Selector,
    StoreMismatch,
    StoreUnavailable,
    Usage,
)
from proxy.storage.recent import RecentRecords
from proxy.storage.sqlite_sql import (
    ADD_LABEL,
    ANSWER_BYTES,
    COUNTS,
    FORGET_LABELS,
    FORGET_REFUSALS,
    HIT,
    ID_CHUNK,
    LABELS,
    LIVE,
    LIVE_IN,
    RECORD_COLUMNS,
    REFUSE,
    REFUSED,
    SCHEMA,
    SELECT_RECORDS,
    SESSION_LAST,
    SET_SESSION_LAST,
    TRIM_LABELS,
    TRIM_REFUSALS,
    USAGE,
    chunks,
    index_columns,
    index_row,
    label_of,
    label_row,
    marks,
    record_of,
    record_row,
    session_last_row,
    stamped,
    where_clause,
)

__all__ = ["SqliteStore", "StoreMismatch"]

# What SQLite says when the disk cannot take a write: the store is then out of service for
# writes, as a shared store that is down is, while reads go on.
_NO_ROOM = ("database or disk is full", "disk i/o error")


def _no_room(exc: sqlite3.OperationalError) -> bool:
    return any(words in str(exc).lower() for words in _NO_ROOM)


T = TypeVar("T")
FETCH_BATCH = 1000  # rows per hop to aiosqlite's thread when reading many
LAST_ANSWERS = 32_768  # sessions whose last answer is kept in memory (``SqliteStore.session_last``)
REFUSED_WORDINGS = 8_192  # wordings whose refusals (most often none) are kept in memory (``SqliteStore.refused``)


class SqliteStore:
    """``RecordStore`` on one SQLite file and one connection. aiosqlite runs its statements one at
    a time on one thread, but the steps of one write (a statement, reading what it returns, the
    commit) are separate hops that other requests' steps can fall between; and SQLite refuses to
    commit while another write statement is still open. So each write holds ``_write_lock`` from
    its first statement to its commit; reads go between them freely (WAL).

    The writes every request makes (an answer, a hit's count, a session's last answer, a thumb)
    run instead as one function on the connection's thread, statements and commit in one hop
    (``_at_once``), and take the lock only while another write holds it. Under load each hop
    waits its turn on a busy event loop, and a lock held across two or three of them, then handed
    on, queued every write of the process behind it (benchmarks/soak.py --phases load --rate R
    shows it in the ``store`` stage's time)."""

    def __init__(self, conn: aiosqlite.Connection, path: Path) -> None:
        self._db = conn
        self.path = path
        self._write_lock = asyncio.Lock()
        # (tenant, session) -> (its last answer, or None for none yet): see ``session_last``
        self._lasts: LruDict[tuple[str, str], tuple[SessionLast | None]] = LruDict(LAST_ANSWERS)
        self._recent = RecentRecords()
        # (tenant, request hash) -> the cache ids the judge refused for it: see ``refused``
        self._refusals: LruDict[tuple[str, str], frozenset[str]] = LruDict(REFUSED_WORDINGS)

    @classmethod
    async def open(cls, path: Path) -> SqliteStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = await aiosqlite.connect(path)
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=NORMAL")
        await conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        # a deleted answer is overwritten, not left in a free page (a purged tenant's especially)
        await conn.execute("PRAGMA secure_delete=ON")
        await conn.executescript(SCHEMA)
        await conn.commit()
        return cls(conn, path)

    async def close(self) -> None:
        await self._db.close()

    async def scrub(self) -> None:
        """Deleted rows are zeroed in the database file (secure_delete, set at open), but their old
        pages stay in the write-ahead log until a checkpoint: move the log into the database and
        truncate it."""
        async with self._write_lock, self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)") as cur:
            await cur.fetchall()

    @contextlib.asynccontextmanager
    async def _writing(self) -> AsyncIterator[None]:
        """One write and its commit. One the disk cannot take is rolled back whole and refused as
        StoreUnavailable: the request it came from still gets its answer, the answer is simply not
        kept, and nothing half-written stays."""
        try:
            async with self._write_lock:
                yield
                await self._db.commit()
        except sqlite3.OperationalError as exc:
            if not _no_room(exc):
                raise
            with contextlib.suppress(sqlite3.Error):
                await self._db.rollback()
            raise StoreUnavailable(f"{self.path.name}: {exc}") from exc

    async def _at_once(self, write: Callable[[sqlite3.Connection], T]) -> T:
        """``write`` and its commit as one hop of the connection's thread; rolled back whole and
        refused as StoreUnavailable where the disk cannot take it, as ``_writing``."""

        def run(conn: sqlite3.Connection) -> T:
            try:
                out = write(conn)
                conn.commit()
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.rollback()
                raise
            return out

        try:
            if not self._write_lock.locked():
                # enqueued before this coroutine can yield (aiosqlite's queue is first in, first
                # out), so no write of several hops can have begun in between
                return await self._on_thread(run)
            async with self._write_lock:
                return await self._on_thread(run)
        except sqlite3.OperationalError as exc:
            if not _no_room(exc):
                raise
            raise StoreUnavailable(f"{self.path.name}: {exc}") from exc

    async def _on_thread(self, run: Callable[[sqlite3.Connection], T]) -> T:
        # aiosqlite runs a function on its connection's thread only through this private method;
        # tests/storage/test_sqlite.py exercises it, so a release without it fails the tests
        db = self._db
        return await db._execute(lambda: run(db._conn))  # type: ignore[no-untyped-call,no-any-return]

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = list(await self._db.execute_fetchall(sql, params))
        return rows[0][0] if rows else None

    async def store_id(self) -> str:
        found = await self._one("SELECT value FROM meta WHERE key = 'store_id'")
        if found is not None:
            return str(found)
        minted = uuid.uuid4().hex
        async with self._writing():
            await self._db.execute("INSERT INTO meta (key, value) VALUES ('store_id', ?)", (minted,))
        return minted

    async def tenant_salt(self, proposed: str) -> str:
        return proposed  # one replica: the salt file in its data_dir is the one in force

    async def claim_embedding(self, model: str, dim: int) -> None:
        stamp = f"{model} dim={dim}"
        have = await self._one("SELECT value FROM meta WHERE key = 'embedding'")
        count = int(await self._one("SELECT COUNT(*) FROM records") or 0)
        if have is None:
            # Written before stamps existed (the default pack then); trust it only at that shape.
            if count and stamp != f"e5-small-multilingual dim={dim}":
                raise StoreMismatch(self._mismatch(stamp, "an unrecorded model", count))
            async with self._writing():
                await self._db.execute("INSERT INTO meta (key, value) VALUES ('embedding', ?)", (stamp,))
        elif have != stamp:
            if count:
                raise StoreMismatch(self._mismatch(stamp, str(have), count))
            async with self._writing():
                await self._db.execute("UPDATE meta SET value = ? WHERE key = 'embedding'", (stamp,))

    def _mismatch(self, want: str, have: str, count: int) -> str:
        return (
            f"{self.path}: the cache holds {count} records embedded with {have}, but this run embeds with "
            f"{want}; vectors of different models cannot be compared. Run with the model the cache was "
            f"built with, use another data_dir, or delete {self.path.name}* to start the cache afresh"
        )

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Record]:
        """``sql`` selects ``SELECT_RECORDS``'s columns."""
        return [record_of(r, RECORD_COLUMNS) for r in await self._db.execute_fetchall(sql, params)]

    async def insert(self, record: Record) -> int:
        values = record_row(record)
        sql = f"INSERT INTO records ({', '.join(values)}) VALUES ({marks(len(values))})"

        def insert(conn: sqlite3.Connection) -> int:
            label = conn.execute(sql, list(values.values())).lastrowid
            assert label is not None
            return int(label)

        since = self._recent.changes
        label = await self._at_once(insert)
        # kept as a read of the row would return it: the session's next turn reads it as a
        # candidate, most often before anything changes it
        row = {**values, "label": label}
        self._recent.keep([record_of([row[c] for c in RECORD_COLUMNS], RECORD_COLUMNS)], since)
        return label

    async def get(self, cache_id: str) -> Record | None:
        rows = await self._fetch(f"{SELECT_RECORDS} FROM records WHERE cache_id = ?", (cache_id,))
        return rows[0] if rows else None

    async def get_many(self, labels: Sequence[int]) -> list[Record]:
        """Records by label, whatever their state: those written or read lately from memory
        (``proxy.storage.recent``), the rest from the file."""
        found, missing = self._recent.take(labels)
        if missing:
            since = self._recent.changes
            read = await self.find(Selector(labels=tuple(missing), states=None))
            self._recent.keep(read, since)
            found += read
        return sorted(found, key=lambda r: -(r.label or 0))

    async def find(self, selector: Selector, *, limit: int | None = None) -> list[Record]:
        out: list[Record] = []
        for sel in chunks(selector):
            table, where, params = where_clause(sel)
            tail = "" if limit is None else f" LIMIT {int(limit)}"
            out += await self._fetch(f"{SELECT_RECORDS} FROM {table} WHERE {where} ORDER BY label DESC{tail}", params)
        out.sort(key=lambda r: -(r.label or 0))
        return out if limit is None else out[:limit]

    async def _refs(self, sql: str, params: Sequence[Any]) -> list[Ref]:
        async with self._db.execute(sql, params) as cur:
            return [Ref(int(a), str(b)) for a, b in await cur.fetchall()]

    async def refs(self, selector: Selector) -> list[Ref]:
        out: list[Ref] = []
        for sel in chunks(selector):
            table, where, params = where_clause(sel)
            out += await self._refs(f"SELECT label, cache_id FROM {table} WHERE {where}", params)
        return out

    async def set_state(self, selector: Selector, state: RecordState) -> list[Ref]:
        out: list[Ref] = []
        self._recent.changing()
        async with self._writing():
            for sel in chunks(selector):
                table, where, params = where_clause(sel)
                out += await self._refs(
                    f"UPDATE {table} SET state = ? WHERE {where} RETURNING label, cache_id", [str(state), *params]
                )
        self._recent.forget(ref.label for ref in out)
        if state not in LIVE_STATES:
            self._forget_refusals_of(out)
        return out

    async def promote_due(self, now: float) -> list[Ref]:
        return await self.set_state(Selector(states=(RecordState.PENDING,), ready_before=now), RecordState.READY)

    async def delete(self, selector: Selector) -> list[Ref]:
        out: list[Ref] = []
        purge = selector.tenant is not None and selector.session is None
        self._recent.changing()
        async with self._writing():
            for sel in chunks(selector):
                table, where, params = where_clause(sel)
                out += await self._refs(f"DELETE FROM {table} WHERE {where} RETURNING label, cache_id", params)
            if purge:
                await (await self._db.execute(FORGET_REFUSALS, (selector.tenant,))).close()
                await (await self._db.execute(FORGET_LABELS, (selector.tenant,))).close()
        self._recent.forget(ref.label for ref in out)
        if purge:
            self._refusals = LruDict(REFUSED_WORDINGS)  # a purge is rare: forget every wording's
        self._forget_refusals_of(out)
        if out:
            async with self._writing():
                await (await self._db.execute("PRAGMA incremental_vacuum(256)")).close()
        return out

    def _forget_refusals_of(self, gone: Sequence[Ref]) -> None:
        """The file's triggers took these records' refusals; the memory of them goes too."""
        if gone:
            ids = {ref.cache_id for ref in gone}
            self._refusals.drop_where(lambda refused: not ids.isdisjoint(refused))

    async def refuse(self, tenant: str, request_hash: str, cache_ids: Collection[str], now: float) -> None:
        key, ids = (tenant, request_hash), sorted(cache_ids)
        if (known := self._refusals.get(key)) is not None:
            # known at once to the next request of this wording, which may come before the hop returns
            self._refusals.put(key, known | frozenset(ids))

        def refuse(conn: sqlite3.Connection) -> frozenset[str]:
            conn.executemany(REFUSE, [(tenant, request_hash, now, cache_id, *LIVE) for cache_id in ids])
            conn.execute(TRIM_REFUSALS, (*key, *key, REFUSALS_PER_WORDING))
            return frozenset(cache_id for (cache_id,) in conn.execute(REFUSED, key))

        try:
            self._refusals.put(key, await self._at_once(refuse))
        except BaseException:
            self._refusals.pop(key)  # what the file holds is read again
            raise

    async def refused(self, tenant: str, request_hash: str) -> frozenset[str]:
        """From memory where this wording was met lately: one proxy owns its data directory, so what
        this store wrote or read is what the file holds (as ``session_last``). A cache id is never
        minted twice, so one of a record gone meanwhile names nothing the judge could be asked."""
        key = (tenant, request_hash)
        if (known := self._refusals.get(key)) is not None:
            return known
        found = frozenset(str(cache_id) for (cache_id,) in await self._db.execute_fetchall(REFUSED, key))
        if (known := self._refusals.get(key)) is not None:
            return known  # refused again while this read was off the loop
        self._refusals.put(key, found)
        return found

    async def add_labels(self, tenant: str, labels: Sequence[Label]) -> None:
        if not labels:
            return
        rows = [label_row(tenant, label) for label in labels]
        intents = sorted({label.intent for label in labels})

        def add(conn: sqlite3.Connection) -> None:
            conn.executemany(ADD_LABEL, rows)
            for intent in intents:
                conn.execute(TRIM_LABELS, (tenant, intent, LABELS_KEPT))

        await self._at_once(add)

    async def labels(self, tenant: str, intent: str) -> list[Label]:
        return [label_of(row) for row in await self._db.execute_fetchall(LABELS, (tenant, intent))]

    async def record_served(self, cache_id: str, now: float, tenant: str, session: str, last: SessionLast) -> None:
        last = stamped(last)

        def served(conn: sqlite3.Connection) -> None:
            conn.execute(HIT, (now, cache_id))
            conn.execute(SET_SESSION_LAST, session_last_row(tenant, session, last))

        await self._at_once(served)
        self._lasts.put((tenant, session), (last,))

    async def add_feedback(self, cache_id: str, delta: float) -> float | None:
        def add(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                "UPDATE records SET feedback_score = MAX(0.0, MIN(1.0, feedback_score + ?)) WHERE cache_id = ? "
                "RETURNING feedback_score, label",
                (delta, cache_id),
            ).fetchall()

        self._recent.changing()
        rows = await self._at_once(add)
        self._recent.forget(label for _, label in rows)
        return float(rows[0][0]) if rows else None

    async def set_session_last(self, tenant: str, session: str, last: SessionLast) -> None:
        last = stamped(last)
        row = session_last_row(tenant, session, last)
        await self._at_once(lambda conn: conn.execute(SET_SESSION_LAST, row).close())
        self._lasts.put((tenant, session), (last,))

    async def purge_session_last(self, before: float) -> int:
        async with self._writing():
            cur = await self._db.execute("DELETE FROM session_last WHERE at <= ?", (before,))
        self._lasts.drop_where(lambda kept: kept[0] is not None and kept[0].at <= before)
        return cur.rowcount

    async def session_last(self, tenant: str, session: str) -> SessionLast | None:
        """Every request reads it first, and from the file that is a hop to the connection's thread
        queued behind every write-back in flight. One proxy owns a data directory while it serves
        (``proxy.service.datadir.data_dir_lock``), so what this store wrote or read is what the file holds
        until it writes again: a session met lately is answered from memory."""
        if (known := self._lasts.get((tenant, session))) is not None:
            return known[0]
        rows = list(await self._db.execute_fetchall(SESSION_LAST, (tenant, session)))
        found = SessionLast(str(rows[0][0]), bool(rows[0][1]), str(rows[0][2]), float(rows[0][3])) if rows else None
        if (known := self._lasts.get((tenant, session))) is not None:
            return known[0]  # written while this read was off the loop: newer than the row it read
        self._lasts.put((tenant, session), (found,))
        return found

    async def iter_live(self) -> AsyncIterator[Record]:
        async with self._db.execute(f"SELECT * FROM records WHERE {LIVE_IN} ORDER BY label", LIVE) as cur:
            names = [d[0] for d in cur.description]
            # batched: iterating an aiosqlite cursor row by row costs one thread hop per row
            while rows := await cur.fetchmany(FETCH_BATCH):
                for row in rows:
                    yield record_of(row, names)

    async def iter_index_rows(self, *, vectors: bool = True) -> AsyncIterator[IndexRow]:
        columns = index_columns(vectors)
        # a scan in the table's own (label) order: by records_state the planner fetches each row by
        # a lookup of its own and sorts them all again (bench_store.py --records 1000000 times the start)
        async with self._db.execute(
            f"SELECT {', '.join(columns)} FROM records NOT INDEXED WHERE {LIVE_IN} ORDER BY label",
            LIVE,
        ) as cur:
            while rows := await cur.fetchmany(FETCH_BATCH):
                for row in rows:
                    yield index_row(row)

    async def live_labels(self) -> list[int]:
        # records_state covers it: the table itself is not read
        async with self._db.execute(f"SELECT label FROM records WHERE {LIVE_IN}", LIVE) as cur:
            return [label for (label,) in await cur.fetchall()]

    async def index_rows(self, labels: Sequence[int], *, vectors: bool = True) -> list[IndexRow]:
        columns = index_columns(vectors)
        out: list[IndexRow] = []
        for start in range(0, len(labels), ID_CHUNK):
            chunk = list(labels[start : start + ID_CHUNK])
            async with self._db.execute(
                f"SELECT {', '.join(columns)} FROM records WHERE label IN ({marks(len(chunk))}) "
                f"AND {LIVE_IN} ORDER BY label",
                [*chunk, *LIVE],
            ) as cur:
                out += map(index_row, await cur.fetchall())
        return out

    async def vectors_of(self, labels: Sequence[int]) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        for start in range(0, len(labels), FETCH_BATCH):
            chunk = list(labels[start : start + FETCH_BATCH])
            async with self._db.execute(
                f"SELECT label, vector FROM records WHERE label IN ({marks(len(chunk))}) ORDER BY label", chunk
            ) as cur:
                out += [(int(a), bytes(b)) for a, b in await cur.fetchall()]
        return out

    async def counts(self) -> list[Count]:
        async with self._db.execute(COUNTS) as cur:
            return [Count(str(a), str(b), str(c), int(n)) for a, b, c, n in await cur.fetchall()]

    async def usage(self) -> list[Usage]:
        async with self._db.execute(USAGE, LIVE) as cur:
            return [Usage(int(a), str(b), float(c), int(d), int(e)) for a, b, c, d, e in await cur.fetchall()]

    async def answer_bytes(self) -> int:
        return int(await self._one(ANSWER_BYTES, LIVE) or 0)
