"""The hard filters that throw a paraphrase out before the verifier or the judge reads it: over
labelled pairs from ../shared/data, side A is asked and its answer written back as a record, then
side B is asked by another user of the same tenant, as serving does (the planner, the cache and
the write-back of proxy.service.compose, the shipped policy, the default pack). Each pair is one
tenant of its own, so B's lookup meets A's record and nothing else.

What throws a pair out, in the order serving meets it:
- never-cache: A or B is read as an intent the policy never caches (realtime, medical); A's
  answer is not stored, or B is forwarded without a lookup;
- topic switch: B leaves its conversation's topic and is looked up for an exact repeat only;
- scope: A's answer was written to a pool B's lookup does not read (the intents' scope and
  widen_to);
- index admission: another model, request parameters or system-prompt version (the same here
  for both sides, so 0 unless a request's own parameters differ);
- intent: the decision's hard filter, B read as another intent than the one A was written under;
- entities (names) / entities (numbers): the decision's hard filter, a place, area, product or
  person, or a number slot, named on both sides with no value in common.

A true pair thrown out there is a hit nobody can serve; a false pair thrown out there is what the
filter is for. Pairs that pass every hard filter end where the rest of the decision ends them
(the stage is counted), and those the judge would be asked about (every net passed, at least the
judge's floor, and ranked by the pair verifier at the policy's judge_verify) are counted apart;
the judge itself is not called (there is no upstream), so none is served on its word here. For
the intent filter, each pair it throws out is also decided as if A's record carried B's intent:
what it keeps out that no later net would.

Sets (true pairs labelled same meaning; false pairs labelled different): QQP (en, Quora), GPTCache's
mock paraphrases (en; false pairs: one pair's question against another's paraphrase), GECOR
(en, in conversation: a restaurant dialogue's follow-up turn and its spelled-out form after the
same turns; true pairs only), LCQMC, BQ, ATEC (zh, everyday and bank questions), OPPO XiaoBu
(zh, voice-assistant chat) and PAWS-X zh (adversarial word swaps). Rows the replay harness's
development traces were built from are skipped (proxy.tools.verifier.heldout).

    .venv/bin/python benchmarks/bench_filters.py [--data ../shared/data] [--pairs 150] [--quick] \
        [--policy FILE] [--model-home DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
from measurement import DEFAULT_MODEL_HOME, HERE, add_pack_option, envelope, write_json
from rich.console import Console
from rich.table import Table

from proxy.core.decision.decide import DecisionContext, decide_in
from proxy.core.decision.judging import AskJudge, ask_judge, ranked_by_verifier
from proxy.core.identity import Identity
from proxy.core.model import Reason, Status
from proxy.core.openai.request import ChatRequest, parse_chat_request
from proxy.observability.metrics import Metrics
from proxy.service.compose import NOWHERE, Parts, open_parts
from proxy.service.planner import Plan
from proxy.service.reach import visible
from proxy.settings import load_settings
from proxy.tools.verifier.heldout import EvalRows, eval_rows
from proxy.tools.verifier.pairs import text_key

QUICK_PAIRS = 40  # true and as many false pairs a set under --quick
CHUNK = 16  # pairs asked together, so the embedder batches their turns
EXAMPLES = 5  # true pairs shown per filter
ANSWER = "Here is the answer."  # no facts of its own: answer validation has nothing to object to
FILTERS = (
    "never-cache",
    "topic switch",
    "scope",
    "index admission",
    "intent",
    "entities (names)",
    "entities (numbers)",
)
ROLES = ("user", "assistant")
PASSED = "passed every hard filter"
NAME_SLOTS = frozenset({"places", "areas", "products", "people"})


@dataclass(frozen=True)
class Pair:
    source: str
    a: str
    b: str
    same: bool
    history: tuple[tuple[str, str], ...] = ()  # (user, assistant) turns before both sides


@dataclass
class Outcome:
    pair: Pair
    filter: str | None = None  # the hard filter that threw it out, None: it passed them all
    detail: str = ""
    intents: tuple[str, str] = ("-", "-")
    stage: str = ""  # where the decision ended a pair that passed the hard filters
    judged: bool = False  # the judge would be asked about it (the verifier ranked it high enough)
    # thrown out by the intent filter: where the decision would have ended it without that filter
    # ("served", "judge reads", or the stage that stops it)
    without: str = ""


# --- the sets ------------------------------------------------------------------------------------


def _tsv(path: Path) -> Iterator[tuple[str, str, bool]]:
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0].strip() and parts[1].strip() and parts[2].strip() in ("0", "1"):
            yield parts[0].strip(), parts[1].strip(), parts[2].strip() == "1"


def _qqp(data: Path) -> Iterator[tuple[str, str, bool]]:
    for part in sorted((data / "gptcache_similar_qqp").glob("similiar_qqp_full.part*.jsonl")):
        for line in part.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            yield row["text_a"].strip(), row["text_b"].strip(), row["label"] == 1


def _mock(data: Path) -> Iterator[tuple[str, str, bool]]:
    rows = json.loads((data / "gptcache_mock_data" / "mock_data.json").read_text(encoding="utf-8"))
    for i, row in enumerate(rows):
        yield row["origin"], row["similar"], True
        yield row["origin"], rows[(i + 7) % len(rows)]["similar"], False


FLAT_SETS: Mapping[str, Callable[[Path], Iterator[tuple[str, str, bool]]]] = {
    "qqp (en)": _qqp,
    "gptcache mock (en)": _mock,
    "lcqmc (zh)": lambda d: _tsv(d / "zh_pairs" / "lcqmc.valid.tsv"),
    "bq (zh)": lambda d: _tsv(d / "zh_pairs" / "bq.valid.tsv"),
    "atec (zh)": lambda d: _tsv(d / "zh_pairs" / "atec.valid.tsv"),
    "oppo xiaobu (zh)": lambda d: _tsv(d / "oppo_xiaobu" / "train.tsv"),
    "pawsx (zh)": lambda d: _tsv(d / "pawsx_zh" / "PAWSX.valid.tsv"),
}


def flat_pairs(name: str, rows: Iterator[tuple[str, str, bool]], held: EvalRows, n: int, seed: int) -> list[Pair]:
    """``n`` true and ``n`` false pairs, drawn with the seed, none of the dev traces' texts."""
    by_label: dict[bool, list[Pair]] = {True: [], False: []}
    for a, b, same in rows:
        if a != b and text_key(a) not in held.texts and text_key(b) not in held.texts:
            by_label[same].append(Pair(name, a, b, same))
    rng = random.Random(seed)
    return [p for label in (True, False) for p in rng.sample(by_label[label], min(n, len(by_label[label])))]


