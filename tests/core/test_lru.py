"""proxy/core/lru.py: a bounded mapping that forgets the least recently used entry."""

from __future__ import annotations

from proxy.core.lru import LruDict


def test_forgets_the_least_recently_used_past_its_size() -> None:
    lru: LruDict[str, int] = LruDict(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a read counts as a use: "b" is now the oldest
    lru.put("c", 3)
    assert (len(lru), lru.get("b"), lru.get("a"), lru.get("c")) == (2, None, 1, 3)


def test_pop_drop_where_and_remember() -> None:
    lru: LruDict[str, int] = LruDict(10)
    for i, key in enumerate("abcd"):
        lru.put(key, i)
    assert (lru.pop("a"), lru.pop("a")) == (0, None)
    lru.drop_where(lambda value: value % 2 == 1)
    assert [lru.get(k) for k in "bcd"] == [None, 2, None]
    made: list[str] = []
    assert lru.remember("x", lambda k: made.append(k) or 7) == 7
    assert lru.remember("x", lambda k: made.append(k) or 8) == 7  # made once, then kept
    assert made == ["x"]
