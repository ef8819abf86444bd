"""The change feed's pure part: which labels end up live after a run of events, as a table."""

from __future__ import annotations

import pytest

from proxy.storage.feed import last_word
from proxy.storage.redis_codec import Event


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
