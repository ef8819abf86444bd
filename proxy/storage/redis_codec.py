"""How records and events are written in Redis: a record is a hash of its fields (floats as their
exact repr, tags as JSON, vectors as raw float32 bytes, a None user as no field), and every reply
is read back through these helpers, whatever redis-py's loose reply types say."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson
from redis import exceptions as redis_errors

from proxy.core.learning import Label, Source
from proxy.core.model import LIVE_STATES, KeyFacts, Record, RecordState, RecordTags
from proxy.storage.base import IndexKey, IndexRow, Ref, StoreUnavailable

LIVE = frozenset(LIVE_STATES)
DEAD = frozenset({RecordState.REJECTED, RecordState.INVALID})
# the fields stored as JSON, and how each is parsed: once, as the record is read
JSON: Mapping[str, Callable[[Mapping[str, Any]], RecordTags | KeyFacts]] = {
    "coarse_tags": RecordTags.from_json,
    "key_facts": KeyFacts.from_json,
}
BLOBS = ("vector", "qvector")
FLOATS = ("created_at", "ready_at", "expires_at", "last_hit_at", "feedback_score")
INTS = ("hit_count", "prompt_tokens", "completion_tokens", "label")
# what a selector reads of a record: every field but the large ones
META = (
    "label",
    "cache_id",
    "tenant",
    "user",
    "scope",
    "session",
    "namespace",
    "context_fingerprint",
    "intent",
    "model",
    "system_prompt_version",
    "policy_version",
    "request_hash",
    "state",
    "created_at",
    "ready_at",
    "expires_at",
)
INDEX = ("label", "vector", "answer_bytes", "tenant", "session", "user", "scope", "model")
INDEX_TAIL = ("system_prompt_version", "namespace", "intent", "state")


ErrorTypes = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


@contextlib.contextmanager
def unavailable() -> Iterator[None]:
    """Redis cannot be reached: the store's callers see ``StoreUnavailable`` and go uncached."""
    try:
        yield
    except ErrorTypes as exc:
        raise StoreUnavailable(f"redis: {exc}") from exc


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One entry of the change stream: what happened to which label."""

    id: str
    op: str  # insert | state | delete
    label: int
    state: str


@dataclasses.dataclass(frozen=True, slots=True)
class StreamPosition:
    """A point in the change stream: the id of an event and how many events the stream had
    received up to it, which is what tells a reader whether trimming took one it had not read."""

    id: str
    seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class Changes:
    events: tuple[Event, ...]
    position: StreamPosition  # after the last of these events
    trimmed: bool  # events after the position asked for were dropped: rebuild from the records
    head: StreamPosition | None = None  # the stream's newest event when read; None: no stream yet


def id_seconds(event_id: str) -> float:
    """When the server appended an event: its stream id is the server's clock in ms, then a sequence."""
    return int(event_id.split("-", 1)[0]) / 1000


def text(v: bytes | str | None) -> str:
    return "" if v is None else v if isinstance(v, str) else v.decode()


def as_labels(values: Any) -> list[int]:
    """Labels from a reply (redis-py types replies loosely: bytes or str by connection option)."""
    return [int(v) for v in values]


def encode(record: Record) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for f in dataclasses.fields(Record):
        value = getattr(record, f.name)
        if f.name == "label" or (f.name == "user" and value is None):
            continue
        if f.name in JSON:
            out[f.name] = orjson.dumps(value.to_json())
        elif f.name in BLOBS:
            out[f.name] = bytes(value)
        elif isinstance(value, float):
            out[f.name] = repr(value)
        else:
            out[f.name] = str(value)
    out["answer_bytes"] = str(len(record.answer_text.encode()))
    return out


def decode(h: Mapping[bytes, bytes]) -> Record:
    """A record from its hash, or from part of it: fields not read are left empty (selection)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Record):
        raw = h.get(f.name.encode())
        if raw is None:
            if f.name == "user":
                values["user"] = None
            elif f.name in BLOBS:
                values[f.name] = b""
            elif f.name in JSON:
                values[f.name] = JSON[f.name]({})
            elif f.name == "answer_text":
                values[f.name] = ""
            continue
        if f.name in JSON:
            values[f.name] = JSON[f.name](orjson.loads(raw))
        elif f.name in BLOBS:
            values[f.name] = bytes(raw)
        elif f.name in FLOATS:
            values[f.name] = float(raw)
        elif f.name in INTS:
            values[f.name] = int(raw)
        else:
            values[f.name] = raw.decode()
    return Record(**values)


def states_arg(states: tuple[RecordState, ...] | None) -> str:
    """States as the scripts take them: a comma list, empty for any, "-" for none."""
    return "" if states is None else ",".join(str(s) for s in states) or "-"


def pairs(flat: Sequence[bytes]) -> list[Ref]:
    """Refs from a script's flat reply: label, cache id, label, cache id..."""
    return [Ref(int(flat[i]), flat[i + 1].decode()) for i in range(0, len(flat), 2)]


def index_row(h: Mapping[bytes, bytes]) -> IndexRow:
    user = h.get(b"user")
    key = IndexKey.interned(
        int(h[b"answer_bytes"]),
        text(h[b"tenant"]),
        text(h[b"session"]),
        None if user is None else text(user),
        text(h[b"scope"]),
        text(h[b"model"]),
        text(h[b"system_prompt_version"]),
        text(h[b"namespace"]),
        text(h[b"intent"]),
    )
    vector = h.get(b"vector")
    return IndexRow(int(h[b"label"]), None if vector is None else bytes(vector), key)


def label_json(label: Label) -> bytes:
    """A label as its intent's list keeps it: compact JSON, its intent left to the list's key."""
    return orjson.dumps([label.score, label.right, str(label.source), label.user, label.cache_id, label.at])


def label_of(intent: str, raw: bytes) -> Label:
    score, right, source, user, cache_id, at = orjson.loads(raw)
    return Label(intent, float(score), bool(right), Source(source), str(user), str(cache_id), float(at))
