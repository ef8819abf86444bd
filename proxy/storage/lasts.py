"""What the SQLite store knows of its sessions' last answers without reading its file.

Every request reads its session's last answer (a regenerate or a correction is about it) before
anything else, and on aiosqlite that read is a hop to the connection's thread, queued behind every
write-back in flight: under load the longest wait of a request that is otherwise in memory. One
proxy owns a data directory while it serves (``proxy.http.app.data_dir_lock``), so what its store
wrote or read is what the file holds, until it writes again: the store keeps it here, a bounded
LRU, and reads the file only for a session it has not met lately.
"""

from __future__ import annotations

from collections import OrderedDict

from proxy.model import SessionLast

Key = tuple[str, str]  # (tenant, session)


class LastAnswers:
    """The newest ``limit`` sessions met, each with its last answer or None (none yet)."""

    def __init__(self, limit: int = 32_768) -> None:
        self.limit = limit
        self._known: OrderedDict[Key, SessionLast | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._known)

    def get(self, key: Key) -> tuple[bool, SessionLast | None]:
        """(known, the session's last answer or None for none yet); unknown: read the file."""
        if key not in self._known:
            return False, None
        self._known.move_to_end(key)
        return True, self._known[key]

    def put(self, key: Key, last: SessionLast | None) -> None:
        self._known[key] = last
        self._known.move_to_end(key)
        if len(self._known) > self.limit:
            self._known.popitem(last=False)

    def drop_until(self, at: float) -> None:
        """Forget the answers given at or before ``at`` (the file's rows are purged alike)."""
        for key in [k for k, last in self._known.items() if last is not None and last.at <= at]:
            del self._known[key]