def gecor_pairs(data: Path, held: EvalRows, n: int, seed: int) -> list[Pair]:
    """A follow-up turn as said and its spelled-out form, after the same turns of one dialogue."""
    dialogues = json.loads((data / "gecor_camrest676" / "CamRest676_annotated.json").read_text(encoding="utf-8"))
    found: list[Pair] = []
    for d in dialogues:
        turns = d["dial"]
        if held.holds_dialogue([t["usr"]["transcript"] for t in turns]):
            continue
        for i, t in enumerate(turns[1:], start=1):
            said, complete = t["usr"]["transcript"].strip(), t["usr"]["transcript_complete"].strip()
            if said and complete and text_key(said) != text_key(complete):
                history = tuple((u["usr"]["transcript"], u["sys"]["sent"]) for u in turns[:i])
                found.append(Pair("gecor (en, in conversation)", complete, said, True, history))
    return random.Random(seed).sample(found, min(n, len(found)))


def load_pairs(data: Path, n: int, seed: int) -> list[Pair]:
    held = eval_rows(data)
    pairs = [p for name, rows in FLAT_SETS.items() for p in flat_pairs(name, rows(data), held, n, seed)]
    return pairs + gecor_pairs(data, held, n, seed)


# --- asking --------------------------------------------------------------------------------------


def request(pair: Pair, turn: str) -> ChatRequest:
    messages = [
        {"role": role, "content": text} for turn in pair.history for role, text in zip(ROLES, turn, strict=True)
    ]
    body = {"model": "bench", "messages": [*messages, {"role": "user", "content": turn}]}
    return parse_chat_request(orjson.dumps(body))


