"""The trace format (conversations of keyed turns), its JSONL codec, prefix keys and the
consistency checks every converter output goes through."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from proxy.core.errors import ConfigError

EN_SYSTEM = "You are a helpful assistant."
ZH_SYSTEM = "你是一个乐于助人的助手。"
EXPECTS = frozenset({"no_hit"})
_T = TypeVar("_T")


class TraceError(ConfigError, ValueError):
    """A trace line that is not a well-formed conversation; the message names file:line."""


def _field(obj: Mapping[str, object], name: str, kind: type[_T]) -> _T:
    value = obj.get(name)
    if not isinstance(value, kind) or value == "":
        raise ValueError(f"{name!r} must be {'a non-empty string' if kind is str else kind.__name__}")
    return value


@dataclass(frozen=True, slots=True)
class Turn:
    user: str
    key: str
    answer: str | None = None
    expect: str | None = None  # "no_hit": a hit here is a defect (realtime, regenerate)
    regenerate: bool = False  # resend the previous request as it was

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"user": self.user, "key": self.key}
        out.update({"answer": self.answer} if self.answer is not None else {})
        out.update({"expect": self.expect} if self.expect is not None else {})
        out.update({"regenerate": True} if self.regenerate else {})
        return out

    @classmethod
    def from_json(cls, obj: object) -> Turn:
        if not isinstance(obj, dict):
            raise ValueError("a turn must be an object")
        expect = obj.get("expect")
        if expect is not None and expect not in EXPECTS:
            raise ValueError(f"'expect' must be one of {sorted(EXPECTS)}, got {expect!r}")
        return cls(
            _field(obj, "user", str),
            _field(obj, "key", str),
            _field(obj, "answer", str) if obj.get("answer") else None,
            expect,
            _field(obj, "regenerate", bool) if "regenerate" in obj else False,
        )


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    category: str  # names the data it came from: per-category counts stay apart in a replay
    tenant: str
    session: str
    system: str
    turns: tuple[Turn, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "category": self.category,
            "tenant": self.tenant,
            "session": self.session,
            "system": self.system,
            "turns": [t.to_json() for t in self.turns],
        }

    @classmethod
    def from_json(cls, obj: object) -> Conversation:
        if not isinstance(obj, dict):
            raise ValueError("a conversation must be a JSON object")
        cid, category, tenant, session = (_field(obj, n, str) for n in ("id", "category", "tenant", "session"))
        system = obj.get("system", "")
        if not isinstance(system, str):
            raise ValueError("'system' must be a string")
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns:
            raise ValueError("'turns' must be a non-empty list")
        parsed = []
        for i, t in enumerate(turns):
            try:
                parsed.append(Turn.from_json(t))
            except ValueError as exc:
                raise ValueError(f"turns[{i}]: {exc}") from exc
        return cls(cid, category, tenant, session, system, tuple(parsed))


def load_traces(paths: Sequence[Path]) -> list[Conversation]:
    """Every conversation of every file, in order; the first bad line raises TraceError(file:line)."""
    out: list[Conversation] = []
    seen: set[str] = set()
    for path in paths:
        with Path(path).open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    conv = Conversation.from_json(json.loads(line))
                except ValueError as exc:  # json.JSONDecodeError is a ValueError
                    raise TraceError(f"{path}:{lineno}: {exc}") from exc
                if conv.id in seen:
                    raise TraceError(f"{path}:{lineno}: duplicate conversation id {conv.id!r}")
                seen.add(conv.id)
                out.append(conv)
    return out


def write_traces(path: Path, convs: Iterable[Conversation]) -> int:
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for conv in convs:
            fh.write(json.dumps(conv.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def norm_text(text: str) -> str:
    return " ".join(text.split()).casefold()


def _prefix(system: str, users: Iterable[str]) -> tuple[str, ...]:
    return (norm_text(system), *(norm_text(u) for u in users))


def prefix_key(system: str, users: Sequence[str]) -> str:
    """The key of the last user turn asked in exactly this context (case and spacing ignored)."""
    digest = hashlib.blake2b("\n\x1e".join(_prefix(system, users)).encode(), digest_size=8)
    return "K" + digest.hexdigest()


def check_traces(convs: Sequence[Conversation]) -> list[str]:
    """Rule breaks: duplicate ids, one context with two keys, one answer under two keys, bad regenerates."""
    problems: list[str] = []
    ids: set[str] = set()
    keys: dict[tuple[str, ...], str] = {}
    answers: dict[str, str] = {}
    for c in convs:
        if c.id in ids:
            problems.append(f"{c.id}: duplicate id")
        ids.add(c.id)
        for i, t in enumerate(c.turns):
            p = _prefix(c.system, (x.user for x in c.turns[: i + 1]))
            if keys.setdefault(p, t.key) != t.key:
                problems.append(f"{c.id}[{i}]: context already has key {keys[p]}, here {t.key}")
            if t.answer is not None and answers.setdefault(t.answer, t.key) != t.key:
                problems.append(f"{c.id}[{i}]: answer shared with key {answers[t.answer]}")
            if t.regenerate and (
                i == 0 or (c.turns[i - 1].user, c.turns[i - 1].key) != (t.user, t.key) or t.expect != "no_hit"
            ):
                problems.append(f"{c.id}[{i}]: a regenerate repeats the previous turn, same key, expect no_hit")
    return problems


def consistent(convs: Iterable[Conversation]) -> list[Conversation]:
    """Drops a conversation whose context contradicts an earlier key, and an answer another key owns."""
    keys: dict[tuple[str, ...], str] = {}
    answers: dict[str, str] = {}
    ids: set[str] = set()
    out: list[Conversation] = []
    for c in convs:
        ctx = [(_prefix(c.system, (x.user for x in c.turns[: i + 1])), t.key) for i, t in enumerate(c.turns)]
        if c.id in ids or any(keys.get(p, k) != k for p, k in ctx):
            continue
        ids.add(c.id)
        keys.update(ctx)
        turns = tuple(
            t if t.answer is None or answers.setdefault(t.answer, t.key) == t.key else replace(t, answer=None)
            for t in c.turns
        )
        out.append(replace(c, turns=turns))
    return out


@dataclass
class Draft:
    """One conversation being written by a converter (local, never shared)."""

    system: str
    turns: list[Turn] = field(default_factory=list)

    def ask(
        self,
        user: str,
        *,
        key: str | None = None,
        answer: str | None = None,
        expect: str | None = None,
        regenerate: bool = False,
    ) -> str:
        k = key or prefix_key(self.system, [*(t.user for t in self.turns), user])
        self.turns.append(Turn(user, k, answer, expect, regenerate))
        return k

    def done(self, cid: str, category: str, tenant: str) -> Conversation:
        return Conversation(cid, category, tenant, cid, self.system, tuple(self.turns))


@dataclass(frozen=True, slots=True)
class HeldOut:
    texts: frozenset[str]  # normalised user texts of the dev traces
    openings: frozenset[tuple[str, str]]  # their first two user turns


def held_out(data_dir: Path) -> HeldOut:
    path = data_dir.parent / "eval" / "dev_traces.jsonl"
    if not path.is_file():
        return HeldOut(frozenset(), frozenset())
    users = [[norm_text(t["user"]) for t in conv["turns"]] for conv in read_jsonl(path)]
    return HeldOut(frozenset(u for us in users for u in us), frozenset((us[0], us[1]) for us in users if len(us) >= 2))
