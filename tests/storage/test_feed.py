"""The change feed's pure parts: which labels end up live after a run of events, how far behind a
position is, as tables; and the checkpoint a replica saves at shutdown, read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.storage.base import IndexKey
from proxy.storage.feed import FeedCheckpoint, lag, last_word
from proxy.storage.redis_codec import Event, StreamPosition


def events(*spec: tuple[str, int, str]) -> list[Event]:
    return [Event(f"{i}-0", op, label, state) for i, (op, label, state) in enumerate(spec, start=1)]


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ((), {}),
        ((("insert", 1, "pending"),), {1: True}),
        ((("insert", 1, "ready"),), {1: True}),
        ((("insert", 1, "pending"), ("state", 1, "ready")), {1: True}),
        ((("insert", 1, "pending"), ("state", 1, "rejected")), {1: False}),
        ((("insert", 1, "ready"), ("state", 1, "invalid")), {1: False}),
        ((("insert", 1, "ready"), ("delete", 1, "ready")), {1: False}),
        ((("state", 1, "invalid"), ("state", 1, "ready")), {1: True}),
        ((("delete", 1, ""),), {1: False}),
        ((("insert", 1, "ready"), ("insert", 2, "ready"), ("state", 1, "invalid")), {1: False, 2: True}),
    ],
)
def test_the_last_event_of_each_label_decides(spec: tuple[tuple[str, int, str], ...], want: dict[int, bool]) -> None:
    assert last_word(events(*spec)) == want


@pytest.mark.parametrize(
    ("position", "head", "want"),
    [
        (StreamPosition("0-0", 0), None, (0, 0.0)),  # no stream yet
        (StreamPosition("5000-0", 7), StreamPosition("5000-0", 7), (0, 0.0)),  # caught up
        (StreamPosition("5000-0", 7), StreamPosition("7500-3", 10), (3, 2.5)),
        (StreamPosition("0-0", 0), StreamPosition("7500-3", 10), (10, 0.0)),  # nothing applied yet: no age
        (StreamPosition("9000-0", 12), StreamPosition("7500-3", 10), (0, 0.0)),  # read ahead of an older head
    ],
)
def test_lag_is_the_events_and_seconds_between_position_and_head(
    position: StreamPosition, head: StreamPosition | None, want: tuple[int, float]
) -> None:
    assert lag(position, head) == want


def key(session: str, user: str | None = None) -> IndexKey:
    return IndexKey.interned(42, "t1", session, user, "session", "m", "sp", "", "general")


def test_a_checkpoint_reads_back_what_was_saved(tmp_path: Path) -> None:
    path = tmp_path / "index.hnsw.feed"
    saved = FeedCheckpoint("store-1", "v1", StreamPosition("1700000000000-3", 12), {3: key("s1"), 9: key("s2", "u")})
    saved.save(path)
    assert FeedCheckpoint.read(path) == saved
    assert not (tmp_path / "index.hnsw.feed.tmp").exists()


@pytest.mark.parametrize("content", [b"", b"{", b'{"format": 99}', b'{"format": 1, "keys": [[1, 2]]}', b"[]"])
def test_a_damaged_or_foreign_checkpoint_is_not_used(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "index.hnsw.feed"
    path.write_bytes(content)
    assert FeedCheckpoint.read(path) is None
    assert FeedCheckpoint.read(tmp_path / "missing") is None
