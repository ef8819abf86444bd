"""The training, calibration and test rows of every set, with the held-out rules applied.

``build_splits`` is the one place that decides which rows a model may learn from; training and
the benchmark both call it, so the benchmark can only ever evaluate rows training never read.
``numbers_changed`` adds negatives where one number of a training text is changed ("一万" is
normalised by the cache, but 3 nights vs 4 nights is another request).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.tools.verifier.heldout import EVAL_SEED, EvalRows, eval_rows
from proxy.tools.verifier.mining import mine
from proxy.tools.verifier.pairs import ADDED_SETS, PAIR_SETS, LabeledPair, load_pair_set, text_key
from proxy.tools.verifier.splits import ADDED_RULE, FRACTIONS, RULE, Split, split_added, split_pairs
from proxy.verify import PairSide

__all__ = ["Splits", "asked_in_session", "build_splits", "manifest", "numbers_changed", "sample", "split_pair_sets"]

_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Splits:
    rows: dict[Split, list[LabeledPair]]
    held_out: EvalRows
    seed: int

    def of(self, split: Split, source: str) -> list[LabeledPair]:
        return [p for p in self.rows[split] if p.source == source]


def split_pair_sets(data: Path, seed: int, held_out: EvalRows) -> dict[Split, list[LabeledPair]]:
    """The context-free pair sets alone, split by text component (no mined conversation pairs)."""
    pairs = [p for name in PAIR_SETS for p in load_pair_set(name, data)]
    base = split_pairs(pairs, seed, held_out.texts)
    added = split_added([p for name in ADDED_SETS for p in load_pair_set(name, data)], seed, base, held_out.texts)
    return {split: base[split] + added[split] for split in base}


def build_splits(data: Path, seed: int, eval_dir: Path | None = None) -> Splits:
    held_out = eval_rows(data, eval_dir)
    rows = split_pair_sets(data, seed, held_out)
    for split, mined in mine(data, seed, held_out).items():
        rows[split] += mined
    return Splits(rows, held_out, seed)


def numbers_changed(pairs: Sequence[LabeledPair], rng: random.Random, limit: int) -> list[LabeledPair]:
    """(text, the same text with one number changed) negatives, from texts of ``pairs``."""
    texts = sorted({p.a.question for p in pairs if _NUMBER.search(p.a.question)})
    rng.shuffle(texts)
    out = []
    for text in texts[:limit]:
        match = rng.choice(list(_NUMBER.finditer(text)))
        value = int(match.group())
        other = str(value + rng.choice([1, 2, 5, 10]) if value < 1000 else value * 2)
        changed = text[: match.start()] + other + text[match.end() :]
        out.append(LabeledPair("numbers_changed", PairSide(text), PairSide(changed), 0))
    return out


def asked_in_session(pairs: Sequence[LabeledPair], rng: random.Random, limit: int) -> list[LabeledPair]:
    """Context-free pairs as one session asks them: the second question read with the first as its
    previous turn, against the first. A session's previous turn is the candidate the cache meets
    most; this keeps the pair's label, not the layout, deciding the verdict there."""
    bare = [p for p in pairs if not p.a.previous_question and not p.b.previous_question and p.group == ""]
    rng.shuffle(bare)
    return [
        LabeledPair("asked_in_session", PairSide(p.b.question, p.a.question), PairSide(p.a.question), p.label)
        for p in bare[:limit]
    ]


def sample(pairs: Sequence[LabeledPair], caps: dict[str, int], seed: int) -> list[LabeledPair]:
    """Per source at most ``caps[source]`` rows (a seeded shuffle), the rest kept whole."""
    by_source: dict[str, list[LabeledPair]] = {}
    for p in pairs:
        by_source.setdefault(p.source, []).append(p)
    out = []
    for source in sorted(by_source):
        rows = by_source[source]
        if source in caps and len(rows) > caps[source]:
            rows = random.Random(f"{seed}|{source}").sample(rows, caps[source])
        out += rows
    return out


def _digest(pairs: Sequence[LabeledPair]) -> str:
    keys = sorted(f"{text_key(p.a.question)}\x1f{text_key(p.b.question)}\x1f{p.group}" for p in pairs)
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


def manifest(splits: Splits, trained: Sequence[LabeledPair], calibrated: Sequence[LabeledPair]) -> dict[str, Any]:
    """The held-out split definition shipped next to the weights (``heldout.json``)."""
    sources = sorted({p.source for rows in splits.rows.values() for p in rows})
    return {
        "seed": splits.seed,
        "rule": RULE,
        "added_rule": ADDED_RULE,
        "fractions": dict(FRACTIONS),
        "eval_exclusion": f"build_dev_traces.py functions run with random.Random({EVAL_SEED}); "
        f"{len(splits.held_out.texts)} texts, {len(splits.held_out.dialogue_prefixes)} dialogues forced to test",
        "counts": {s: dict(Counter(p.source for p in splits.rows[s])) for s in ("train", "calib", "test")},
        "test_sha256": {src: _digest(splits.of("test", src)) for src in sources},
        "trained_rows": dict(Counter(p.source for p in trained)),
        "calibration_rows": dict(Counter(p.source for p in calibrated)),
    }
