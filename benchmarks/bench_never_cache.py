"""Recall of the never-cache rules (proxy/text/never_cache.py) on labelled realtime / medical /
other utterances, English and Chinese.

Labelled set:
- benchmarks/data/never_cache_utterances.tsv: hand-written, realtime / medical / other in both
  languages; the "other" rows are ordinary questions on the same topics (prices, weather, health)
  that may stay cacheable.
- From ../shared/data, each data set's own annotation (read at run time, never copied here):
  CQR-KVRET dev first turns, `weather` → realtime, `navigate` / `schedule` → other;
  MT-Bench en + zh first turns (every category) → other; CamRest676 first user turns
  (restaurant search) → other; CrossWOZ val first user turns (trip planning) → other.

Only the rules are measured (no embedding model): they run before the exemplar classifier and
are what must not miss. ``--classifier`` adds the full intent path (rules, then the shipped
policy's keywords and exemplars) for comparison.

    .venv/bin/python benchmarks/bench_never_cache.py [--data ../shared/data] [--per-source 100] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from proxy.text.never_cache import never_cache_match

HERE = Path(__file__).resolve().parent
CLASSES = ("realtime", "medical", "other")
KVRET = {"weather": "realtime", "navigate": "other", "schedule": "other"}


@dataclass(frozen=True, slots=True)
class Case:
    source: str
    lang: str
    text: str
    label: str


def hand_written(path: Path) -> list[Case]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            label, lang, text = line.split("\t")
            out.append(Case("hand", lang, text, label))
    return out


def from_data(data: Path, per_source: int) -> list[Case]:
    out: list[Case] = []
    kvret = data / "cqr_kvret/cqr_kvret_dev_public.json"
    if kvret.is_file():
        counts: dict[str, int] = defaultdict(int)
        for d in json.loads(kvret.read_text(encoding="utf-8")):
            task = d["scenario"]["task"]["intent"]
            if counts[task] < per_source:
                counts[task] += 1
                out.append(Case(f"kvret:{task}", "en", d["dialogue"][0]["data"]["utterance"], KVRET[task]))
    for name, lang in (("mt_bench", "en"), ("mt_bench_zh", "zh")):
        path = data / name / "question.jsonl"
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines()[:per_source]:
                out.append(Case(name, lang, json.loads(line)["turns"][0], "other"))
    camrest = data / "gecor_camrest676/CamRest676_annotated.json"
    if camrest.is_file():
        for d in json.loads(camrest.read_text(encoding="utf-8"))[:per_source]:
            turns = d.get("dial") or []
            if turns:
                out.append(Case("camrest676", "en", turns[0]["usr"]["transcript"], "other"))
    crosswoz = data / "crosswoz/val_turns.jsonl"
    if crosswoz.is_file():
        for line in crosswoz.read_text(encoding="utf-8").splitlines()[:per_source]:
            first = next((m for m in json.loads(line).get("turns", []) if m.get("role") == "usr"), None)
            if first:
                out.append(Case("crosswoz", "zh", first["content"], "other"))
    return out


def predict(text: str) -> str:
    found = never_cache_match(text)
    return found.intent if found else "other"


def scores(pairs: list[tuple[str, str]]) -> dict[str, dict[str, float | int]]:
    """Per class precision / recall / support over (label, predicted) pairs."""
    out: dict[str, dict[str, float | int]] = {}
    for cls in CLASSES:
        tp = sum(1 for y, p in pairs if y == cls and p == cls)
        predicted = sum(1 for _, p in pairs if p == cls)
        support = sum(1 for y, _ in pairs if y == cls)
        out[cls] = {
            "precision": tp / predicted if predicted else float("nan"),
            "recall": tp / support if support else float("nan"),
            "support": support,
        }
    never = [(y != "other", p != "other") for y, p in pairs]
    support = sum(1 for y, _ in never if y)
    out["never_cache"] = {
        "precision": sum(1 for y, p in never if y and p) / max(1, sum(1 for _, p in never if p)),
        "recall": sum(1 for y, p in never if y and p) / support if support else float("nan"),
        "support": support,
    }
    return out


def report(cases: list[Case]) -> dict[str, object]:
    results: dict[str, object] = {}
    for lang in ("en", "zh", "all"):
        subset = [c for c in cases if lang in ("all", c.lang)]
        results[lang] = scores([(c.label, predict(c.text)) for c in subset])
    results["misses"] = [
        {"source": c.source, "label": c.label, "text": c.text}
        for c in cases
        if c.label != "other" and predict(c.text) == "other"
    ]
    results["false_alarms"] = [
        {"source": c.source, "predicted": predict(c.text), "text": c.text}
        for c in cases
        if c.label == "other" and predict(c.text) != "other"
    ]
    results["sources"] = dict(sorted(_count(c.source.split(":")[0] + "/" + c.label for c in cases).items()))
    return results


def _count(keys: object) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for k in keys:  # type: ignore[attr-defined]
        out[k] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data")
    ap.add_argument("--per-source", type=int, default=100)
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    args = ap.parse_args()
    cases = hand_written(HERE / "data" / "never_cache_utterances.tsv") + from_data(args.data, args.per_source)
    results = report(cases)
    table = Table(title=f"never-cache rules: {len(cases)} utterances")
    for col in ("lang", "class", "support", "precision", "recall"):
        table.add_column(col, justify="left" if col in ("lang", "class") else "right")
    for lang in ("en", "zh", "all"):
        per = results[lang]
        assert isinstance(per, dict)
        for cls in (*CLASSES, "never_cache"):
            row = per[cls]
            table.add_row(lang, cls, str(row["support"]), f"{row['precision']:.3f}", f"{row['recall']:.3f}")
    console = Console(width=200)
    console.print(table)
    console.print(f"sources: {results['sources']}")
    for key in ("misses", "false_alarms"):
        rows = results[key]
        assert isinstance(rows, list)
        console.print(f"{key}: {len(rows)}")
        for row in rows:
            console.print(f"  {row['source']}: {row['text'][:100]!r}", soft_wrap=True)
    if args.json:
        args.json.write_text(json.dumps(results, ensure_ascii=False, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
