"""Pairs mined from conversation data: the same words under another context, and rewrites.

- GECOR CamRest676 (en): an elliptical or coreferent turn ("what is their address?") read with
  its context vs its gold complete form is a positive; the same raw words in two dialogues are a
  positive when their complete forms agree (same restaurant) and a negative when they differ.
- CQR-KVRET (en): the last driver turn in context vs a crowd rewrite of the self-contained
  request is a positive, two rewrites of one request are positives; the rewrite of the most
  similar request of another dialogue is a negative (one constraint or entity changed).
- CrossWOZ (zh): a context-dependent user turn (这家/他家/那里/附近 ...) repeated word for word in
  another dialogue after another reply is a negative; no positives (it has no rewrites).
- MT-Bench en/zh: the same question in English and Chinese is a positive (with its first turn as
  context for the second turn); another question's second turn is a negative.
- Next turns (CamRest676, CrossWOZ, MT-Bench): a user turn read with its context vs the turn
  before it in the same dialogue is a negative. It is the candidate a cache meets most: every
  earlier turn of the session is one, and a follow-up that narrows the question before it
  ("I want to improve my cardiovascular health." after "How much exercise should I do?") asks
  for another answer. A turn whose complete form is the previous turn's is left out.
- Restated turns (CQR-KVRET, CamRest676, CrossWOZ), read as the cache meets them: the turn
  right after an elliptical one, spelling it out (its rewrite or complete form) or asking it
  again word for word, read with that turn as its previous question, vs that turn in its own
  context, is a positive. Without them the next-turn negatives teach that a candidate which is
  the request's previous turn is always another request. KVRET's next driver turn in the same
  layout is a negative.

Dialogues are split first (``split_of`` over the dialogue id) and pairs are mined only among
the dialogues of one split, so no dialogue feeds two splits. Dialogues the replay traces use
are forced into ``test``.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from proxy.tools.verifier.heldout import EvalRows
from proxy.tools.verifier.pairs import LabeledPair, text_key
from proxy.tools.verifier.splits import Split, split_of
from proxy.verify import PairSide

__all__ = ["MINED_SETS", "mine"]

_DEICTIC_ZH = (
    "这家",
    "他家",
    "它家",
    "那家",
    "该",
    "这个",
    "那个",
    "这里",
    "那里",
    "附近",
    "周边",
    "它",
    "他们",
    "这儿",
)
_PER_GROUP = 8


def _grams(text: str) -> set[str]:
    t = text_key(text)
    return {t[i : i + 3] for i in range(max(1, len(t) - 2))}


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / max(1, len(a | b))


def _pairs_of(items: list[Any], rng: random.Random, limit: int) -> Iterator[tuple[Any, Any]]:
    combos = [(items[i], items[j]) for i in range(len(items)) for j in range(i + 1, len(items))]
    rng.shuffle(combos)
    yield from combos[:limit]


def _camrest_dialogues(
    data: Path, keep: Callable[[str, list[str]], bool]
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """The CamRest676 dialogues (GECOR's annotation) the split keeps: (index, turns)."""
    dials = json.loads((data / "gecor_camrest676/CamRest676_annotated.json").read_text(encoding="utf-8"))
    for di, d in enumerate(dials):
        turns = d["dial"]
        if keep(f"gecor:{di}", [t["usr"]["transcript"] for t in turns]):
            yield di, turns


def _crosswoz_dialogues(
    data: Path, keep: Callable[[str, list[str]], bool]
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The CrossWOZ validation dialogues the split keeps: (dialog id, turns)."""
    for line in (data / "crosswoz/val_turns.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        turns, dialog = row["turns"], str(row["dialog_id"])
        if keep(f"crosswoz:{dialog}", [t["content"] for t in turns if t["role"] == "usr"]):
            yield dialog, turns


def _camrest_side(turns: list[dict[str, Any]], ti: int) -> PairSide:
    """User turn ``ti`` of a CamRest676 dialogue, read after the turn before it and its reply."""
    question = turns[ti]["usr"]["transcript"].strip()
    if ti == 0:
        return PairSide(question)
    return PairSide(question, turns[ti - 1]["usr"]["transcript"].strip(), turns[ti - 1]["sys"]["sent"].strip())


def _gecor(data: Path, keep: Callable[[str, list[str]], bool], rng: random.Random) -> Iterator[LabeledPair]:
    groups: dict[str, list[tuple[int, PairSide, str]]] = defaultdict(list)
    for di, turns in _camrest_dialogues(data, keep):
        for ti in range(1, len(turns)):
            raw, full = turns[ti]["usr"]["transcript"].strip(), turns[ti]["usr"]["transcript_complete"].strip()
            if not raw or not full or text_key(raw) == text_key(full):
                continue
            side = _camrest_side(turns, ti)
            yield LabeledPair("mined_gecor", side, PairSide(full), 1, f"gecor:{di}")
            groups[text_key(raw)].append((di, side, text_key(full)))
    for group in groups.values():
        for (d1, s1, f1), (d2, s2, f2) in _pairs_of(group, rng, _PER_GROUP):
            if d1 != d2:
                yield LabeledPair("mined_gecor", s1, s2, int(f1 == f2), f"gecor:{d1}+{d2}")


def _kvret(data: Path, keep: Callable[[str, list[str]], bool], rng: random.Random) -> Iterator[LabeledPair]:
    dials = json.loads((data / "cqr_kvret/cqr_kvret_dev_public.json").read_text(encoding="utf-8"))
    requests: list[tuple[int, PairSide, list[str]]] = []
    for di, d in enumerate(dials):
        turns = d["dialogue"]
        drivers = [t["data"]["utterance"] for t in turns if t["turn"] == "driver"]
        if not keep(f"kvret:{di}", drivers):
            continue
        for ti, t in enumerate(turns):
            ref = t.get("reformulation") or {}
            rewrites = [r for r in [ref.get("reformulated_utt"), *ref.get("mturk_reformulations", [])] if r]
            users = [j for j, x in enumerate(turns[:ti]) if x["turn"] == "driver"]
            if len(rewrites) < 2 or not users:
                continue
            last = users[-1]
            before = [j for j in users if j < last]
            reply = turns[last - 1]["data"]["utterance"] if last >= 1 and turns[last - 1]["turn"] == "assistant" else ""
            side = PairSide(
                turns[last]["data"]["utterance"], turns[before[-1]]["data"]["utterance"] if before else "", reply
            )
            requests.append((di, side, rewrites))
    for di, side, rewrites in requests:
        for rewrite in rewrites[:4]:
            yield LabeledPair("mined_kvret", side, PairSide(rewrite), 1, f"kvret:{di}")
        for r1, r2 in _pairs_of(rewrites, rng, 4):
            yield LabeledPair("mined_kvret", PairSide(r1), PairSide(r2), 1, f"kvret:{di}")
        grams = _grams(rewrites[0])
        others = [(o, rw) for o, _s, rw in requests if o != di]
        if others:
            o, rw = max(others, key=lambda item: _jaccard(grams, _grams(item[1][0])))
            yield LabeledPair("mined_kvret", PairSide(rewrites[1]), PairSide(rw[0]), 0, f"kvret:{di}+{o}")
            yield LabeledPair("mined_kvret", side, PairSide(rw[1]), 0, f"kvret:{di}+{o}")


def _crosswoz(data: Path, keep: Callable[[str, list[str]], bool], rng: random.Random) -> Iterator[LabeledPair]:
    groups: dict[str, list[tuple[str, PairSide]]] = defaultdict(list)
    for dialog, turns in _crosswoz_dialogues(data, keep):
        for ti in range(2, len(turns)):
            t, reply, previous = turns[ti], turns[ti - 1], turns[ti - 2]
            if t["role"] == "usr" and reply["role"] == "sys" and any(w in t["content"] for w in _DEICTIC_ZH):
                groups[text_key(t["content"])].append(
                    (dialog, PairSide(t["content"], previous["content"], reply["content"]))
                )
    for group in groups.values():
        for (d1, s1), (d2, s2) in _pairs_of(group, rng, _PER_GROUP // 2):
            if d1 != d2 and text_key(s1.previous_reply_head) != text_key(s2.previous_reply_head):
                yield LabeledPair("mined_crosswoz", s1, s2, 0, f"crosswoz:{d1}+{d2}")


def _mt_bench(data: Path, keep: Callable[[str, list[str]], bool], rng: random.Random) -> Iterator[LabeledPair]:
    def questions(folder: str) -> dict[int, list[str]]:
        lines = (data / folder / "question.jsonl").read_text(encoding="utf-8").splitlines()
        return {int(r["question_id"]): r["turns"] for r in map(json.loads, lines)}

    en, zh = questions("mt_bench"), questions("mt_bench_zh")
    ids = [q for q in sorted(en) if q in zh and keep(f"mt_bench:{q}", en[q])]
    for q in ids:
        (e1, e2), (z1, z2) = en[q][:2], zh[q][:2]
        yield LabeledPair("mined_mt_bench", PairSide(e1), PairSide(z1), 1, f"mt_bench:{q}")
        yield LabeledPair("mined_mt_bench", PairSide(e2, e1), PairSide(z2, z1), 1, f"mt_bench:{q}")
        for other in rng.sample([o for o in ids if o != q], min(2, len(ids) - 1)):
            for lang in (en, zh):
                yield LabeledPair(
                    "mined_mt_bench",
                    PairSide(lang[q][1], lang[q][0]),
                    PairSide(lang[other][1], lang[other][0]),
                    0,
                    f"mt_bench:{q}+{other}",
                )


def _next_turns(data: Path, keep: Callable[[str, list[str]], bool], rng: random.Random) -> Iterator[LabeledPair]:
    for di, turns in _camrest_dialogues(data, keep):
        for ti in range(1, len(turns)):
            side, earlier = _camrest_side(turns, ti), _camrest_side(turns, ti - 1)
            same = text_key(turns[ti]["usr"]["transcript_complete"]) == text_key(
                turns[ti - 1]["usr"]["transcript_complete"]
            )
            if side.question and not same:
                yield LabeledPair("mined_next_turn", side, earlier, 0, f"gecor:{di}")
    for dialog, turns in _crosswoz_dialogues(data, keep):
        users = [i for i, t in enumerate(turns) if t["role"] == "usr" and t["content"].strip()]
        for k in rng.sample(range(1, len(users)), min(3, max(0, len(users) - 1))):
            i, j = users[k], users[k - 1]
            reply = turns[i - 1]["content"] if turns[i - 1]["role"] == "sys" else ""
            earlier_reply = turns[j - 1]["content"] if j >= 1 and turns[j - 1]["role"] == "sys" else ""
            earlier = PairSide(turns[j]["content"], turns[users[k - 2]]["content"] if k >= 2 else "", earlier_reply)
            side = PairSide(turns[i]["content"], turns[j]["content"], reply)
            if text_key(side.question) != text_key(earlier.question):
                yield LabeledPair("mined_next_turn", side, earlier, 0, f"crosswoz:{dialog}")
    for folder in ("mt_bench", "mt_bench_zh"):
        for r in map(json.loads, (data / folder / "question.jsonl").read_text(encoding="utf-8").splitlines()):
            q, (t1, t2) = int(r["question_id"]), r["turns"][:2]
            if keep(f"mt_bench:{q}", r["turns"]):
                yield LabeledPair("mined_next_turn", PairSide(t2, t1), PairSide(t1), 0, f"mt_bench:{q}")


def _restated(data: Path, keep: Callable[[str, list[str]], bool], rng: random.Random) -> Iterator[LabeledPair]:
    dials = json.loads((data / "cqr_kvret/cqr_kvret_dev_public.json").read_text(encoding="utf-8"))
    for di, d in enumerate(dials):
        turns = d["dialogue"]
        if not keep(f"kvret:{di}", [t["data"]["utterance"] for t in turns if t["turn"] == "driver"]):
            continue
        drivers = [j for j, t in enumerate(turns) if t["turn"] == "driver"]
        for ti, t in enumerate(turns):
            ref = t.get("reformulation") or {}
            rewrites = [r for r in [ref.get("reformulated_utt"), *ref.get("mturk_reformulations", [])] if r]
            users = [j for j in drivers if j < ti]
            if not rewrites or not users or t["turn"] != "assistant":
                continue
            last = users[-1]
            before = [j for j in users if j < last]
            asked = turns[last]["data"]["utterance"]
            reply_before = (
                turns[last - 1]["data"]["utterance"] if last >= 1 and turns[last - 1]["turn"] == "assistant" else ""
            )
            earlier = PairSide(asked, turns[before[-1]]["data"]["utterance"] if before else "", reply_before)
            reply = t["data"]["utterance"]
            for rewrite in rng.sample(rewrites, min(2, len(rewrites))):
                yield LabeledPair("mined_restated", PairSide(rewrite, asked, reply), earlier, 1, f"kvret:{di}")
            after = next((j for j in drivers if j > ti), None)
            if after is not None and text_key(turns[after]["data"]["utterance"]) != text_key(asked):
                side = PairSide(turns[after]["data"]["utterance"], asked, reply)
                yield LabeledPair("mined_restated", side, earlier, 0, f"kvret:{di}")
    for di, turns in _camrest_dialogues(data, keep):
        for ti in range(len(turns)):
            raw, full = turns[ti]["usr"]["transcript"].strip(), turns[ti]["usr"]["transcript_complete"].strip()
            reply = turns[ti]["sys"]["sent"].strip()
            if raw and full and text_key(raw) != text_key(full):
                yield LabeledPair(
                    "mined_restated", PairSide(full, raw, reply), _camrest_side(turns, ti), 1, f"gecor:{di}"
                )
        ti = rng.randrange(len(turns))
        raw = turns[ti]["usr"]["transcript"].strip()
        if raw:
            side = PairSide(raw, raw, turns[ti]["sys"]["sent"].strip())
            yield LabeledPair("mined_restated", side, _camrest_side(turns, ti), 1, f"gecor:{di}")
    for dialog, turns in _crosswoz_dialogues(data, keep):
        users = [i for i, t in enumerate(turns) if t["role"] == "usr" and t["content"].strip()]
        answered = [k for k, i in enumerate(users) if i + 1 < len(turns) and turns[i + 1]["role"] == "sys"]
        if not answered:
            continue
        k = rng.choice(answered)
        i = users[k]
        reply_before = turns[i - 1]["content"] if i >= 1 and turns[i - 1]["role"] == "sys" else ""
        earlier = PairSide(turns[i]["content"], turns[users[k - 1]]["content"] if k >= 1 else "", reply_before)
        side = PairSide(turns[i]["content"], turns[i]["content"], turns[i + 1]["content"])
        yield LabeledPair("mined_restated", side, earlier, 1, f"crosswoz:{dialog}")


MINED_SETS: dict[str, Callable[[Path, Callable[[str, list[str]], bool], random.Random], Iterator[LabeledPair]]] = {
    "mined_gecor": _gecor,
    "mined_kvret": _kvret,
    "mined_crosswoz": _crosswoz,
    "mined_mt_bench": _mt_bench,
    "mined_next_turn": _next_turns,
    "mined_restated": _restated,
}


def mine(data: Path, seed: int, held_out: EvalRows) -> dict[Split, list[LabeledPair]]:
    """Every mined set, split by dialogue; traced dialogues (``held_out``) go to test."""
    out: dict[Split, list[LabeledPair]] = {"train": [], "calib": [], "test": []}
    for split in out:

        def keep(dialogue: str, user_turns: list[str], split: Split = split) -> bool:
            assigned = "test" if held_out.holds_dialogue(user_turns) else split_of(seed, dialogue)
            return assigned == split

        for name, miner in MINED_SETS.items():
            out[split] += miner(data, keep, random.Random(f"{seed}|{name}|{split}"))
    return out
