"""The records written or read lately, kept by the SQLite store so the next lookup of them needs
no read of its file.

A lookup reads its candidates' rows after the index search (``SqliteStore.get_many``): on aiosqlite
a hop to the connection's thread, queued behind the write-backs in flight, and under load the
longest step of a hit answered from an exact repeat (benchmarks/soak.py). A record just written
is kept as its row reads back: the session's next turn meets it as a candidate. One proxy owns a data
directory while it serves (``proxy.service.datadir.data_dir_lock``), and every statement that changes a
stored record goes through its store, so the store can keep what it read true:

- a change (a state, feedback, a delete) is announced before its first statement (``changing``)
  and forgets the records it changed once it is committed (``forget``);
- a read keeps its rows only if no change was announced while it was off the loop (``keep``):
  it may have read a row before the change, or the change's uncommitted row on the same
  connection. An insert keeps its row on the same terms: a change sent after it on the
  connection may have reached the new row.

A record in memory is then never older than the file once a change has returned, the point
from which a lookup without this memory would have read the new row too. Hit counts are the
exception: a hit's count is written without forgetting (every hit would drop its hot record),
so a kept record's ``hit_count`` and ``last_hit_at`` may lag; no lookup reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from proxy.core.lru import LruDict
from proxy.core.model import Record


class RecentRecords:
    """The newest ``limit`` records written or read for lookups, by label."""

    def __init__(self, limit: int = 4096) -> None:
        self._records: LruDict[int, Record] = LruDict(limit)
        self.changes = 0  # changes announced so far

    def __len__(self) -> int:
        return len(self._records)

    def take(self, labels: Sequence[int]) -> tuple[list[Record], list[int]]:
        """(the records kept of ``labels``, the labels to read from the file)."""
        found: list[Record] = []
        missing: list[int] = []
        for label in labels:
            record = self._records.get(label)
            if record is None:
                missing.append(label)
            else:
                found.append(record)
        return found, missing

    def keep(self, records: Iterable[Record], since: int) -> None:
        """Keep rows read by a read that began when ``changes`` was ``since``, unless a change was
        announced meanwhile."""
        if self.changes != since:
            return
        for record in records:
            if record.label is not None:
                self._records.put(record.label, record)

    def changing(self) -> None:
        """A change of stored records is about to be sent: reads under way keep nothing."""
        self.changes += 1

    def forget(self, labels: Iterable[int]) -> None:
        for label in labels:
            self._records.pop(label)