def asker(i: int, side: str) -> Identity:
    """Pair ``i`` is a tenant of its own; each side is a user of it, in a session of its own."""
    return Identity(tenant=f"t-{i}", session=f"s-{i}-{side}", user=f"u-{i}-{side}", session_explicit=True)


async def ask_a(parts: Parts, i: int, pair: Pair) -> tuple[Plan, bool]:
    """A asked and its answer written back: (its plan, whether a record was written)."""
    req, who = request(pair, pair.a), asker(i, "a")
    plan = await parts.planner.plan(req, who)
    kept = await parts.write_back.keep(req, who, plan, ANSWER, {"prompt_tokens": 10, "completion_tokens": 5})
    return plan, kept.record is not None


async def ask_b(parts: Parts, i: int, pair: Pair, plan_a: Plan, stored: bool) -> Outcome:
    req, who = request(pair, pair.b), asker(i, "b")
    plan = await parts.planner.plan(req, who, judge=True)
    intent_a = plan_a.signature.tags.intent if plan_a.signature else "-"
    intent_b = plan.signature.tags.intent if plan.signature else "-"
    out = Outcome(pair, intents=(intent_a, intent_b))
    if plan_a.reason == Reason.INTENT_DISABLED or plan.reason == Reason.INTENT_DISABLED:
        out.filter = "never-cache"
    elif not stored:
        out.filter, out.detail = "A not stored", str(plan_a.reason)
    elif plan.status is Status.BYPASS:
        out.filter, out.detail = "B bypassed", str(plan.reason)
    elif plan.reason == Reason.TOPIC_SWITCH:
        out.filter = "topic switch"
    elif plan.reason == Reason.NO_CANDIDATE:
        out.filter = "scope" if not await _visible(parts, who, plan) else "index admission"
    elif plan.reason == Reason.FILTERED_INTENT:
        out.filter = "intent"
        out.without = await _without_intent_filter(parts, req, who, plan)
    elif plan.reason == Reason.FILTERED_ENTITIES:
        assert plan.decision is not None
        slots = set(plan.decision.detail.split(","))
        out.filter = "entities (names)" if slots & NAME_SLOTS else "entities (numbers)"
        out.detail = plan.decision.detail
    else:
        out.stage = "hit" if plan.status is Status.HIT else (plan.decision.stage if plan.decision else str(plan.reason))
        out.judged = plan.ask is not None and await _asked(parts, plan.ask, plan)
    return out


async def _visible(parts: Parts, who: Identity, plan: Plan) -> bool:
    """Is A's record (the tenant's only one) in a pool B's lookup reads?"""
    assert plan.policy is not None
    tenant_rows = [label for label, key in parts.cache.keys.items() if key.tenant == who.tenant]
    records = await parts.store.records.get_many(tenant_rows)
    return any(visible(r, who, plan.policy.widen_to) for r in records)


async def _without_intent_filter(parts: Parts, req: ChatRequest, who: Identity, plan: Plan) -> str:
    """Where the decision would end the pair had A's record carried B's intent: what the intent
    filter alone keeps out ("served", "judge reads" after the verifier's ranking, or the stage)."""
    assert plan.signature is not None and plan.policy is not None
    sig, policy = plan.signature, plan.policy
    found = await parts.cache.candidates(sig, req, who, policy)
    read_as = [
        replace(c, record=replace(c.record, coarse_tags=replace(c.record.coarse_tags, intent=sig.tags.intent)))
        for c in found.ready
    ]
    ctx = DecisionContext(read_as, sig, policy)
    decision = decide_in(ctx)
    if decision.status is Status.HIT:
        return "served"
    if await _asked(parts, ask_judge(ctx, decision), plan):
        return "judge reads"
    return "verifier" if ask_judge(ctx, decision) else decision.stage or str(decision.reason)


async def _asked(parts: Parts, ask: AskJudge, plan: Plan) -> bool:
    """Is anything left for the judge once the pair verifier ranked what it would read
    (``judge_verify``), as serving ranks it before the judge starts?"""
    assert plan.signature is not None and plan.policy is not None
    if ask and plan.policy.judge_verify is not None and parts.verifier is not None:
        scored = await parts.verifier.verdicts(list(ask.candidates), plan.signature)
        ask = ranked_by_verifier(ask, scored, plan.policy)
    return bool(ask)


