"""The SQL of the SQLite store (``proxy.storage.sqlite``): its schema, a ``Selector`` as a WHERE
clause, and rows to records and back; no connection (the store owns it).

Only column names written here reach the SQL text; every value is a parameter.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from proxy.core.learning import Label, Source
from proxy.core.model import LIVE_STATES, KeyFacts, Record, RecordTags, SessionLast
from proxy.storage.base import INTERNED_ORDER, IndexKey, IndexRow, Selector

# what the vector index and its filter need of a record (see IndexRow): its label, its vector and
# its key's fields in IndexKey.interned's order (the answer's size is computed, not stored)
INDEX_COLUMNS = (
    "label",
    "vector",
    *("LENGTH(CAST(answer_text AS BLOB))" if f == "answer_bytes" else f for f in INTERNED_ORDER),
)
ID_CHUNK = 500  # ids per statement: far below SQLite's bound on host parameters

# named, not ``*``: a read then knows its columns without a cursor, in one hop to the SQLite thread
RECORD_COLUMNS = tuple(f.name for f in dataclasses.fields(Record))
SELECT_RECORDS = "SELECT " + ", ".join(RECORD_COLUMNS)
# selector fields that are one column compared for equality
EQUAL = (
    "tenant",
    "session",
    "user",
    "namespace",
    "model",
    "system_prompt_version",
    "policy_version",
    "intent",
    "context_fingerprint",
    "request_hash",
)

# the live states as the schema's triggers name them: constants of this module, not values
_LIVE_VALUES = ", ".join(f"'{s}'" for s in LIVE_STATES)
SCHEMA = f"""
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
-- the judge's refusals (RecordStore.refuse): a data directory written before them gains the table
-- and its triggers when it is next opened; the triggers take a record's refusals in the very
-- statement that retires or deletes it, whichever path that comes by
CREATE TABLE IF NOT EXISTS refusals (
  tenant TEXT NOT NULL, request_hash TEXT NOT NULL, cache_id TEXT NOT NULL, at REAL NOT NULL,
  PRIMARY KEY (tenant, request_hash, cache_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS refusals_record ON refusals(cache_id);
CREATE TRIGGER IF NOT EXISTS refusals_of_deleted AFTER DELETE ON records BEGIN
  DELETE FROM refusals WHERE cache_id = OLD.cache_id;
END;
CREATE TRIGGER IF NOT EXISTS refusals_of_retired AFTER UPDATE OF state ON records
WHEN NEW.state NOT IN ({_LIVE_VALUES}) BEGIN
  DELETE FROM refusals WHERE cache_id = NEW.cache_id;
END;
-- the learned levels' labels (RecordStore.add_labels): a data directory written before them gains
-- the table when it is next opened; no trigger ties them to records, which they outlive
CREATE TABLE IF NOT EXISTS labels (
  tenant TEXT NOT NULL, intent TEXT NOT NULL, at REAL NOT NULL, score REAL NOT NULL, right INTEGER NOT NULL,
  source TEXT NOT NULL, user TEXT NOT NULL, cache_id TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS labels_intent ON labels(tenant, intent, at);
"""


def marks(n: int) -> str:
    return ", ".join("?" for _ in range(n))


def where_clause(sel: Selector) -> tuple[str, str, list[Any]]:
    """(table, WHERE clause, parameters) of a selector. Only column names written here reach the
    SQL text; every value is a parameter."""
    clauses: list[str] = []
    params: list[Any] = []
    for name in EQUAL:
        value = getattr(sel, name)
        if value is not None:
            clauses.append(f"{name} = ?")
            params.append(value)
    for column, values in (
        ("cache_id", sel.cache_ids),
        ("label", sel.labels),
        ("state", sel.states),
        ("scope", sel.scopes),
    ):
        if values is not None:
            clauses.append(f"{column} IN ({marks(len(values))})" if values else "0")
            params += [str(v) if column == "state" else v for v in values]
    for column, op, value in (
        ("policy_version", "!=", sel.other_policy_version),
        ("expires_at", "<=", sel.expired_before),
        ("created_at", "<=", sel.created_before),
        ("ready_at", "<=", sel.ready_before),
    ):
        if value is not None:
            clauses.append(f"{column} {op} ?")
            params.append(value)
    # the sweeper's expiry scan by its index by name: without statistics SQLite would pick the
    # state index, i.e. read every live record each sweep
    by_expiry = sel.expired_before is not None and sel.cache_ids is None and sel.labels is None
    table = "records INDEXED BY records_expiry" if by_expiry else "records"
    return table, " AND ".join(clauses) or "1", params


def chunks(sel: Selector) -> Iterator[Selector]:
    """A selector naming many ids, as several naming at most ``ID_CHUNK`` each."""
    if sel.cache_ids is not None and len(sel.cache_ids) > ID_CHUNK:
        for i in range(0, len(sel.cache_ids), ID_CHUNK):
            yield from chunks(dataclasses.replace(sel, cache_ids=sel.cache_ids[i : i + ID_CHUNK]))
    elif sel.labels is not None and len(sel.labels) > ID_CHUNK:
        for i in range(0, len(sel.labels), ID_CHUNK):
            yield dataclasses.replace(sel, labels=sel.labels[i : i + ID_CHUNK])
    else:
        yield sel


HIT = "UPDATE records SET hit_count = hit_count + 1, last_hit_at = ? WHERE cache_id = ?"
SET_SESSION_LAST = (
    "INSERT INTO session_last (tenant, session, cache_id, served, request_hash, at) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(tenant, session) DO UPDATE SET cache_id = excluded.cache_id, "
    "served = excluded.served, request_hash = excluded.request_hash, at = excluded.at"
)


def stamped(last: SessionLast) -> SessionLast:
    """``last`` with the time it is written at, when it came without one."""
    return last if last.at else dataclasses.replace(last, at=time.time())


def session_last_row(tenant: str, session: str, last: SessionLast) -> tuple[Any, ...]:
    return (tenant, session, last.cache_id, int(last.served), last.request_hash, last.at)


def record_of(row: Sequence[Any], names: Sequence[str]) -> Record:
    values = dict(zip(names, row, strict=True))
    # the tags and key facts parsed once, as the record is read, for every decision that reads it
    values["coarse_tags"] = RecordTags.from_json(orjson.loads(values["coarse_tags"]))
    values["key_facts"] = KeyFacts.from_json(orjson.loads(values["key_facts"]))
    return Record(**values)


def index_columns(vectors: bool) -> tuple[str, ...]:
    return INDEX_COLUMNS if vectors else tuple("NULL" if c == "vector" else c for c in INDEX_COLUMNS)


def index_row(row: Sequence[Any]) -> IndexRow:
    label, vector, answer_bytes, *fields = row
    return IndexRow(int(label), None if vector is None else bytes(vector), IndexKey.interned(answer_bytes, *fields))


LIVE = tuple(str(s) for s in LIVE_STATES)  # the parameters of LIVE_IN
LIVE_IN = f"state IN ({marks(len(LIVE))})"  # the clause selecting live records
SESSION_LAST = "SELECT cache_id, served, request_hash, at FROM session_last WHERE tenant = ? AND session = ?"
# the sweeper's reads (records_counts, records_state): the gauges and eviction; LIVE their parameters
COUNTS = "SELECT state, scope, intent, COUNT(*) FROM records GROUP BY state, scope, intent"
USAGE = (
    "SELECT label, cache_id, MAX(last_hit_at, created_at), hit_count, LENGTH(CAST(answer_text AS BLOB)) "
    f"FROM records WHERE {LIVE_IN}"
)
ANSWER_BYTES = f"SELECT COALESCE(SUM(LENGTH(CAST(answer_text AS BLOB))), 0) FROM records WHERE {LIVE_IN}"


# a refusal is kept only of a live record (one retired meanwhile leaves none); LIVE follows the id
REFUSE = (
    "INSERT INTO refusals (tenant, request_hash, cache_id, at) SELECT ?, ?, cache_id, ? FROM records "
    f"WHERE cache_id = ? AND {LIVE_IN} ON CONFLICT (tenant, request_hash, cache_id) DO UPDATE SET at = excluded.at"
)
REFUSED = "SELECT cache_id FROM refusals WHERE tenant = ? AND request_hash = ?"
# a wording's newest ``REFUSALS_PER_WORDING`` kept: tenant, hash, tenant, hash, how many
TRIM_REFUSALS = (
    "DELETE FROM refusals WHERE tenant = ? AND request_hash = ? AND cache_id NOT IN "
    "(SELECT cache_id FROM refusals WHERE tenant = ? AND request_hash = ? ORDER BY at DESC, cache_id LIMIT ?)"
)
FORGET_REFUSALS = "DELETE FROM refusals WHERE tenant = ?"

ADD_LABEL = (
    "INSERT INTO labels (tenant, intent, at, score, right, source, user, cache_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
# oldest first; the row id orders labels of one time as they were written: tenant, intent
LABELS = (
    "SELECT intent, score, right, source, user, cache_id, at FROM labels "
    "WHERE tenant = ? AND intent = ? ORDER BY at, rowid"
)
# an intent's newest ``LABELS_KEPT`` kept: tenant, intent, how many. The subquery walks labels_intent
# newest first and yields rows only past the kept ones, so under the bound it deletes nothing
TRIM_LABELS = (
    "DELETE FROM labels WHERE rowid IN (SELECT rowid FROM labels WHERE tenant = ? AND intent = ? "
    "ORDER BY at DESC, rowid DESC LIMIT -1 OFFSET ?)"
)
FORGET_LABELS = "DELETE FROM labels WHERE tenant = ?"


def label_row(tenant: str, label: Label) -> tuple[Any, ...]:
    """``ADD_LABEL``'s parameters."""
    return (
        tenant,
        label.intent,
        label.at,
        label.score,
        int(label.right),
        str(label.source),
        label.user,
        label.cache_id,
    )


def label_of(row: Sequence[Any]) -> Label:
    """A label from ``LABELS``'s columns."""
    intent, score, right, source, user, cache_id, at = row
    return Label(str(intent), float(score), bool(right), Source(source), str(user), str(cache_id), float(at))


def record_row(record: Record) -> dict[str, Any]:
    """The columns of a new record (its label is the row id SQLite mints)."""
    # shallow: asdict deep-copies the vectors, the answer and the tags only to have them encoded
    # below, on every write
    values = {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name != "label"}
    values["coarse_tags"] = orjson.dumps(record.coarse_tags.to_json()).decode()
    values["key_facts"] = orjson.dumps(record.key_facts.to_json()).decode()
    values["state"] = str(values["state"])
    values["scope"] = str(values["scope"])
    return values
