"""Intent classifier precision and recall per intent, on labelled single turns (from ../shared/data
and hand-written), and what it reads on the replay harness's development traces, which carry no
intent label.

Labelled sets (first user turns; each turn classified alone):
- shared: each data set's own annotation, mapped onto the shipped policy's intents. CrossWOZ val:
  trip planning in Beijing → travel; CQR-KVRET dev: `weather` → realtime (current conditions),
  `navigate` / `schedule` → general (no shipped intent covers in-car assistants); MT-Bench en + zh:
  `coding` → code, `writing` → doc_rewrite, `roleplay` → chitchat, `math`, `reasoning`, `stem`,
  `humanities`, `extraction` → general. No row asks the shop, so a shop intent's precision here
  is how often an ordinary request is read as one.
- hand-written: benchmarks/data/intent_utterances.tsv (issue 46.6): the shop's service intents
  (refund, after_sales, logistics, customer_support) and everyday questions beside them (cooking,
  home, how-to), both languages. Its header says how it was written: not a held-out figure.

Precision of an intent: of the turns read as it, the share labelled it; recall: of the turns
labelled it, the share read as it. An intent nothing is read as has no precision ("-").

The development traces (../shared/eval/dev_traces.jsonl) carry categories and, for two turns,
`expect: no_hit`, but no intent: every user turn is signed with the turns before it (as the proxy
signs it, never-cache carry-over and running intent included) and what is measured is how each
category's turns are read: the share read as never-cache (realtime or medical: a bypass) and as
each other intent, and whether the `no_hit` turns are read as never-cache. Nothing here is tuned
on those rows (../shared/eval/README.md).

    .venv/bin/python benchmarks/bench_intent.py [--data ../shared/data] [--per-source 80] \
        [--traces ../shared/eval/dev_traces.jsonl] [--quick] [--model-home DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from measurement import HERE, add_pack_option, envelope, write_json
from rich.console import Console
from rich.table import Table

from proxy.core.openai.request import parse_chat_request
from proxy.observability.metrics import Metrics
from proxy.service.compose import Parts, open_parts
from proxy.settings import load_settings

MT_BENCH = {
    "coding": "code",
    "writing": "doc_rewrite",
    "roleplay": "chitchat",
    "math": "general",
    "reasoning": "general",
    "stem": "general",
    "humanities": "general",
    "extraction": "general",
}
KVRET = {"weather": "realtime", "navigate": "general", "schedule": "general"}
HAND_WRITTEN = HERE / "data" / "intent_utterances.tsv"
NEVER_CACHED = frozenset({"realtime", "medical"})
QUICK_PER_SOURCE = 40
QUICK_TRACES = 400  # conversations of the development traces under --quick, every category kept


def from_data(data: Path, per_source: int) -> list[tuple[str, str, str]]:
    """(source, utterance, expected intent)"""
    out: list[tuple[str, str, str]] = []
    for line in (data / "crosswoz/val_turns.jsonl").read_text(encoding="utf-8").splitlines()[:per_source]:
        row = json.loads(line)
        first = next((m for m in row.get("turns", []) if m.get("role") == "usr"), None)
        if first:
            out.append(("crosswoz", first["content"], "travel"))
    dialogues = json.loads((data / "cqr_kvret/cqr_kvret_dev_public.json").read_text())
    for d in dialogues[:per_source]:
        out.append(("kvret", d["dialogue"][0]["data"]["utterance"], KVRET[d["scenario"]["task"]["intent"]]))
    for name in ("mt_bench", "mt_bench_zh"):
        for line in (data / name / "question.jsonl").read_text(encoding="utf-8").splitlines()[:per_source]:
            row = json.loads(line)
            out.append((name, row["turns"][0], MT_BENCH[row["category"]]))
    return out


def hand_written(path: Path) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            intent, lang, text = line.split("\t")
            out.append((f"hand-written/{lang}", text, intent))
    return out


def traces(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if limit is None or limit >= len(rows):
        return rows
    # every category keeps its share, and its first conversations (the file's own order)
    by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_category[row["category"]].append(row)
    return [r for rs in by_category.values() for r in rs[: max(1, len(rs) * limit // len(rows))]]


def scores(cases: Sequence[tuple[str, str, str]], guesses: Sequence[str]) -> dict[str, Any]:
    """Accuracy, each intent's precision and recall, and the most frequent confusions."""
    expected: Counter[str] = Counter(want for _, _, want in cases)
    predicted: Counter[str] = Counter(guesses)
    correct: Counter[str] = Counter(got for (_, _, want), got in zip(cases, guesses, strict=True) if got == want)
    confusions: Counter[tuple[str, str]] = Counter(
        (want, got) for (_, _, want), got in zip(cases, guesses, strict=True) if got != want
    )
    per_intent = {
        intent: {
            "labelled": expected[intent],
            "read_as": predicted[intent],
            "correct": correct[intent],
            "precision": round(correct[intent] / predicted[intent], 3) if predicted[intent] else None,
            "recall": round(correct[intent] / expected[intent], 3) if expected[intent] else None,
        }
        for intent in sorted(expected.keys() | predicted.keys())
    }
    by_source: dict[str, Counter[str]] = defaultdict(Counter)
    for (source, _, want), got in zip(cases, guesses, strict=True):
        by_source[source]["n"] += 1
        by_source[source]["ok"] += got == want
    return {
        "utterances": len(cases),
        "accuracy": round(sum(correct.values()) / len(cases), 3) if cases else None,
        "by_source": {s: {"n": c["n"], "accuracy": round(c["ok"] / c["n"], 3)} for s, c in sorted(by_source.items())},
        "per_intent": per_intent,
        "confusions": ", ".join(f"{a}→{b} {n}" for (a, b), n in confusions.most_common(10)),
    }


