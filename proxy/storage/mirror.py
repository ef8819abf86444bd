"""The label mirror: every live label's ``IndexKey`` held in memory, level with the store, so the
index filter admits or refuses a label without a store round trip, and each session's labels are
at hand for its exact search (a session's pool is small).

The vector index reads the same keys as small integer codes (``Codes``), one column per field,
so the wider lookup's filter is a handful of vectorised comparisons over a tenant's rows
(``Want.mask``) rather than a Python call per graph node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from proxy.storage.base import IndexKey

SCOPE_WIDTH = {"session": 0, "user": 1, "tenant": 2, "global": 3}
# the partition of records shared across tenants; tenant ids are hashes or "anonymous", never this
GLOBAL_POOL = "*"

# the columns of a key as the index holds them
TENANT, USER, MODEL, NAMESPACE, VERSION, SCOPE = range(6)
COLUMNS = 6
NO_USER = -1  # a record without a user
UNKNOWN = -2  # a string no record has: equal to no column value

Columns = npt.NDArray[np.int32]
# the string fields, in column order (SCOPE, last, is a width, not a code)
_CODED = tuple(attrgetter(name) for name in ("tenant", "user", "model", "namespace", "system_prompt_version"))


def partition_of(key: IndexKey) -> str:
    """The index partition a record lives in: its tenant's, or the shared one for scope global
    (those are the only records another tenant may see, so a tenant's lookup reads its own
    partition and the shared one, never a third)."""
    return GLOBAL_POOL if key.scope == "global" else key.tenant


@dataclass
class Pools:
    """Every live label's key (what the index filter reads) and the labels of each session."""

    keys: dict[int, IndexKey] = field(default_factory=dict)
    sessions: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    answer_bytes: int = 0  # of all live answers

    def add(self, label: int, key: IndexKey) -> None:
        self.add_many(((label, key),))

    def add_many(self, items: Iterable[tuple[int, IndexKey]]) -> None:
        """Labels with their keys; a start adds a million, so the loop is here, not a call a label."""
        keys, sessions = self.keys, self.sessions
        size = 0
        for label, key in items:
            old = keys.get(label)
            size += key.answer_bytes - (old.answer_bytes if old else 0)
            keys[label] = key
            pool = sessions.get(session := (key.tenant, key.session))
            if pool is None:  # not setdefault: that builds a set per call, a million of them at start
                sessions[session] = {label}
            else:
                pool.add(label)
        self.answer_bytes += size

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


class Codes:
    """Strings as small integers, each kept once. Sessions are not coded: a caller's own session is
    searched exactly beside the index (``search_among``), so the wider filter never needs it."""

    def __init__(self, names: list[str] | None = None) -> None:
        self.names: list[str] = list(names or ())
        self._code = {name: i for i, name in enumerate(self.names)}

    def code(self, name: str) -> int:
        found = self._code.get(name)
        if found is None:
            found = self._code[name] = len(self.names)
            self.names.append(name)
        return found

    def find(self, name: str | None) -> int:
        return UNKNOWN if name is None else self._code.get(name, UNKNOWN)

    def columns(self, keys: Sequence[IndexKey]) -> Columns:
        """The keys as a (COLUMNS, len(keys)) block, one row per field: a field at a time, each
        distinct string looked up once (a start codes a million keys)."""
        out = np.empty((COLUMNS, len(keys)), dtype=np.int32)
        for row, field_of in enumerate(_CODED):
            values = list(map(field_of, keys))
            seen = dict.fromkeys(values, 0)
            for name in seen:
                seen[name] = NO_USER if name is None else self.code(name)
            out[row] = np.fromiter(map(seen.__getitem__, values), dtype=np.int32, count=len(values))
        out[SCOPE] = np.fromiter((SCOPE_WIDTH[k.scope] for k in keys), dtype=np.int32, count=len(keys))
        return out

    def coded(self, want: Want) -> Coded:
        return Coded(
            self.find(want.tenant),
            self.find(want.user),
            self.find(want.model),
            self.find(want.namespace),
            self.find(want.version),
            SCOPE_WIDTH[want.widen_to],
            want.any_scope,
        )


@dataclass(frozen=True, slots=True)
class Want:
    """Which records a widened lookup may read: the request's model, namespace and system-prompt
    version, and the caller's tenant and user searching up to the scope ``widen_to``."""

    tenant: str
    user: str | None
    model: str
    namespace: str
    version: str
    widen_to: str
    # every record of the tenant (or, widening to "user", of the caller's user), whatever pool it
    # was written to: the search for an exact repeat of the conversation (repeats_widen_to)
    any_scope: bool = False


@dataclass(frozen=True, slots=True)
class Coded:
    """A ``Want`` in one index's codes. Its mask is ``reach.visible`` (plus the model, namespace and
    version match) for every record outside the caller's own session: that session is searched
    exactly, every record of it, beside the index."""

    tenant: int
    user: int
    model: int
    namespace: int
    version: int
    width: int
    any_scope: bool = False

    def mask(self, cols: Columns) -> npt.NDArray[np.bool_]:
        # a record is read up to the narrower of its own pool and the lookup's, or, for an exact
        # repeat (any_scope), up to the lookup's alone
        width = self.width if self.any_scope else np.minimum(cols[SCOPE], self.width)
        same = (cols[MODEL] == self.model) & (cols[NAMESPACE] == self.namespace) & (cols[VERSION] == self.version)
        mine = cols[TENANT] == self.tenant
        mine &= (width >= SCOPE_WIDTH["tenant"]) | ((width >= SCOPE_WIDTH["user"]) & (cols[USER] == self.user))
        admitted: npt.NDArray[np.bool_] = same & (mine | (width >= SCOPE_WIDTH["global"]))
        return admitted
