"""Intent classifier accuracy on utterances assembled from ../shared/data, per intent.

Labelled set (first user turns; the label comes from each data set's own annotation, mapped
onto the shipped policy's intents):
- CrossWOZ val: trip planning in Beijing (attractions, hotels, restaurants, metro) → travel
- CQR-KVRET dev: `weather` dialogues → realtime (current conditions); `navigate`/`schedule` →
  general (no shipped intent covers in-car assistants)
- MT-Bench en + zh: `coding` → code; `writing` → doc_rewrite; `roleplay` → chitchat; `math`,
  `reasoning`, `stem`, `humanities`, `extraction` → general

    .venv/bin/python benchmarks/bench_intent.py [--data ../shared/data] [--per-source 80]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from measurement import add_pack_option
from rich.console import Console
from rich.table import Table

from proxy.observability.metrics import Metrics
from proxy.service.compose import open_parts
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


def labelled(data: Path, per_source: int) -> list[tuple[str, str, str]]:
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


async def main(data: Path, per_source: int, model_home: Path | None, pack: str) -> None:
    cases = labelled(data, per_source)
    with tempfile.TemporaryDirectory() as tmp:
        s = load_settings(
            environ={},
            overrides={
                "data_dir": Path(tmp),
                "model_home": model_home,
                "upstream": "http://127.0.0.1:9/v1",
                "embedding_model": pack,
                # all the utterances go to the model in one call: offline, no deadline applies
                "embed_timeout_ms": 600_000.0,
            },
        )
        async with open_parts(s, upstream_url="http://127.0.0.1:9/v1", metrics=Metrics()) as parts:
            texts = [parts.signer.normalize(t) for _, t, _ in cases]
            vectors = await parts.signer.vectors(texts)
            guesses = [parts.policy_box.classifier.classify(t, v).intent for t, v in zip(texts, vectors, strict=True)]
    per: dict[str, Counter[str]] = defaultdict(Counter)
    confusions: Counter[tuple[str, str]] = Counter()
    for (source, _, want), got in zip(cases, guesses, strict=True):
        per[want]["n"] += 1
        per[want]["ok"] += got == want
        per[f"source:{source}"]["n"] += 1
        per[f"source:{source}"]["ok"] += got == want
        if got != want:
            confusions[(want, got)] += 1
    table = Table(title=f"intent classifier, {len(cases)} labelled utterances")
    for col in ("expected", "n", "correct", "accuracy"):
        table.add_column(col)
    for name in sorted(per):
        c = per[name]
        table.add_row(name, str(c["n"]), str(c["ok"]), f"{c['ok'] / c['n']:.3f}")
    total = sum(c["ok"] for k, c in per.items() if not k.startswith("source:"))
    table.add_row("ALL", str(len(cases)), str(total), f"{total / len(cases):.3f}", style="bold")
    console = Console()
    console.print(table)
    console.print(
        "most frequent confusions (expected → got):",
        ", ".join(f"{a}→{b} {n}" for (a, b), n in confusions.most_common(8)),
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ap.add_argument("--per-source", type=int, default=80)
    ap.add_argument("--model-home", type=Path)
    add_pack_option(ap)
    a = ap.parse_args()
    asyncio.run(main(a.data, a.per_source, a.model_home, a.pack))
