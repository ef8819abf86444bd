"""Threshold calibration from shadow-replay rows: per intent, the lowest accept threshold whose
false-hit rate stays under a target, with an upper confidence bound, and a policy file that
records the data behind each number (seed §5.2: never by taste)."""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from proxy.decision.decide import RESTATEMENT
from proxy.tools.replay import Row

Z95 = 1.6449  # one-sided 95 %
MARGIN = 0.005  # above the highest-scoring false candidate: the boundary itself is not trusted
CANDIDATE_BAND = 0.05


@dataclass(frozen=True, slots=True)
class Calibration:
    intent: str
    accept: float
    candidate: float
    samples: int  # requests that had a candidate passing the nets
    hits: int  # of those, at or above accept
    false_hits: int
    fhr_upper: float  # one-sided 95 % upper bound of the false-hit rate at accept
    reusable: int
    recall: float
    note: str


def upper_bound(false: int, n: int) -> float:
    """Wilson upper bound; for zero failures the exact bound 1 - 0.05^(1/n) (the 'rule of three')."""
    if n == 0:
        return 1.0
    if false == 0:
        return 1.0 - 0.05 ** (1.0 / n)
    p = false / n
    centre = p + Z95 * Z95 / (2 * n)
    spread = Z95 * math.sqrt(p * (1 - p) / n + Z95 * Z95 / (4 * n * n))
    return min(1.0, (centre + spread) / (1 + Z95 * Z95 / n))


def _scored(r: Row) -> bool:
    """A candidate that passed the nets and was judged by its score. Restatements are served by
    rule, not by score, so they take no part in choosing thresholds."""
    return r.nets_ok and r.score is not None and r.reason != RESTATEMENT


def _is_false(r: Row) -> bool:
    return r.expect_no_hit or not r.candidate_key_ok


def _threshold(scored: Sequence[Row], target: float, floor: float) -> tuple[float, str]:
    """Lowest threshold whose bound meets the target; else just above the worst false candidate."""
    ordered = sorted(scored, key=lambda r: -(r.score or 0.0))
    best, false = None, 0
    for n, r in enumerate(ordered, start=1):
        false += _is_false(r)
        if upper_bound(false, n) <= target:
            best = r.score
    worst_false = max((r.score or 0.0 for r in scored if _is_false(r)), default=floor - MARGIN)
    safe = min(0.999, max(floor, worst_false + MARGIN))
    if best is not None and best >= safe:
        return round(best, 4), "meets target"
    return round(safe, 4), (
        f"too little data to show a false-hit rate under {target:g} with 95 % confidence: "
        "set just above the highest-scoring false candidate"
    )


def calibrate(
    rows: Sequence[Row], *, target: float = 1e-3, floor: float = 0.80, min_samples: int = 30
) -> dict[str, Calibration]:
    by_intent: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_intent[r.intent].append(r)
    pooled = [r for r in rows if _scored(r)]
    pooled_t, _ = _threshold(pooled, target, floor) if pooled else (0.99, "")
    out = {}
    for intent, irows in sorted(by_intent.items()):
        scored = [r for r in irows if _scored(r)]
        t, note = _threshold(scored, target, floor)
        if len(scored) < min_samples:
            t, note = max(t, pooled_t), f"only {len(scored)} samples: no lower than the pooled threshold"
        hits = [r for r in scored if (r.score or 0) >= t]
        false = sum(_is_false(r) for r in hits)
        reusable = sum(r.session_reusable and not r.expect_no_hit for r in irows)
        correct = len(hits) - false
        out[intent] = Calibration(
            intent,
            t,
            round(max(0.0, t - CANDIDATE_BAND), 4),
            len(scored),
            len(hits),
            false,
            round(upper_bound(false, len(hits)), 5),
            reusable,
            round(correct / reusable, 4) if reusable else 0.0,
            note,
        )
    return out