async def run_pairs(parts: Parts, pairs: Sequence[Pair], progress: Callable[[int], None]) -> list[Outcome]:
    out: list[Outcome] = []
    for start in range(0, len(pairs), CHUNK):
        chunk = list(enumerate(pairs[start : start + CHUNK], start=start))
        firsts = await asyncio.gather(*(ask_a(parts, i, p) for i, p in chunk))
        out += await asyncio.gather(*(ask_b(parts, i, p, *first) for (i, p), first in zip(chunk, firsts, strict=True)))
        progress(len(chunk))
    return out


# --- the figures ---------------------------------------------------------------------------------


def share(n: int, of: int) -> float | None:
    return round(n / of, 3) if of else None


def split(outcomes: Sequence[Outcome]) -> tuple[list[Outcome], list[Outcome]]:
    """(true pairs, false pairs)"""
    return [o for o in outcomes if o.pair.same], [o for o in outcomes if not o.pair.same]


def counted(outcomes: Sequence[Outcome], key: Callable[[Outcome], str | None]) -> dict[str, dict[str, int]]:
    """True and false pairs by ``key`` (None: not counted), the most frequent first."""
    rows: dict[str, dict[str, int]] = defaultdict(lambda: {"true": 0, "false": 0})
    for o in outcomes:
        k = key(o)
        if k is not None:
            rows[k]["true" if o.pair.same else "false"] += 1
    return dict(sorted(rows.items(), key=lambda kv: -sum(kv[1].values())))


def tabulate(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    truths, falses = split(outcomes)
    names = [*FILTERS, *sorted({o.filter for o in outcomes if o.filter and o.filter not in FILTERS}), PASSED]
    filters = {}
    for name in names:
        nt = sum((o.filter or PASSED) == name for o in truths)
        nf = sum((o.filter or PASSED) == name for o in falses)
        filters[name] = {
            "true": nt,
            "true share": share(nt, len(truths)),
            "false": nf,
            "false share": share(nf, len(falses)),
        }
    by_set: dict[str, dict[str, Any]] = {}
    for source in dict.fromkeys(o.pair.source for o in outcomes):
        t, f = split([o for o in outcomes if o.pair.source == source])
        top = Counter(o.filter for o in t if o.filter).most_common(2)
        by_set[source] = {
            "true pairs": len(t),
            "true thrown": sum(o.filter is not None for o in t),
            "false pairs": len(f),
            "false thrown": sum(o.filter is not None for o in f),
            "true to the judge": sum(o.judged for o in t),
            "false to the judge": sum(o.judged for o in f),
            "true thrown most by": ", ".join(f"{k} {v}" for k, v in top) or "-",
        }
    return {
        "pairs": {"true": len(truths), "false": len(falses)},
        "pairs thrown out, by filter": filters,
        "by set": by_set,
        "intent filter, by intent pair": counted(
            outcomes, lambda o: " / ".join(sorted(o.intents)) if o.filter == "intent" else None
        ),
        "passed, where the decision ended them": counted(outcomes, lambda o: o.stage if o.filter is None else None),
        "thrown out by intent, where the decision would end them without it": counted(
            outcomes, lambda o: o.without if o.filter == "intent" else None
        ),
        "judge would be asked": {"true": sum(o.judged for o in truths), "false": sum(o.judged for o in falses)},
        "examples (true pairs thrown out)": examples(truths),
    }


def examples(truths: Sequence[Outcome]) -> dict[str, list[str]]:
    shown: dict[str, list[str]] = defaultdict(list)
    for o in truths:
        if o.filter and len(shown[o.filter]) < EXAMPLES:
            detail = f" [{o.detail}]" if o.detail else ""
            shown[o.filter].append(f"{o.pair.a!r} ({o.intents[0]}) | {o.pair.b!r} ({o.intents[1]}){detail}")
    return dict(shown)


async def measure(a: argparse.Namespace) -> dict[str, Any]:
    n = QUICK_PAIRS if a.quick else a.pairs
    pairs = load_pairs(a.data, n, a.seed)
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="smartcache-bench-filters-") as tmp:
        s = load_settings(
            environ={},
            overrides={
                "data_dir": Path(tmp),
                "model_home": a.model_home,
                "upstream": NOWHERE,
                "embedding_model": a.pack,
                "policy": a.policy,
                "ready_after": 0.0,  # written answers are served at once, as the replay harness sets it
                # the judge's own calls are never made (no upstream): the verifier that ranks what
                # it reads is loaded, and what it would be asked is counted
                "judge": True,
                # offline, an answer is worth waiting for: a timed-out embedding or verdict would
                # make a bypass or an unread pair no live proxy would have made
                "embed_timeout_ms": 600_000.0,
                "verify_timeout_ms": 0.0,
            },
        )
        async with open_parts(s, upstream_url=NOWHERE, metrics=Metrics()) as parts:
            done = 0

            def progress(k: int) -> None:
                nonlocal done
                done += k
                if done % 400 < k:
                    console.print(f"{done}/{len(pairs)} pairs", highlight=False)

            outcomes = await run_pairs(parts, pairs, progress)
            head = {"pack": a.pack, "policy_version": parts.policy_box.policy.version}
    return {**head, **tabulate(outcomes)}


