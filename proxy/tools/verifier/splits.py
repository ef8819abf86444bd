"""Deterministic train / calibration / test splits, held out by text, and the manifest of the rule.

Only the valid splits of LCQMC, BQ and ATEC exist here, so every pair set is split again. The
unit is a connected component of texts (two texts are connected when a pair joins them, over
all pair sets at once): a text never appears on both sides of a split, not even in another
set. A component's split is a pure function of the seed and its smallest text key (sha256),
so the same rows fall in the same split on any machine. Components that hold a text of the
replay harness's traces always go to ``test``: they are never trained on nor calibrated with.

Mined conversation pairs are split by dialogue instead (see ``mining``): their whole point is
the same words under another context, so the words alone cannot be the unit.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal

from proxy.tools.verifier.pairs import LabeledPair, text_key

__all__ = ["ADDED_RULE", "FRACTIONS", "RULE", "Split", "split_added", "split_of", "split_pairs", "unit_fraction"]

Split = Literal["train", "calib", "test"]
# cumulative upper bounds of [0, 1): test first, so a larger train share never moves test rows
FRACTIONS: tuple[tuple[Split, float], ...] = (("test", 0.2), ("calib", 0.3), ("train", 1.0))
RULE = (
    "pair sets: components of texts joined by pairs (keys: NFKC, lower case, no spaces or punctuation), "
    "over all pair sets together; split = first of test<0.2, calib<0.3, train<1.0 for "
    "u = int(sha256(f'{seed}|{smallest key of the component}').hexdigest()[:15], 16) / 16**15; "
    "components holding a replay-trace text go to test. Mined sets: the same u over "
    "f'{seed}|{source}|{dialogue id}', pairs mined only among dialogues of one split; "
    "dialogues used by the replay traces go to test."
)


# BQ's training pairs reuse texts so often that most of them form one component: drawn as one
# unit it would land whole in one split. Past this size rows are assigned one by one instead.
LARGE = 1000
ADDED_RULE = (
    "sets staged later (pairs.ADDED_SETS): components over those sets alone, by the same keys; a "
    "component sharing a text with the split above goes where that text went (test before calib "
    "before train), one holding a replay-trace text to test, any other by the same u; a component "
    f"of more than {LARGE} texts is no unit: its rows go to train, less those holding a text of "
    "the split above's calib or test or of the replay traces, which are left out"
)


def unit_fraction(seed: int, unit: str) -> float:
    digest = hashlib.sha256(f"{seed}|{unit}".encode()).hexdigest()
    return int(digest[:15], 16) / 16**15


def split_of(seed: int, unit: str) -> Split:
    u = unit_fraction(seed, unit)
    return next(name for name, bound in FRACTIONS if u < bound)


class _Components:
    """Union-find over text keys."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        root = self.parent.setdefault(key, key)
        while root != self.parent[root]:
            root = self.parent[root]
        while key != root:
            self.parent[key], key = root, self.parent[key]
        return root

    def join(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)  # the root is always the smallest key


def split_pairs(
    pairs: Sequence[LabeledPair], seed: int, held_out: Iterable[str] = ()
) -> dict[Split, list[LabeledPair]]:
    """Split context-free pairs by text component; ``held_out`` text keys force their component to test."""
    comps = _Components()
    for pair in pairs:
        comps.join(text_key(pair.a.question), text_key(pair.b.question))
    forced = {comps.find(k) for k in held_out if k in comps.parent}
    out: dict[Split, list[LabeledPair]] = {"train": [], "calib": [], "test": []}
    for pair in pairs:
        root = comps.find(text_key(pair.a.question))
        out["test" if root in forced else split_of(seed, root)].append(pair)
    return out


def split_added(
    pairs: Sequence[LabeledPair],
    seed: int,
    base: dict[Split, list[LabeledPair]],
    held_out: Iterable[str] = (),
) -> dict[Split, list[LabeledPair]]:
    """Split the later sets around ``base`` (already split) without moving any of its rows.

    Joining them into one union-find with the first sets would change components, and so the
    smallest key that draws a component's split: test rows measured before would move. A
    component of the new rows that shares a text with ``base`` follows that text instead, so a
    text still never sits on two sides of a split.
    """
    comps = _Components()
    for pair in pairs:
        comps.join(text_key(pair.a.question), text_key(pair.b.question))
    forced: dict[str, Split] = {}
    for split in ("train", "calib", "test"):  # later wins: test over calib over train
        for p in base[split]:
            for side in (p.a, p.b):
                key = text_key(side.question)
                if key in comps.parent:
                    forced[comps.find(key)] = split
    for key in held_out:
        if key in comps.parent:
            forced[comps.find(key)] = "test"
    size = Counter(comps.find(key) for key in list(comps.parent))
    kept_out = set(held_out) | {
        text_key(s.question) for split in ("calib", "test") for p in base[split] for s in (p.a, p.b)
    }
    out: dict[Split, list[LabeledPair]] = {"train": [], "calib": [], "test": []}
    for pair in pairs:
        keys = (text_key(pair.a.question), text_key(pair.b.question))
        root = comps.find(keys[0])
        if size[root] > LARGE:
            if not kept_out.intersection(keys):
                out["train"].append(pair)
            continue
        out[forced.get(root) or split_of(seed, root)].append(pair)
    return out