@dataclass(frozen=True, slots=True)
class HeldOut:
    """Hits the calibrated thresholds would serve on conversations calibration did not see."""

    folds: int
    hits: int
    false_hits: int
    reusable: int
    by_intent: Mapping[str, tuple[int, int]]  # intent -> (hits, false hits)

    @property
    def precision(self) -> float:
        return (self.hits - self.false_hits) / self.hits if self.hits else 1.0

    @property
    def recall(self) -> float:
        return (self.hits - self.false_hits) / self.reusable if self.reusable else 0.0


def fold_of(conversation: str, folds: int) -> int:
    # A stable hash, so a rerun splits the same way; whole conversations stay in one fold.
    return int(hashlib.sha1(conversation.encode()).hexdigest(), 16) % folds


def held_out(
    rows: Sequence[Row], *, folds: int = 2, target: float = 1e-3, floor: float = 0.80, min_samples: int = 30
) -> HeldOut:
    """K-fold by conversation: calibrate on the other folds, serve this one. Thresholds set just above
    the worst false candidate look perfect on their own data; this shows whether they generalise."""
    hits = false = reusable = 0
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for k in range(folds):
        train = [r for r in rows if fold_of(r.conversation, folds) != k]
        test = [r for r in rows if fold_of(r.conversation, folds) == k]
        chosen = calibrate(train, target=target, floor=floor, min_samples=min_samples)
        unseen = max((c.accept for c in chosen.values()), default=0.999)  # an intent absent from training
        reusable += sum(r.session_reusable and not r.expect_no_hit for r in test)
        for r in test:
            if not r.nets_ok or r.score is None:
                continue
            cal = chosen.get(r.intent)
            if r.reason == RESTATEMENT or r.score >= (cal.accept if cal else unseen):
                bad = _is_false(r)
                hits, false = hits + 1, false + bad
                per[r.intent][0] += 1
                per[r.intent][1] += bad
    return HeldOut(folds, hits, false, reusable, {k: (v[0], v[1]) for k, v in sorted(per.items())})


def write_policy(
    source: Path,
    out: Path,
    results: Mapping[str, Calibration],
    *,
    traces: Sequence[str],
    target: float,
    embedding_model: str | None = None,
) -> None:
    """The input policy with calibrated thresholds, each intent commented with its data, stamped
    with the embedding model whose scores they were measured on."""
    data: dict[str, Any] = yaml.safe_load(source.read_text(encoding="utf-8"))
    if embedding_model is not None:
        data = {
            "version": data.get("version"),
            "embedding_model": embedding_model,
            **{k: v for k, v in data.items() if k not in ("version", "embedding_model")},
        }
    header = [
        f"# Calibrated by `smartcache calibrate --target-false-hit {target:g}` on:",
        *[f"#   {t}" for t in traces],
        "# Per intent: samples = requests whose best candidate passed the nets.",
        "",
    ]
    blocks = []
    for name, body in data.get("intents", {}).items():
        cal = results.get(name)
        lines = []
        if cal is not None and body.get("cache", data["defaults"].get("cache", True)) is not False:
            body["accept"], body["candidate"] = cal.accept, cal.candidate
            lines.append(
                f"  # {name}: {cal.samples} samples; at accept {cal.accept}: {cal.hits} hits, "
                f"{cal.false_hits} false, FHR upper bound {cal.fhr_upper:.4f}, recall {cal.recall:.3f}"
            )
            lines.append(f"  # {cal.note}")
        elif body.get("cache") is not False:
            lines.append(f"  # {name}: no data in these traces; thresholds left as they were")
        dumped = yaml.safe_dump({name: body}, allow_unicode=True, sort_keys=False, width=110)
        blocks.append("\n".join(lines + ["  " + ln if ln else ln for ln in dumped.splitlines()]))
    rest = {k: v for k, v in data.items() if k != "intents"}
    text = "\n".join(header) + yaml.safe_dump(rest, allow_unicode=True, sort_keys=False, width=110)
    out.write_text(text + "intents:\n" + "\n\n".join(blocks) + "\n", encoding="utf-8")
