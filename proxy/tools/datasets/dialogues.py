"""Multi-turn converters: GECOR follow-ups and openings, KVRET rewrites, CrossWOZ dialogues,
MT-Bench follow-ups. Dialogues the shipped pair verifier mined training pairs from are left out."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from proxy.tools.datasets.pairs import verifier_trained_dialogue
from proxy.tools.datasets.traces import (
    EN_SYSTEM,
    ZH_SYSTEM,
    Conversation,
    Draft,
    HeldOut,
    consistent,
    held_out,
    norm_text,
    read_jsonl,
)

# --- multi-turn sets --------------------------------------------------------------------------


Dialogue = tuple[list[dict[str, Any]], list[str]]  # CamRest676's turns, and its user turns normalised


def _camrest(data_dir: Path, held: HeldOut) -> dict[int, Dialogue]:
    """CamRest676's dialogues by index, less those the dev traces open with and those the shipped
    verifier mined."""
    dials = json.loads((data_dir / "gecor_camrest676" / "CamRest676_annotated.json").read_text(encoding="utf-8"))
    trained = verifier_trained_dialogue()
    out: dict[int, Dialogue] = {}
    for di, d in enumerate(dials):
        users = [norm_text(t["usr"]["transcript"]) for t in d["dial"]]
        if tuple(users[:2]) not in held.openings and not trained(f"gecor:{di}"):
            out[di] = (d["dial"], users)
    return out


def _gecor_groups(dials: dict[int, Dialogue]) -> dict[str, list[tuple[int, int]]]:
    """Elliptical follow-up text -> (dialogue, turn) whose complete forms differ, one per form."""
    groups: dict[str, dict[str, tuple[int, int]]] = {}
    for di, (turns, users) in dials.items():
        for ti, t in enumerate(turns[1:], 1):
            raw, full = users[ti], norm_text(t["usr"].get("transcript_complete") or "")
            if raw and full and raw != full:
                groups.setdefault(raw, {}).setdefault(full, (di, ti))
    return {raw: list(forms.values()) for raw, forms in groups.items() if len(forms) >= 2}


def gecor_followups(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """The same elliptical follow-up after different CamRest676 dialogues (different keys); half of
    them then restate its complete form in the same conversation (same key)."""
    dials = _camrest(data_dir, held_out(data_dir))
    groups = _gecor_groups(dials)
    names = sorted(groups)
    rng.shuffle(names)
    used: set[int] = set()
    out: list[Conversation] = []
    for gi, raw in enumerate(names):
        picks = [(di, ti) for di, ti in groups[raw] if di not in used]
        rng.shuffle(picks)
        for ri, (di, ti) in enumerate(picks[:6] if len(picks) >= 2 else []):
            used.add(di)
            turns = dials[di][0]
            draft = Draft(EN_SYSTEM)
            for t in turns[:ti]:
                draft.ask(t["usr"]["transcript"], answer=t["sys"]["sent"])
            target = turns[ti]
            k = draft.ask(target["usr"]["transcript"], answer=target["sys"]["sent"])
            if rng.random() < 0.5:
                draft.ask(target["usr"]["transcript_complete"], key=k)
            out.append(draft.done(f"camrest-{gi}-{ri}", "camrest_followup", "cal-camrest"))
    return consistent(out)[:limit]


def gecor_openings(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """CamRest676 openings across sessions: each dialogue's first two turns, a session of its own in
    one tenant, keyed by its own words. Many ask for a restaurant under nearly the same constraints
    and were answered with another venue or question, so a reworded opening served another
    dialogue's answer counts as false, as the replay harness's CamRest conversations count it."""
    held = held_out(data_dir)
    dials = _camrest(data_dir, held)
    picks = [di for di, (_, users) in dials.items() if len(users) >= 2 and users[0] not in held.texts]
    rng.shuffle(picks)
    out: list[Conversation] = []
    for di in picks[:limit]:
        draft = Draft(EN_SYSTEM)
        for t in dials[di][0][:2]:
            draft.ask(t["usr"]["transcript"], answer=t["sys"]["sent"])
        out.append(draft.done(f"camopen-{di}", "camrest_opening", "cal-camopen"))
    return consistent(out)


def _kvret_records(dials: list[dict[str, Any]], held: HeldOut) -> list[tuple[int, int]]:
    """(dialogue, assistant turn) whose reformulation rewrites the driver turn before it, which
    follows at least one other driver turn; dialogues the dev traces use are skipped."""
    out = []
    trained = verifier_trained_dialogue()
    for di, d in enumerate(dials):
        turns = d["dialogue"]
        refs = [t.get("reformulation") or {} for t in turns]
        if trained(f"kvret:{di}"):
            continue
        if any(norm_text(p) in held.texts for r in refs for p in r.get("mturk_reformulations") or []):
            continue
        for i, r in enumerate(refs):
            drivers_before = sum(t["turn"] == "driver" for t in turns[: i - 1])
            gold = norm_text(r.get("reformulated_utt") or "")
            distinct = {norm_text(p) for p in r.get("mturk_reformulations") or []} - {gold}
            if gold and len(distinct) >= 2 and i >= 2 and turns[i - 1]["turn"] == "driver" and drivers_before >= 1:
                out.append((di, i))
    return out


def kvret_rewrites(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """CQR-KVRET: a multi-turn request, then a crowd paraphrase of its self-contained form in the same
    conversation, another paraphrase and the gold rewrite each in a new conversation (same key)."""
    dials = json.loads((data_dir / "cqr_kvret" / "cqr_kvret_dev_public.json").read_text(encoding="utf-8"))
    records = _kvret_records(dials, held_out(data_dir))
    rng.shuffle(records)
    out: list[Conversation] = []
    for n, (di, i) in enumerate(records[: limit // 3]):
        turns = dials[di]["dialogue"]
        ref = turns[i]["reformulation"]
        draft = Draft(EN_SYSTEM)
        k = ""
        for j, t in enumerate(turns[:i]):
            if t["turn"] == "driver":
                nxt = turns[j + 1]["data"]["utterance"] if turns[j + 1]["turn"] == "assistant" else None
                k = draft.ask(t["data"]["utterance"], answer=nxt)
        gold = ref["reformulated_utt"]
        distinct = {norm_text(p): p for p in ref["mturk_reformulations"] if norm_text(p) != norm_text(gold)}
        same, other = rng.sample(sorted(distinct.values()), 2)
        draft.ask(same, key=k)
        out.append(draft.done(f"kvret-{n}", "kvret_rewrite", "cal-kvret"))
        for suffix, text in (("p", other), ("g", gold)):
            fresh = Draft(EN_SYSTEM)
            fresh.ask(text, key=k)
            out.append(fresh.done(f"kvret-{n}-{suffix}", "kvret_rewrite", "cal-kvret"))
    return consistent(out)


_QUESTION = re.compile(r"[？?]|吗|什么|哪|多少|几|怎么|是否")
_THANKS = re.compile(r"谢|再见|没有问题|没问题")


def crosswoz_dialogues(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """Whole CrossWOZ val dialogues, every user turn its own key (any hit inside is false); in about
    half, one question is asked again right after its answer (same key, measures recall)."""
    trained = verifier_trained_dialogue()
    rows = [
        r for r in read_jsonl(data_dir / "crosswoz" / "val_turns.jsonl") if not trained(f"crosswoz:{r['dialog_id']}")
    ]
    out: list[Conversation] = []
    for idx in rng.sample(range(len(rows)), min(limit, len(rows))):
        turns = rows[idx]["turns"]
        pairs = [
            (t["content"], turns[j + 1]["content"] if j + 1 < len(turns) and turns[j + 1]["role"] == "sys" else None)
            for j, t in enumerate(turns)
            if t["role"] == "usr" and t["content"].strip()
        ]
        askable = [j for j, (u, _) in enumerate(pairs) if _QUESTION.search(u) and not _THANKS.search(u)]
        again = rng.choice(askable) if askable and rng.random() < 0.5 else None
        draft = Draft(ZH_SYSTEM)
        for j, (user, answer) in enumerate(pairs):
            k = draft.ask(user, answer=answer)
            if j == again:
                draft.ask(user, key=k, answer=answer)
        category = "crosswoz_dialogue" if again is None else "crosswoz_repeat"
        out.append(draft.done(f"crosswoz-{rows[idx]['dialog_id']}", category, "cal-crosswoz"))
    return consistent(out)


def _mtbench(folder: Path, lang: str, rng: random.Random, n: int) -> list[Conversation]:
    ref_path = folder / "reference_answer_gpt-4.jsonl"
    refs = {r["question_id"]: r["choices"][0]["turns"] for r in read_jsonl(ref_path)} if ref_path.is_file() else {}
    trained = verifier_trained_dialogue()
    qs = [q for q in read_jsonl(folder / "question.jsonl") if not trained(f"mt_bench:{q['question_id']}")]
    out = []
    for q in rng.sample(qs, min(n, len(qs))):
        draft = Draft(ZH_SYSTEM if lang == "zh" else EN_SYSTEM)
        answers = refs.get(q["question_id"], [])
        for j, user in enumerate(q["turns"]):
            draft.ask(user, answer=answers[j] if j < len(answers) else None)
        out.append(draft.done(f"mtbench-{lang}-{q['question_id']}", f"mtbench_{lang}", "cal-mtbench"))
    return out


def _mtbench101(path: Path, rng: random.Random, n: int) -> list[Conversation]:
    """Dialogues sharing a follow-up text come first (whole groups, up to half), then random ones."""
    rows = read_jsonl(path)
    by_text: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        for h in r["history"][1:]:
            by_text.setdefault(norm_text(h["user"]), []).append(i)
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
        draft = Draft(EN_SYSTEM)
        for h in rows[i]["history"]:
            draft.ask(h["user"], answer=h.get("bot") or None)
        out.append(draft.done(f"mtbench101-{rows[i]['id']}", "mtbench101", "cal-mtbench"))
    return out


def mtbench_followups(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """MT-Bench (en, zh) and MT-Bench-101: follow-ups that lean on earlier turns, each turn its own key."""
    quarter = limit // 4
    out = _mtbench(data_dir / "mt_bench", "en", rng, quarter) + _mtbench(data_dir / "mt_bench_zh", "zh", rng, quarter)
    out += _mtbench101(data_dir / "mt_bench_101" / "mtbench101.jsonl", rng, limit - len(out))
    return consistent(out)