def show(r: Mapping[str, Any]) -> None:
    console = Console(width=160)
    p = r["pairs"]
    title = f"hard filters over {p['true']} true and {p['false']} false paraphrase pairs ({r['policy_version']})"
    table = Table(title=title)
    for col in ("filter", "true pairs", "share", "false pairs", "share"):
        table.add_column(col, justify="left" if col == "filter" else "right")
    for name, row in r["pairs thrown out, by filter"].items():
        cells = (row["true"], row["true share"], row["false"], row["false share"])
        table.add_row(name, *("-" if c is None else str(c) for c in cells))
    console.print(table)
    sets = Table(title="by set")
    cols = list(next(iter(r["by set"].values())))
    sets.add_column("set")
    for col in cols:
        sets.add_column(col, overflow="fold")
    for name, row in r["by set"].items():
        sets.add_row(name, *(str(row[c]) for c in cols))
    console.print(sets)
    pairs = ", ".join(f"{k} {v['true']}/{v['false']}" for k, v in r["intent filter, by intent pair"].items())
    console.print(f"intent filter, true/false pairs thrown by intent pair: {pairs or '-'}")
    stages = ", ".join(f"{k} {v['true']}/{v['false']}" for k, v in r["passed, where the decision ended them"].items())
    console.print(f"passed every hard filter, true/false by the stage that ended them: {stages}")
    alone = r["thrown out by intent, where the decision would end them without it"]
    stopped = ", ".join(f"{k} {v['true']}/{v['false']}" for k, v in alone.items())
    console.print(f"thrown out by intent, true/false by where they would end without it: {stopped or '-'}")
    j = r["judge would be asked"]
    console.print(f"the judge would be asked (after the verifier's ranking): {j['true']} true, {j['false']} false")
    for name, shown in r["examples (true pairs thrown out)"].items():
        console.print(f"[bold]{name}[/bold]: true pairs thrown out")
        for line in shown:
            console.print(f"  {line}", highlight=False, markup=False)


def default_model_home() -> Path:
    env = os.environ.get("SMARTCACHE_MODEL_HOME") or os.environ.get("SMARTCACHE_TEST_MODEL_HOME")
    return Path(env) if env else DEFAULT_MODEL_HOME


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data")
    ap.add_argument("--pairs", type=int, default=150, help="true pairs, and as many false ones, a set")
    ap.add_argument("--seed", type=int, default=20261207)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_PAIRS} true and {QUICK_PAIRS} false pairs a set")
    ap.add_argument("--model-home", type=Path, default=default_model_home())
    ap.add_argument("--policy", type=Path, help="a policy file (default: the one shipped for the pack)")
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    add_pack_option(ap)
    args = ap.parse_args()
    measured = asyncio.run(measure(args))
    show(measured)
    if args.json:
        argv = ["benchmarks/bench_filters.py", *sys.argv[1:]]
        write_json(args.json, "bench_filters", envelope("bench_filters", argv, measured))
