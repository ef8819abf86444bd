"""Paraphrase-pair converters (QQP, PAWS-X): each pair asked in one conversation and across
conversations of one tenant.

Rows the shipped pair verifier was trained on are left out (here, and the dialogues it mined in
``dialogues``): calibrating its levels on pairs the model has learned would set them where only
memorised pairs score, and serve too much.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from proxy.tools.datasets.traces import (
    EN_SYSTEM,
    ZH_SYSTEM,
    Conversation,
    Draft,
    HeldOut,
    consistent,
    held_out,
    norm_text,
)
from proxy.tools.verifier.dataset import split_pair_sets
from proxy.tools.verifier.heldout import eval_rows
from proxy.tools.verifier.pairs import text_key
from proxy.tools.verifier.splits import split_of
from proxy.verify.cross_encoder import DEFAULT_WEIGHTS


def _split_seed(weights: Path) -> int:
    return int(json.loads((weights / "heldout.json").read_text(encoding="utf-8"))["seed"])


def verifier_trained_dialogue(weights: Path = DEFAULT_WEIGHTS) -> Callable[[str], bool]:
    """Is this dialogue (``kvret:12``, ``gecor:3``, ``crosswoz:5709``, ``mt_bench:81``: the units
    ``proxy.tools.verifier.mining`` splits by) one the verifier at ``weights`` mined training
    pairs from? Calibrating on them would fit its levels where memorised dialogues score."""
    seed = _split_seed(weights)
    return lambda unit: split_of(seed, unit) == "train"


def verifier_trained(data_dir: Path, weights: Path = DEFAULT_WEIGHTS) -> frozenset[str]:
    """Text keys of the pair-set rows the verifier at ``weights`` trained on (its ``heldout.json``
    split seed); its mined conversation pairs are no pair-set texts, so they are not read."""
    rows = split_pair_sets(data_dir, _split_seed(weights), eval_rows(data_dir))["train"]
    return frozenset(text_key(side.question) for p in rows for side in (p.a, p.b))


# --- paraphrase pairs -----------------------------------------------------------------------


def _pick_pairs(
    lines: Sequence[str],
    parse: Callable[[str], tuple[str, str, int] | None],
    need: Counter[int],
    rng: random.Random,
    held: HeldOut,
    trained: frozenset[str],
) -> dict[int, list[tuple[str, str]]]:
    """Rows in random order; each text used once, so one text never carries two keys."""
    got: dict[int, list[tuple[str, str]]] = {0: [], 1: []}
    used: set[str] = set(held.texts)
    order = list(range(len(lines)))
    rng.shuffle(order)
    for i in order:
        row = parse(lines[i])
        if row is None or len(got[row[2]]) >= need[row[2]]:
            continue
        a, b, label = row
        if norm_text(a) == norm_text(b) or norm_text(a) in used or norm_text(b) in used:
            continue
        if text_key(a) in trained or text_key(b) in trained:
            continue
        used.update((norm_text(a), norm_text(b)))
        got[label].append((a, b))
        if all(len(got[k]) >= need[k] for k in (0, 1)):
            break
    return got


def _pair_convs(
    lines: Sequence[str],
    parse: Callable[[str], tuple[str, str, int] | None],
    src: str,
    system: str,
    rng: random.Random,
    limit: int,
    held: HeldOut,
    trained: frozenset[str],
) -> list[Conversation]:
    """(a) a then b in one conversation, (b) a and b in two sessions of one tenant; labels alternate."""
    within = limit // 3
    slots = [("session", i % 2) for i in range(within)] + [("tenant", i % 2) for i in range((limit - within) // 2)]
    rng.shuffle(slots)
    rows = _pick_pairs(lines, parse, Counter(label for _, label in slots), rng, held, trained)
    out: list[Conversation] = []
    tenant = f"cal-{src}"
    for n, (framing, label) in enumerate(slots):
        if not rows[label]:
            continue
        a, b = rows[label].pop()
        first = Draft(system)
        ka = first.ask(a)
        if framing == "session":
            first.ask(b, key=ka if label else None)
            out.append(first.done(f"{src}-{n}", f"{src}_session", tenant))
        else:
            second = Draft(system)
            second.ask(b, key=ka if label else None)
            out += [
                first.done(f"{src}-{n}-a", f"{src}_tenant", tenant),
                second.done(f"{src}-{n}-b", f"{src}_tenant", tenant),
            ]
    return consistent(out)


def _parse_qqp(line: str) -> tuple[str, str, int] | None:
    r = json.loads(line)
    a, b, label = r.get("text_a"), r.get("text_b"), r.get("label")
    return (a.strip(), b.strip(), int(label)) if a and b and str(label) in ("0", "1") else None


def _parse_pawsx(line: str) -> tuple[str, str, int] | None:
    cols = line.split("\t")
    ok = len(cols) == 3 and cols[0].strip() and cols[1].strip() and cols[2].strip() in ("0", "1")
    return (cols[0].strip(), cols[1].strip(), int(cols[2])) if ok else None


def qqp_pairs(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """Quora pairs from part01..03 (the dev traces sample part00)."""
    files = sorted((data_dir / "gptcache_similar_qqp").glob("similiar_qqp_full.part0[1-9].jsonl"))
    lines = [ln for f in files for ln in f.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return _pair_convs(lines, _parse_qqp, "qqp", EN_SYSTEM, rng, limit, held_out(data_dir), verifier_trained(data_dir))


def pawsx_pairs(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """PAWS-X zh valid pairs: adversarial negatives with near-identical wording."""
    lines = (data_dir / "pawsx_zh" / "PAWSX.valid.tsv").read_text(encoding="utf-8").splitlines()
    return _pair_convs(
        lines, _parse_pawsx, "pawsx", ZH_SYSTEM, rng, limit, held_out(data_dir), verifier_trained(data_dir)
    )


# Chat-like Chinese sets whose calibration split (never trained on: Platt scaling reads it) gives
# the verifier's levels Chinese questions to be fitted on; their test splits stay for measuring.
ZH_CALIB_SOURCES = ("oppo", "lcqmc", "afqmc", "atec_part1", "bq_train")


def zh_calib_pairs(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """Chinese pairs of the verifier's calibration split (``ZH_CALIB_SOURCES``), asked as
    ``_pair_convs`` asks them."""
    rows = split_pair_sets(data_dir, _split_seed(DEFAULT_WEIGHTS), eval_rows(data_dir))["calib"]
    lines = [f"{p.a.question}\t{p.b.question}\t{p.label}" for p in rows if p.source in ZH_CALIB_SOURCES]
    return _pair_convs(lines, _parse_pawsx, "zh_calib", ZH_SYSTEM, rng, limit, held_out(data_dir), frozenset())
