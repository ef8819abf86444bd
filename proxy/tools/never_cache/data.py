"""The labelled utterances the learned never-cache reader is trained on, and what is kept out.

Sources (every text read where it lies, never copied into the project):

- ``train_utterances.tsv`` beside this file: written for training only, in both languages;
- ../shared/data ``covid_qpairs`` (train): patients' questions about their own or their child's
  symptoms and medicines → medical (zh);
- ``oppo_xiaobu``, the closest to chat traffic: the queries no never-cache rule names → other,
  and those the precise rules name (weather, news, lottery results, rates, share prices,
  symptoms) → theirs; what the loose ones name is left out ("你现在有什么功能" names 现在 and asks
  nothing live, "猫怀孕不能吃什么" asks of a cat);
- ordinary questions → other: BQ, AFQMC and ATEC (bank and payment customers), QQP parts 1-3
  (those no rule names),
  MT-Bench-101 first turns, CamRest676 and CrossWOZ first user turns past the ones
  benchmarks/bench_never_cache.py measures.

Kept out: every text of benchmarks/data/never_cache_* (what the benchmark measures) and every
user turn of the replay harness's traces (``proxy.tools.verifier.heldout``).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from proxy.core.text.never_cache import never_cache_match
from proxy.tools.verifier.heldout import eval_rows
from proxy.tools.verifier.pairs import text_key

__all__ = ["LABELS", "Utterance", "benchmark_texts", "training_utterances"]

LABELS = ("other", "realtime", "medical")  # index order of the reader's classes
HERE = Path(__file__).resolve().parent
BENCH_DATA = HERE.parents[2] / "benchmarks" / "data"
# the benchmark's shared-data rows are the first --per-source rows of each set (100 at most in
# its documented runs); training starts past a margin above that
BENCH_ROWS = 200
_CJK = re.compile(r"[\u3400-\u9fff]")


@dataclass(frozen=True, slots=True)
class Utterance:
    text: str
    lang: str
    label: str
    source: str


def _lang(text: str) -> str:
    return "zh" if _CJK.search(text) else "en"


def _hand(path: Path) -> Iterator[Utterance]:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            label, lang, text = line.split("\t")
            yield Utterance(text, lang, label, "hand")


def _column_texts(path: Path, columns: Iterable[int] = (0, 1)) -> list[str]:
    texts: dict[str, None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = line.split("\t")
        for c in columns:
            if c < len(cells) and cells[c].strip():
                texts[cells[c].strip()] = None
    return list(texts)


# rules whose matches in chat traffic are mostly something else (see _ruled)
LOOSE_RULES = frozenset({"zh_present", "zh_diagnosis", "en_present", "en_diagnosis"})


def _ruled(texts: Iterable[str], source: str) -> Iterator[Utterance]:
    """Texts labelled by the never-cache rules: other where none fires, else the rule's intent;
    a text only a loose rule names is left out."""
    for text in texts:
        match = never_cache_match(text)
        if match is None:
            yield Utterance(text, _lang(text), "other", source)
        elif match.rule not in LOOSE_RULES:
            yield Utterance(text, _lang(text), match.intent, source)


def _qqp(data: Path) -> list[str]:
    texts: dict[str, None] = {}
    for part in ("part01", "part02", "part03"):
        path = data / "gptcache_similar_qqp" / f"similiar_qqp_full.{part}.jsonl"
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            texts[row["text_a"].strip()] = None
            texts[row["text_b"].strip()] = None
    return list(texts)


def _first_turns(data: Path) -> Iterator[Utterance]:
    for line in (data / "mt_bench_101" / "mtbench101.jsonl").read_text(encoding="utf-8").splitlines():
        history = json.loads(line).get("history") or []
        if history and history[0].get("user"):
            text = history[0]["user"].strip()
            yield Utterance(text, _lang(text), "other", "mt_bench_101")
    camrest = json.loads((data / "gecor_camrest676" / "CamRest676_annotated.json").read_text(encoding="utf-8"))
    for d in camrest[BENCH_ROWS:]:
        if d.get("dial"):
            yield Utterance(d["dial"][0]["usr"]["transcript"], "en", "other", "camrest676")
    lines = (data / "crosswoz" / "val_turns.jsonl").read_text(encoding="utf-8").splitlines()
    for line in lines[BENCH_ROWS:]:
        first = next((m for m in json.loads(line).get("turns", []) if m.get("role") == "usr"), None)
        if first:
            yield Utterance(first["content"], "zh", "other", "crosswoz")


def benchmark_texts() -> frozenset[str]:
    """Text keys of every utterance benchmarks/bench_never_cache.py reads from benchmarks/data."""
    keys: set[str] = set()
    for path in BENCH_DATA.glob("never_cache_*"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip() or line.startswith(("#", "[")):
                continue
            if path.suffix == ".tsv":
                keys.add(text_key(line.split("\t")[-1]))
            else:
                text = line.split(": ", 1)[-1].rsplit("\t", 1)[0]
                keys.add(text_key(text))
    return frozenset(keys)


def training_utterances(data: Path, *, seed: int, per_source: int = 3000) -> list[Utterance]:
    """Every labelled utterance the reader trains on: each shared-data source sampled to at most
    ``per_source`` (seeded), the hand-written ones whole; the kept-out texts dropped."""
    rng = random.Random(seed)
    kept_out = benchmark_texts() | eval_rows(data).texts

    def sampled(items: list[Utterance]) -> list[Utterance]:
        return rng.sample(items, min(per_source, len(items)))

    covid = _column_texts(data / "covid_qpairs" / "train.tsv")
    bank = [
        *_column_texts(data / "bq_corpus" / "train.tsv"),
        *_column_texts(data / "afqmc" / "train.tsv"),
        *_column_texts(data / "atec_part1" / "train.tsv"),
    ]
    oppo = list(_ruled(_column_texts(data / "oppo_xiaobu" / "train.tsv"), "oppo_xiaobu"))
    qqp = [u for u in _ruled(_qqp(data), "qqp") if u.label == "other"]
    pools: list[list[Utterance]] = [
        list(_hand(HERE / "train_utterances.tsv")),
        sampled([Utterance(t, "zh", "medical", "covid_qpairs") for t in covid]),
        [u for u in oppo if u.label != "other"],
        sampled([u for u in oppo if u.label == "other"]),
        sampled([Utterance(t, "zh", "other", "bank") for t in bank]),
        # English questions on every topic, sport, travel and money among them: the ordinary
        # questions the realtime class must not take for live ones
        rng.sample(qqp, min(3 * per_source, len(qqp))),
        list(_first_turns(data)),
    ]
    seen: set[str] = set()
    out: list[Utterance] = []
    for pool in pools:
        for u in pool:
            key = text_key(u.text)
            if key and key not in kept_out and key not in seen:
                seen.add(key)
                out.append(u)
    return out
