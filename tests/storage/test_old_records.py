"""A record an older version wrote, as it lies in SQLite or in a Redis hash, loads with typed tags
and key facts, and writes back as it was read: the stored formats did not change with the types."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from pathlib import Path

import orjson

from proxy.core.model import KeyFacts, Record, RecordTags
from proxy.core.text.entities import Entities
from proxy.core.text.normalize import NormalText
from proxy.core.text.numbers import NumericConstraint
from proxy.storage import redis_codec
from proxy.storage.sqlite import SqliteStore
from tests.storage.contract import make_record

# the first tags records kept: the coarse tags, the question and the previous reply; entities
# without areas
OLD_TAGS = {
    "intent": "travel",
    "entities": {"places": ["杭州"], "products": [], "people": [], "numbers": [["budget", 8000, "CNY", "<="]]},
    "change_instruction": False,
    "context_switch": False,
    "question": "杭州3天行程 预算8000",
    "previous_reply": "",
}
OLD_FACTS = {"money": [[7800, "CNY"]], "dates": [], "list_items": 3, "day_sections": 3}
TAGS = RecordTags(
    intent="travel",
    entities=Entities(places=frozenset({"杭州"}), numbers=(NumericConstraint("budget", 8000.0, "CNY", "<="),)),
    question=NormalText("杭州3天行程 预算8000"),
)
FACTS = KeyFacts(money=((7800.0, "CNY"),), list_items=3, day_sections=3)


async def reopened(path: Path, cache_id: str) -> Record | None:
    """The record as the file holds it, read by a store that has not written it."""
    store = await SqliteStore.open(path)
    try:
        return await store.get(cache_id)
    finally:
        await store.close()


async def test_sqlite_reads_an_old_record_and_writes_it_back_as_read(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    store = await SqliteStore.open(path)
    label = await store.insert(make_record(1))
    await store.close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "UPDATE records SET coarse_tags = ?, key_facts = ? WHERE label = ?",
            (orjson.dumps(OLD_TAGS).decode(), orjson.dumps(OLD_FACTS).decode(), label),
        )
    old = await reopened(path, "sc-0001")
    assert old is not None and (old.coarse_tags, old.key_facts) == (TAGS, FACTS)
    store = await SqliteStore.open(path)
    again = dataclasses.replace(old, cache_id="sc-again", label=None)
    again = dataclasses.replace(again, label=await store.insert(again))
    await store.close()
    assert await reopened(path, "sc-again") == again


def test_redis_reads_an_old_record_and_writes_it_back_as_read() -> None:
    def stored(record: Record) -> dict[bytes, bytes]:
        fields = redis_codec.encode(record)
        return {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in fields.items()}

    hashed = {**stored(make_record(1)), b"coarse_tags": orjson.dumps(OLD_TAGS), b"key_facts": orjson.dumps(OLD_FACTS)}
    old = redis_codec.decode(hashed)
    assert (old.coarse_tags, old.key_facts) == (TAGS, FACTS)
    assert redis_codec.decode(stored(old)) == old
