"""``LruDict``: a bounded mapping that forgets the entry least recently read or written.

The parts that keep a bounded memory each own one (the normaliser's turns, the intent
classifier's exemplar votes, the SQLite store's sessions and recent records, the chat
service's response ids); none is shared between apps.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruDict(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._size:
            self._data.popitem(last=False)

    def items(self) -> list[tuple[K, V]]:
        """A copy of what is held, least recently used first; reading it refreshes nothing."""
        return list(self._data.items())

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)

    def drop_where(self, doomed: Callable[[V], bool]) -> None:
        for key in [k for k, value in self._data.items() if doomed(value)]:
            del self._data[key]

    def remember(self, key: K, make: Callable[[K], V]) -> V:
        """The value kept for ``key``, made (and kept) the first time it is asked for."""
        value = self.get(key)
        if value is None:
            value = make(key)
            self.put(key, value)
        return value
