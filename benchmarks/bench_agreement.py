"""Answer agreement (proxy/core/text/agreement.py) on answers that really vary: the local engine
(llama.cpp, SmolLM2-135M) answers each question of benchmarks/data/agreement_questions.tsv
several times at temperature 0.7, and its near-miss (another number or another entity) as many
times; a pair of answers to one question should agree or be unsure, a question's answer against its
near-miss's should not agree. Per language: the false-agree rate on near-miss pairs with its
one-sided 95 % upper bound (the bound calibration uses, proxy.tools.calibrate.upper_bound), and
the agree, unsure and disagree rates of same-question pairs.

The replay harness's oracle tags its answers, so agreement there is exact and flatters the check;
only the engine's own answers are read here. A pair of identical answers is agreed on its text alone
and counted apart (``identical``): the rates with and without them say how much the model's
repeats carry.

    .venv/bin/python benchmarks/bench_agreement.py [--quick] [--questions N] [--samples K] \
        [--max-tokens T] [--json OUT] [--answers OUT.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from measurement import HERE, envelope, write_json
from rich.console import Console
from rich.table import Table

from proxy.core.text.agreement import AnswerReading, Verdict, compare, read_answer
from proxy.core.text.normalize import Segmenter
from proxy.tools.calibrate import upper_bound
from proxy.upstream.engine import LocalEngine

QUESTIONS = HERE / "data" / "agreement_questions.tsv"
LANGS = ("en", "zh")
QUICK_QUESTIONS = 10  # a language
SYSTEM = {"en": "Answer briefly, in English.", "zh": "请用中文简短回答。"}
VERDICTS = tuple(v.value for v in Verdict)
EXAMPLES = 4  # false agrees shown per language


@dataclass(frozen=True, slots=True)
class Item:
    lang: str
    changed: str  # what the near-miss changes: "number" or "entity"
    question: str
    near_miss: str


def load_items(path: Path, per_lang: int | None) -> list[Item]:
    items = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            lang, changed, question, near_miss = line.split("\t")
            items.append(Item(lang, changed, question, near_miss))
    if per_lang is None:
        return items
    # numbers and entities alike in a short run: alternate the two kinds within each language
    chosen: list[Item] = []
    for lang in LANGS:
        kinds = [[i for i in items if i.lang == lang and i.changed == c] for c in ("entity", "number")]
        mixed = [i for pair in itertools.zip_longest(*kinds) for i in pair if i is not None]
        chosen += mixed[:per_lang]
    return chosen


async def ask(client: httpx.AsyncClient, engine: LocalEngine, lang: str, question: str, seed: int, a: Any) -> str:
    body = {
        "model": engine.model_id,
        "messages": [{"role": "system", "content": SYSTEM[lang]}, {"role": "user", "content": question}],
        "temperature": a.temperature,
        "max_tokens": a.max_tokens,
        "seed": seed,
    }
    response = await client.post(f"{engine.base_url}/chat/completions", json=body)
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


async def sample(items: Sequence[Item], a: Any) -> dict[tuple[int, str], list[str]]:
    """Answers by (item, "question" | "near_miss"), ``a.samples`` of each at ``a.temperature``."""
    jobs = [(i, side, k) for i in range(len(items)) for side in ("question", "near_miss") for k in range(a.samples)]
    answers: dict[tuple[int, str], list[str]] = {(i, side): [] for i, side, _ in jobs}
    gate = asyncio.Semaphore(a.parallel)
    async with (
        LocalEngine(parallel=a.parallel, ctx_size=1024 * a.parallel) as engine,
        httpx.AsyncClient(timeout=300.0, trust_env=False) as client,
    ):

        async def one(i: int, side: str, k: int) -> None:
            item = items[i]
            async with gate:
                text = await ask(client, engine, item.lang, getattr(item, side), a.seed + 1000 * i + k, a)
            answers[(i, side)].append(text)

        await asyncio.gather(*(one(*job) for job in jobs))
    return answers


def rates(verdicts: Counter[str], identical: int) -> dict[str, Any]:
    n = sum(verdicts.values())
    row: dict[str, Any] = {"pairs": n, "identical": identical}
    for v in VERDICTS:
        row[v] = verdicts[v]
        row[f"{v}_rate"] = round(verdicts[v] / n, 4) if n else None
    other = n - identical
    row["agree_rate_not_identical"] = round((verdicts["agree"] - identical) / other, 4) if other else None
    return row


def measure_pairs(
    items: Sequence[Item],
    readings: Mapping[tuple[int, str], list[AnswerReading]],
    raw: Mapping[tuple[int, str], list[str]],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for lang in LANGS:
        same: Counter[str] = Counter()
        near: Counter[str] = Counter()
        by_change: dict[str, Counter[str]] = {"entity": Counter(), "number": Counter()}
        same_identical = near_identical = 0
        examples: list[dict[str, str]] = []
        for i, item in enumerate(items):
            if item.lang != lang:
                continue
            asked, missed = readings[(i, "question")], readings[(i, "near_miss")]
            for x, y in itertools.combinations(asked, 2):
                result = compare(x, y)
                same[result.verdict.value] += 1
                same_identical += result.same_text
            for (j, x), (k, y) in itertools.product(enumerate(asked), enumerate(missed)):
                result = compare(x, y)
                near[result.verdict.value] += 1
                by_change[item.changed][result.verdict.value] += 1
                near_identical += result.same_text
                if result.verdict is Verdict.AGREE and len(examples) < EXAMPLES:
                    examples.append(
                        {
                            "question": item.question,
                            "near_miss": item.near_miss,
                            "answer": raw[(i, "question")][j][:160],
                            "near_miss_answer": raw[(i, "near_miss")][k][:160],
                        }
                    )
        false_agree, n_near = near["agree"], sum(near.values())
        out[lang] = {
            "near_miss_pairs": {
                **rates(near, near_identical),
                "false_agree_rate": round(false_agree / n_near, 4) if n_near else None,
                "false_agree_upper95": round(upper_bound(false_agree, n_near), 4),
                "by_change": {c: dict(v) for c, v in by_change.items()},
            },
            "same_question_pairs": rates(same, same_identical),
            "false_agree_examples": examples,
        }
    return out


def write_answers(path: Path, items: Sequence[Item], raw: Mapping[tuple[int, str], list[str]]) -> None:
    """Every answer sampled, one JSON line an item, to read the verdicts against."""
    lines = [
        json.dumps({**asdict(item), "answers": raw[(i, "question")], "near_miss_answers": raw[(i, "near_miss")]},
                   ensure_ascii=False)
        for i, item in enumerate(items)
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


async def measure(a: argparse.Namespace) -> dict[str, Any]:
    items = load_items(a.questions, QUICK_QUESTIONS if a.quick and a.per_lang is None else a.per_lang)
    t0 = time.monotonic()
    raw = await sample(items, a)
    sampled_s = time.monotonic() - t0
    if a.answers is not None:
        write_answers(a.answers, items, raw)
    segmenter = Segmenter()
    t1 = time.monotonic()
    readings = {key: [read_answer(text, segmenter=segmenter) for text in texts] for key, texts in raw.items()}
    read_ms = (time.monotonic() - t1) * 1000 / max(1, sum(len(v) for v in raw.values()))
    return {
        "upstream": "llama.cpp engine (SmolLM2-135M), answers sampled, not tagged",
        "questions_per_language": {lang: sum(i.lang == lang for i in items) for lang in LANGS},
        "samples_per_question": a.samples,
        "temperature": a.temperature,
        "max_tokens": a.max_tokens,
        "seed": a.seed,
        "sampling_s": round(sampled_s, 1),
        "read_answer_ms": round(read_ms, 2),
        "languages": measure_pairs(items, readings, raw),
    }


def show(measured: Mapping[str, Any]) -> None:
    console = Console(width=160)
    table = Table(
        title=(
            f"answer agreement on engine answers ({measured['samples_per_question']} a question at "
            f"T={measured['temperature']}, {measured['max_tokens']} tokens at most)"
        )
    )
    for col in ("lang", "pairs", "n", "agree", "unsure", "disagree", "identical", "false-agree upper 95 %"):
        table.add_column(col, justify="right")
    for lang, row in measured["languages"].items():
        for name, key in (("same question", "same_question_pairs"), ("near-miss", "near_miss_pairs")):
            r = row[key]
            table.add_row(
                lang,
                name,
                str(r["pairs"]),
                f"{r['agree']} ({r['agree_rate']:.1%})" if r["pairs"] else "-",
                f"{r['unsure']} ({r['unsure_rate']:.1%})" if r["pairs"] else "-",
                f"{r['disagree']} ({r['disagree_rate']:.1%})" if r["pairs"] else "-",
                str(r["identical"]),
                f"{r['false_agree_upper95']:.1%}" if key == "near_miss_pairs" else "",
            )
    console.print(table)
    for lang, row in measured["languages"].items():
        for ex in row["false_agree_examples"]:
            console.print(f"  {lang} false agree: {ex}", highlight=False, markup=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=Path, default=QUESTIONS)
    ap.add_argument("--per-lang", type=int, help="questions a language (default: all; --quick: 10)")
    ap.add_argument("--samples", type=int, default=3, help="answers sampled for each question and near-miss")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=2, help="engine slots, and requests in flight")
    ap.add_argument("--seed", type=int, default=20261208)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_QUESTIONS} questions a language")
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    ap.add_argument("--answers", type=Path, help="write every sampled answer here (JSON lines)")
    args = ap.parse_args(argv)
    measured = asyncio.run(measure(args))
    show(measured)
    if args.json:
        argv_seen = ["benchmarks/bench_agreement.py", *(argv if argv is not None else sys.argv[1:])]
        write_json(args.json, "bench_agreement", envelope("bench_agreement", argv_seen, measured))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
