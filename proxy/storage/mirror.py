"""The label mirror: every live label's ``IndexKey`` held in memory, level with the store, so the
index filter admits or refuses a label without a store round trip, and each session's labels are
at hand for its exact search (a session's pool is small)."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.storage.base import IndexKey


@dataclass
class Pools:
    """Every live label's key (what the index filter reads) and the labels of each session."""

    keys: dict[int, IndexKey] = field(default_factory=dict)
    sessions: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    answer_bytes: int = 0  # of all live answers

    def add(self, label: int, key: IndexKey) -> None:
        old = self.keys.get(label)
        self.answer_bytes += key.answer_bytes - (old.answer_bytes if old else 0)
        self.keys[label] = key
        self.sessions.setdefault((key.tenant, key.session), set()).add(label)

    def discard(self, label: int) -> None:
        key = self.keys.pop(label, None)
        if key is None:
            return
        self.answer_bytes -= key.answer_bytes
        pool = self.sessions.get((key.tenant, key.session))
        if pool is not None:
            pool.discard(label)
            if not pool:  # months of one-off sessions must not leave an empty set each behind
                del self.sessions[(key.tenant, key.session)]
