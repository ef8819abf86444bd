"""Labelled pairs from the pair sets in ../shared/data (read in place, never copied).

Every set becomes ``LabeledPair`` rows with context-free sides. STS-B (graded 0-5) keeps only
its clear ends: 4 and above is a paraphrase, 2 and below is not; the middle is neither a hit nor
a sure miss and would blur the high-precision end.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from proxy.verify import PairSide

__all__ = ["ADDED_SETS", "PAIR_SETS", "LabeledPair", "load_pair_set", "text_key"]

# name -> path under the data dir; the QQP file is four parts concatenated in order
PAIR_SETS = {
    "lcqmc": "zh_pairs/lcqmc.valid.tsv",
    "bq": "zh_pairs/bq.valid.tsv",
    "atec": "zh_pairs/atec.valid.tsv",
    "pawsx": "pawsx_zh/PAWSX.valid.tsv",
    "stsb": "zh_pairs/stsb_zh.train.tsv",
    "stsb_valid": "zh_pairs/stsb_zh.valid.tsv",
    "qqp": "gptcache_similar_qqp/similiar_qqp_full.part0{0,1,2,3}.jsonl",
}
# Sets staged later (each folder's SOURCE.txt): split after PAIR_SETS and around them, so the
# test rows of the sets above, and the digests that pin them, do not move (splits.split_added).
ADDED_SETS = {
    "bq_train": ("bq_corpus/train.tsv",),
    "afqmc": ("afqmc/train.tsv", "afqmc/dev.tsv"),
    "atec_part1": ("atec_part1/train.tsv",),
    "oppo": ("oppo_xiaobu/train.tsv",),
    "covid": ("covid_qpairs/train.tsv", "covid_qpairs/dev.tsv"),
    "mrpc": ("mrpc/train.tsv",),
}
_NON_WORD = re.compile(r"[\W_]+")


@dataclass(frozen=True)
class LabeledPair:
    """A pair with its label; ``group`` is the split unit of mined pairs (dialogue ids), else ""."""

    source: str
    a: PairSide
    b: PairSide
    label: int
    group: str = ""


def text_key(text: str) -> str:
    """Identity of a text for splits and exclusions: NFKC, lower case, no spaces or punctuation."""
    return _NON_WORD.sub("", unicodedata.normalize("NFKC", text).lower())


def _tsv(path: Path) -> Iterator[tuple[str, str, str]]:
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0].strip() and parts[1].strip():
            yield parts[0], parts[1], parts[2].strip()


def _qqp(data: Path) -> Iterator[tuple[str, str, str]]:
    for part in range(4):
        path = data / f"gptcache_similar_qqp/similiar_qqp_full.part0{part}.jsonl"
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["text_a"].strip() and row["text_b"].strip():
                yield row["text_a"], row["text_b"], str(row["label"])


def _label(name: str, raw: str) -> int | None:
    if not name.startswith("stsb"):
        return 1 if raw == "1" else 0
    grade = float(raw)
    return 1 if grade >= 4 else 0 if grade <= 2 else None


def load_pair_set(name: str, data: Path) -> list[LabeledPair]:
    if name == "qqp":
        rows: Iterator[tuple[str, str, str]] = _qqp(data)
    elif name in ADDED_SETS:
        rows = (row for path in ADDED_SETS[name] for row in _tsv(data / path))
    else:
        rows = _tsv(data / PAIR_SETS[name])
    out = []
    for a, b, raw in rows:
        label = _label(name, raw)
        if label is not None:
            out.append(LabeledPair(name, PairSide(a.strip()), PairSide(b.strip()), label))
    return out