async def read_turns(parts: Parts, cases: Sequence[tuple[str, str, str]]) -> list[str]:
    texts = [parts.signer.normalize(t) for _, t, _ in cases]
    vectors = await parts.signer.vectors(texts)
    classifier = parts.policy_box.classifier
    return [classifier.classify(t, v).intent for t, v in zip(texts, vectors, strict=True)]


async def read_traces(parts: Parts, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every user turn signed with its conversation so far, as the proxy signs it."""
    per: dict[str, Counter[str]] = defaultdict(Counter)
    no_hit: Counter[str] = Counter()
    for row in rows:
        messages: list[dict[str, str]] = [{"role": "system", "content": row["system"]}]
        for turn in row["turns"]:
            messages.append({"role": "user", "content": turn["user"]})
            body = orjson.dumps({"model": "m", "messages": messages})
            intent = (await parts.signer.sign(parse_chat_request(body))).tags.intent
            per[row["category"]][intent] += 1
            if turn.get("expect") == "no_hit":
                no_hit["turns"] += 1
                no_hit["never_cached"] += intent in NEVER_CACHED
            messages.append({"role": "assistant", "content": turn.get("answer") or "OK."})
    categories: dict[str, Any] = {}
    for category, counts in sorted(per.items()):
        n = sum(counts.values())
        never = sum(counts[i] for i in NEVER_CACHED)
        categories[category] = {
            "turns": n,
            "never_cached": never,
            "never_cached_rate": round(never / n, 3),
            "read_as": ", ".join(f"{i} {c / n:.1%}" for i, c in counts.most_common(6)),
        }
    return {
        "conversations": len(rows),
        "no_hit_turns": no_hit["turns"],
        "no_hit_read_as_never_cached": no_hit["never_cached"],
        "categories": categories,
    }


async def measure(a: argparse.Namespace) -> dict[str, Any]:
    per_source = QUICK_PER_SOURCE if a.quick else a.per_source
    labelled = {"shared": from_data(a.data, per_source), "hand-written": hand_written(HAND_WRITTEN)}
    with tempfile.TemporaryDirectory() as tmp:
        s = load_settings(
            environ={},
            overrides={
                "data_dir": Path(tmp),
                "model_home": a.model_home,
                "upstream": "http://127.0.0.1:9/v1",
                "embedding_model": a.pack,
                # all the utterances go to the model in one call: offline, no deadline applies
                "embed_timeout_ms": 600_000.0,
            },
        )
        async with open_parts(s, upstream_url="http://127.0.0.1:9/v1", metrics=Metrics()) as parts:
            results: dict[str, Any] = {"pack": a.pack, "policy_version": parts.policy_box.policy.version}
            scored = {name: scores(cases, await read_turns(parts, cases)) for name, cases in labelled.items()}
            read = (
                await read_traces(parts, traces(a.traces, QUICK_TRACES if a.quick else None))
                if a.traces.is_file()
                else None
            )
    # laid out for docs/benchmarks.md: each set's intents as the rows of one table
    results["sets"] = {n: {k: r[k] for k in ("utterances", "accuracy", "confusions")} for n, r in scored.items()}
    results["by_source"] = {s: row for r in scored.values() for s, row in r["by_source"].items()}
    for name, r in scored.items():
        results[f"per_intent ({name})"] = r["per_intent"]
    if read is not None:
        results["dev_traces"] = {k: v for k, v in read.items() if k != "categories"}
        results["dev_traces by category"] = read["categories"]
    return results


def show(results: Mapping[str, Any]) -> None:
    console = Console(width=140)
    for name, r in results["sets"].items():
        table = Table(title=f"{name}: {r['utterances']} labelled utterances, accuracy {r['accuracy']}")
        for col in ("intent", "labelled", "read as", "correct", "precision", "recall"):
            table.add_column(col)
        for intent, row in results[f"per_intent ({name})"].items():
            cells = [row["labelled"], row["read_as"], row["correct"], row["precision"], row["recall"]]
            table.add_row(intent, *("-" if c is None else str(c) for c in cells))
        console.print(table)
        console.print(f"most frequent confusions (expected → got): {r['confusions']}")
    if "dev_traces" in results:
        d = results["dev_traces"]
        table = Table(title=f"development traces: {d['conversations']} conversations (no intent labels)")
        for col in ("category", "turns", "never-cached", "rate", "read as"):
            table.add_column(col, overflow="fold")
        for category, row in results["dev_traces by category"].items():
            cells = (row["turns"], row["never_cached"], row["never_cached_rate"], row["read_as"])
            table.add_row(category, *map(str, cells))
        console.print(table)
        console.print(f"expect no_hit: {d['no_hit_read_as_never_cached']} of {d['no_hit_turns']} read as never-cache")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data")
    ap.add_argument("--per-source", type=int, default=80)
    ap.add_argument("--traces", type=Path, default=HERE.parent.parent / "shared" / "eval" / "dev_traces.jsonl")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_PER_SOURCE} a source, {QUICK_TRACES} conversations")
    # where the packs are installed already (the default: installed into the run's own data dir)
    ap.add_argument("--model-home", type=Path, default=os.environ.get("SMARTCACHE_MODEL_HOME"))
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    add_pack_option(ap)
    args = ap.parse_args()
    measured = asyncio.run(measure(args))
    show(measured)
    if args.json:
        write_json(
            args.json, "bench_intent", envelope("bench_intent", ["benchmarks/bench_intent.py", *sys.argv[1:]], measured)
        )
