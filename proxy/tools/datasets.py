"""Replay traces built from the evaluation data in ../shared/data (issue 8: calibration).

A trace is JSONL, one conversation a line: {"id", "category", "tenant", "session", "system",
"turns": [{"user", "key", "answer"?, "expect"?: "no_hit", "regenerate"?: true}]}. Turns with the
same key may share an answer; different keys must not.

Keys are derived, not invented: a turn's own key hashes the system prompt and every user turn up
to it, so two turns with the same context and text always get the same key (an oracle keyed by
prefix never sees one prefix with two keys) and the same words in another context never do. Only
a turn the data says means the same (a paraphrase, a restated follow-up, a repeat) borrows an
earlier key. Data rows are read at run time and never copied into the repository; rows that the
judges' dev traces (../eval/dev_traces.jsonl) already use are skipped, so that set stays an
independent check of what these traces calibrate.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

EN_SYSTEM = "You are a helpful assistant."
ZH_SYSTEM = "你是一个乐于助人的助手。"
EXPECTS = frozenset({"no_hit"})
_T = TypeVar("_T")


class TraceError(ValueError):
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
        return cls(_field(obj, "user", str), _field(obj, "key", str),
                   _field(obj, "answer", str) if obj.get("answer") else None, expect,
                   _field(obj, "regenerate", bool) if "regenerate" in obj else False)


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    category: str  # names the data it came from: per-category counts stay apart in a replay
    tenant: str
    session: str
    system: str
    turns: tuple[Turn, ...]

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "category": self.category, "tenant": self.tenant, "session": self.session,
                "system": self.system, "turns": [t.to_json() for t in self.turns]}

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


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def _prefix(system: str, users: Iterable[str]) -> tuple[str, ...]:
    return (_norm(system), *(_norm(u) for u in users))


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
            if t.regenerate and (i == 0 or (c.turns[i - 1].user, c.turns[i - 1].key) != (t.user, t.key)
                                 or t.expect != "no_hit"):
                problems.append(f"{c.id}[{i}]: a regenerate repeats the previous turn, same key, expect no_hit")
    return problems


def _consistent(convs: Iterable[Conversation]) -> list[Conversation]:
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
        turns = tuple(t if t.answer is None or answers.setdefault(t.answer, t.key) == t.key
                      else replace(t, answer=None) for t in c.turns)
        out.append(replace(c, turns=turns))
    return out


@dataclass
class _Draft:
    """One conversation being written by a converter (local, never shared)."""

    system: str
    turns: list[Turn] = field(default_factory=list)

    def ask(self, user: str, *, key: str | None = None, answer: str | None = None,
            expect: str | None = None, regenerate: bool = False) -> str:
        k = key or prefix_key(self.system, [*(t.user for t in self.turns), user])
        self.turns.append(Turn(user, k, answer, expect, regenerate))
        return k

    def done(self, cid: str, category: str, tenant: str) -> Conversation:
        return Conversation(cid, category, tenant, cid, self.system, tuple(self.turns))


@dataclass(frozen=True, slots=True)
class _HeldOut:
    texts: frozenset[str]  # normalised user texts of the dev traces
    openings: frozenset[tuple[str, str]]  # their first two user turns


def _held_out(data_dir: Path) -> _HeldOut:
    path = data_dir.parent / "eval" / "dev_traces.jsonl"
    if not path.is_file():
        return _HeldOut(frozenset(), frozenset())
    users = [[_norm(t["user"]) for t in conv["turns"]] for conv in _jsonl(path)]
    return _HeldOut(frozenset(u for us in users for u in us),
                    frozenset((us[0], us[1]) for us in users if len(us) >= 2))


# --- paraphrase pairs -----------------------------------------------------------------------

def _pick_pairs(lines: Sequence[str], parse: Callable[[str], tuple[str, str, int] | None],
                need: Counter[int], rng: random.Random, held: _HeldOut) -> dict[int, list[tuple[str, str]]]:
    """Rows in random order; each text used once, so one text never carries two keys."""
    got: dict[int, list[tuple[str, str]]] = {0: [], 1: []}
    used: set[str] = set(held.texts)
    order = list(range(len(lines)))
    rng.shuffle(order)
    for i in order:
        row = parse(lines[i])
        if row is None or len(got[row[2]]) >= need[row[2]]:
            continue
        a, b, label = row
        if _norm(a) == _norm(b) or _norm(a) in used or _norm(b) in used:
            continue
        used.update((_norm(a), _norm(b)))
        got[label].append((a, b))
        if all(len(got[k]) >= need[k] for k in (0, 1)):
            break
    return got


def _pair_convs(lines: Sequence[str], parse: Callable[[str], tuple[str, str, int] | None], src: str,
                system: str, rng: random.Random, limit: int, held: _HeldOut) -> list[Conversation]:
    """(a) a then b in one conversation, (b) a and b in two sessions of one tenant; labels alternate."""
    within = limit // 3
    slots = [("session", i % 2) for i in range(within)] + [("tenant", i % 2) for i in range((limit - within) // 2)]
    rng.shuffle(slots)
    rows = _pick_pairs(lines, parse, Counter(label for _, label in slots), rng, held)
    out: list[Conversation] = []
    tenant = f"cal-{src}"
    for n, (framing, label) in enumerate(slots):
        if not rows[label]:
            continue
        a, b = rows[label].pop()
        first = _Draft(system)
        ka = first.ask(a)
        if framing == "session":
            first.ask(b, key=ka if label else None)
            out.append(first.done(f"{src}-{n}", f"{src}_session", tenant))
        else:
            second = _Draft(system)
            second.ask(b, key=ka if label else None)
            out += [first.done(f"{src}-{n}-a", f"{src}_tenant", tenant),
                    second.done(f"{src}-{n}-b", f"{src}_tenant", tenant)]
    return _consistent(out)


def _parse_qqp(line: str) -> tuple[str, str, int] | None:
    r = json.loads(line)
    a, b, label = r.get("text_a"), r.get("text_b"), r.get("label")
    return (a.strip(), b.strip(), int(label)) if a and b and str(label) in ("0", "1") else None


def _parse_pawsx(line: str) -> tuple[str, str, int] | None:
    cols = line.split("\t")
    ok = len(cols) == 3 and cols[0].strip() and cols[1].strip() and cols[2].strip() in ("0", "1")
    return (cols[0].strip(), cols[1].strip(), int(cols[2])) if ok else None


def qqp_pairs(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """Quora pairs from part01..03 (the dev traces sample part00)."""
    files = sorted((data_dir / "gptcache_similar_qqp").glob("similiar_qqp_full.part0[1-9].jsonl"))
    lines = [ln for f in files for ln in f.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return _pair_convs(lines, _parse_qqp, "qqp", EN_SYSTEM, rng, limit, _held_out(data_dir))


def pawsx_pairs(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """PAWS-X zh valid pairs: adversarial negatives with near-identical wording."""
    lines = (data_dir / "pawsx_zh" / "PAWSX.valid.tsv").read_text(encoding="utf-8").splitlines()
    return _pair_convs(lines, _parse_pawsx, "pawsx", ZH_SYSTEM, rng, limit, _held_out(data_dir))


# --- multi-turn sets --------------------------------------------------------------------------

def _gecor_groups(dials: list[dict], held: _HeldOut) -> dict[str, list[tuple[int, int]]]:
    """Elliptical follow-up text -> (dialogue, turn) whose complete forms differ, one per form."""
    groups: dict[str, dict[str, tuple[int, int]]] = {}
    for di, d in enumerate(dials):
        users = [_norm(t["usr"]["transcript"]) for t in d["dial"]]
        if tuple(users[:2]) in held.openings:
            continue
        for ti, t in enumerate(d["dial"][1:], 1):
            raw, full = users[ti], _norm(t["usr"].get("transcript_complete") or "")
            if raw and full and raw != full:
                groups.setdefault(raw, {}).setdefault(full, (di, ti))
    return {raw: list(forms.values()) for raw, forms in groups.items() if len(forms) >= 2}


def gecor_followups(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """The same elliptical follow-up after different CamRest676 dialogues (different keys); half of
    them then restate its complete form in the same conversation (same key)."""
    dials = json.loads((data_dir / "gecor_camrest676" / "CamRest676_annotated.json").read_text(encoding="utf-8"))
    groups = _gecor_groups(dials, _held_out(data_dir))
    names = sorted(groups)
    rng.shuffle(names)
    used: set[int] = set()
    out: list[Conversation] = []
    for gi, raw in enumerate(names):
        picks = [(di, ti) for di, ti in groups[raw] if di not in used]
        rng.shuffle(picks)
        for ri, (di, ti) in enumerate(picks[:6] if len(picks) >= 2 else []):
            used.add(di)
            draft = _Draft(EN_SYSTEM)
            for t in dials[di]["dial"][:ti]:
                draft.ask(t["usr"]["transcript"], answer=t["sys"]["sent"])
            target = dials[di]["dial"][ti]
            k = draft.ask(target["usr"]["transcript"], answer=target["sys"]["sent"])
            if rng.random() < 0.5:
                draft.ask(target["usr"]["transcript_complete"], key=k)
            out.append(draft.done(f"camrest-{gi}-{ri}", "camrest_followup", "cal-camrest"))
    return _consistent(out)[:limit]


def _kvret_records(dials: list[dict], held: _HeldOut) -> list[tuple[int, int]]:
    """(dialogue, assistant turn) whose reformulation rewrites the driver turn before it, which
    follows at least one other driver turn; dialogues the dev traces use are skipped."""
    out = []
    for di, d in enumerate(dials):
        turns = d["dialogue"]
        refs = [t.get("reformulation") or {} for t in turns]
        if any(_norm(p) in held.texts for r in refs for p in r.get("mturk_reformulations") or []):
            continue
        for i, r in enumerate(refs):
            drivers_before = sum(t["turn"] == "driver" for t in turns[: i - 1])
            gold = _norm(r.get("reformulated_utt") or "")
            distinct = {_norm(p) for p in r.get("mturk_reformulations") or []} - {gold}
            if gold and len(distinct) >= 2 and i >= 2 and turns[i - 1]["turn"] == "driver" and drivers_before >= 1:
                out.append((di, i))
    return out


def kvret_rewrites(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """CQR-KVRET: a multi-turn request, then a crowd paraphrase of its self-contained form in the same
    conversation, another paraphrase and the gold rewrite each in a new conversation (same key)."""
    dials = json.loads((data_dir / "cqr_kvret" / "cqr_kvret_dev_public.json").read_text(encoding="utf-8"))
    records = _kvret_records(dials, _held_out(data_dir))
    rng.shuffle(records)
    out: list[Conversation] = []
    for n, (di, i) in enumerate(records[: limit // 3]):
        turns = dials[di]["dialogue"]
        ref = turns[i]["reformulation"]
        draft = _Draft(EN_SYSTEM)
        k = ""
        for j, t in enumerate(turns[:i]):
            if t["turn"] == "driver":
                nxt = turns[j + 1]["data"]["utterance"] if turns[j + 1]["turn"] == "assistant" else None
                k = draft.ask(t["data"]["utterance"], answer=nxt)
        gold = ref["reformulated_utt"]
        distinct = {_norm(p): p for p in ref["mturk_reformulations"] if _norm(p) != _norm(gold)}
        same, other = rng.sample(sorted(distinct.values()), 2)
        draft.ask(same, key=k)
        out.append(draft.done(f"kvret-{n}", "kvret_rewrite", "cal-kvret"))
        for suffix, text in (("p", other), ("g", gold)):
            fresh = _Draft(EN_SYSTEM)
            fresh.ask(text, key=k)
            out.append(fresh.done(f"kvret-{n}-{suffix}", "kvret_rewrite", "cal-kvret"))
    return _consistent(out)


_QUESTION = re.compile(r"[？?]|吗|什么|哪|多少|几|怎么|是否")
_THANKS = re.compile(r"谢|再见|没有问题|没问题")


def crosswoz_dialogues(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """Whole CrossWOZ val dialogues, every user turn its own key (any hit inside is false); in about
    half, one question is asked again right after its answer (same key, measures recall)."""
    rows = _jsonl(data_dir / "crosswoz" / "val_turns.jsonl")
    out: list[Conversation] = []
    for idx in rng.sample(range(len(rows)), min(limit, len(rows))):
        turns = rows[idx]["turns"]
        pairs = [(t["content"], turns[j + 1]["content"] if j + 1 < len(turns) and turns[j + 1]["role"] == "sys"
                  else None) for j, t in enumerate(turns) if t["role"] == "usr" and t["content"].strip()]
        askable = [j for j, (u, _) in enumerate(pairs) if _QUESTION.search(u) and not _THANKS.search(u)]
        again = rng.choice(askable) if askable and rng.random() < 0.5 else None
        draft = _Draft(ZH_SYSTEM)
        for j, (user, answer) in enumerate(pairs):
            k = draft.ask(user, answer=answer)
            if j == again:
                draft.ask(user, key=k, answer=answer)
        category = "crosswoz_dialogue" if again is None else "crosswoz_repeat"
        out.append(draft.done(f"crosswoz-{rows[idx]['dialog_id']}", category, "cal-crosswoz"))
    return _consistent(out)


def _mtbench(folder: Path, lang: str, rng: random.Random, n: int) -> list[Conversation]:
    ref_path = folder / "reference_answer_gpt-4.jsonl"
    refs = {r["question_id"]: r["choices"][0]["turns"] for r in _jsonl(ref_path)} if ref_path.is_file() else {}
    qs = _jsonl(folder / "question.jsonl")
    out = []
    for q in rng.sample(qs, min(n, len(qs))):
        draft = _Draft(ZH_SYSTEM if lang == "zh" else EN_SYSTEM)
        answers = refs.get(q["question_id"], [])
        for j, user in enumerate(q["turns"]):
            draft.ask(user, answer=answers[j] if j < len(answers) else None)
        out.append(draft.done(f"mtbench-{lang}-{q['question_id']}", f"mtbench_{lang}", "cal-mtbench"))
    return out


def _mtbench101(path: Path, rng: random.Random, n: int) -> list[Conversation]:
    """Dialogues sharing a follow-up text come first (whole groups, up to half), then random ones."""
    rows = _jsonl(path)
    by_text: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        for h in r["history"][1:]:
            by_text.setdefault(_norm(h["user"]), []).append(i)
    groups = [g for g in by_text.values() if len(set(g)) >= 2]
    rng.shuffle(groups)
    chosen: dict[int, None] = {}
    for g in groups:
        if len(chosen) + len(set(g)) <= n // 2:
            chosen.update(dict.fromkeys(g))
    rest = [i for i in range(len(rows)) if i not in chosen]
    chosen.update(dict.fromkeys(rng.sample(rest, max(0, min(n - len(chosen), len(rest))))))
    out = []
    for i in chosen:
        draft = _Draft(EN_SYSTEM)
        for h in rows[i]["history"]:
            draft.ask(h["user"], answer=h.get("bot") or None)
        out.append(draft.done(f"mtbench101-{rows[i]['id']}", "mtbench101", "cal-mtbench"))
    return out


def mtbench_followups(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """MT-Bench (en, zh) and MT-Bench-101: follow-ups that lean on earlier turns, each turn its own key."""
    quarter = limit // 4
    out = _mtbench(data_dir / "mt_bench", "en", rng, quarter) + _mtbench(data_dir / "mt_bench_zh", "zh", rng, quarter)
    out += _mtbench101(data_dir / "mt_bench_101" / "mtbench101.jsonl", rng, limit - len(out))
    return _consistent(out)


# --- hand-written probes ----------------------------------------------------------------------

_REALTIME = (
    ("What's the weather in Berlin right now?", "How is the weather in Berlin at the moment?"),
    ("What time is it in Tokyo now?", "Tell me the current time in Tokyo."),
    ("What is the Bitcoin price right now?", "How much is one bitcoin worth at this moment?"),
    ("What are today's top news headlines?", "Give me the latest headlines from today."),
    ("What's the USD to EUR exchange rate today?", "How many euros does one US dollar buy today?"),
    ("Is traffic on the Bay Bridge heavy right now?", "How bad is the Bay Bridge traffic at the moment?"),
    ("What's the score of the Lakers game right now?", "Who is winning the Lakers game currently?"),
    ("现在北京几点了？", "北京现在是几点钟？"),
    ("今天上海的天气怎么样？", "上海今天天气如何？"),
    ("今天美元兑人民币的汇率是多少？", "现在一美元能换多少人民币？"),
    ("今天有哪些最新的科技新闻？", "给我说说今天的科技新闻头条。"),
    ("今天是几月几号？", "今天的日期是什么？"),
)
_REGENERATE = (
    ("Write a two-line poem about autumn leaves.", "Crimson leaves let go, / the year exhales in gold."),
    ("Suggest a name for a small coffee shop by the sea.", "How about \"Tide & Bean\"?"),
    ("Give me an opening line for a mystery novel.", "The clock in the hall had stopped at 3:17, again."),
    ("给我讲一个关于程序员的冷笑话。", "程序员为什么分不清万圣节和圣诞节？因为 Oct 31 == Dec 25。"),
    ("帮我想一句生日祝福语，送给同事。", "愿你新的一岁工作顺心，生活常有惊喜！"),
)


def _system_for(text: str) -> str:
    return ZH_SYSTEM if re.search(r"[\u4e00-\u9fff]", text) else EN_SYSTEM


def _realtime_pair(n: int, question: str, paraphrase: str) -> list[Conversation]:
    first, later = _Draft(_system_for(question)), _Draft(_system_for(question))
    k = first.ask(question, expect="no_hit")
    first.ask(paraphrase, key=k, expect="no_hit")
    later.ask(question, key=k, expect="no_hit")
    return [first.done(f"realtime-{n}", "realtime_handwritten", "cal-realtime"),
            later.done(f"realtime-{n}-later", "realtime_handwritten", "cal-realtime")]


def _regenerate_pair(n: int, question: str, answer: str) -> list[Conversation]:
    first, again = _Draft(_system_for(question)), _Draft(_system_for(question))
    k = first.ask(question, answer=answer)
    again.ask(question, key=k)  # a hit here is right: it was answered in the first conversation
    again.ask(question, key=k, expect="no_hit", regenerate=True)
    return [first.done(f"regenerate-{n}", "regenerate_handwritten", "cal-realtime"),
            again.done(f"regenerate-{n}-again", "regenerate_handwritten", "cal-realtime")]


def realtime_probes(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """Realtime questions (asked, paraphrased, asked again later: all expect no_hit) and a regenerate
    after a cacheable question answered in an earlier conversation. Hand-written: no data, no rng."""
    units = [_realtime_pair(n, *qp) for n, qp in enumerate(_REALTIME)]
    for n, qa in enumerate(_REGENERATE):
        units.insert(2 * n + 1, _regenerate_pair(n, *qa))  # interleaved, so a small limit has both
    return _consistent([c for unit in units for c in unit][:limit])


CONVERTERS: Mapping[str, Callable[[Path, random.Random, int], list[Conversation]]] = MappingProxyType({
    "qqp_pairs": qqp_pairs,
    "pawsx_pairs": pawsx_pairs,
    "gecor_followups": gecor_followups,
    "kvret_rewrites": kvret_rewrites,
    "crosswoz_dialogues": crosswoz_dialogues,
    "mtbench_followups": mtbench_followups,
    "realtime_probes": realtime_probes,
})


def build_traces(data_dir: Path, *, names: Sequence[str] | None = None, seed: int = 20261129,
                 limit: int = 300) -> list[Conversation]:
    """Each converter draws from its own generator (seed and name), so a subset gives the same rows."""
    chosen = list(names) if names is not None else list(CONVERTERS)
    unknown = [n for n in chosen if n not in CONVERTERS]
    if unknown:
        raise ValueError(f"unknown converter(s) {unknown}; choose from {sorted(CONVERTERS)}")
    out: list[Conversation] = []
    for name in chosen:
        out += CONVERTERS[name](Path(data_dir), random.Random(f"{seed}:{name}"), limit)
    return _consistent(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m proxy.tools.datasets", description="Replay traces from ../shared/data."
    )
    ap.add_argument("out", type=Path, help="output JSONL")
    ap.add_argument("--names", nargs="+", choices=sorted(CONVERTERS), help="converters (default: all)")
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--limit", type=int, default=300, help="conversations per converter at most")
    ap.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    a = ap.parse_args(argv)
    convs = build_traces(a.data_dir, names=a.names, seed=a.seed, limit=a.limit)
    write_traces(a.out, convs)
    convs_by = Counter(c.category for c in convs)
    reqs_by: Counter[str] = Counter()
    for c in convs:
        reqs_by[c.category] += len(c.turns)
    for cat in sorted(convs_by):
        print(f"{cat:24s} conversations {convs_by[cat]:5d}  requests {reqs_by[cat]:6d}")
    print(f"total {len(convs)} conversations, {reqs_by.total()} requests -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
