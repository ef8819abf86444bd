"""Calibration from shadow-replay rows: per intent, the lowest accept threshold (a cosine) and,
for intents that verify, the lowest verifier probability whose false-hit rate stays under a
target with an upper confidence bound; and a policy file, under a version of its own, that
records the data behind each number (never by taste)."""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from proxy.model import Reason
from proxy.tools.replay import Row

Z95 = 1.6449  # one-sided 95 %
MARGIN = 0.005  # above the highest-scoring false candidate: the boundary itself is not trusted
CANDIDATE_BAND = 0.05
# Verifier probabilities are calibrated: below one half the verifier says "another request".
VERIFY_FLOOR = 0.5
_CALIBRATED = "+cal."  # joins a template's version to the digest of what a calibration chose
VERIFY_SETTINGS = ("verify_accept", "verify_previous")  # the policy keys verifier levels go to


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
        return 1.0 - float(0.05 ** (1.0 / n))
    p = false / n
    centre = p + Z95 * Z95 / (2 * n)
    spread = Z95 * math.sqrt(p * (1 - p) / n + Z95 * Z95 / (4 * n * n))
    return min(1.0, (centre + spread) / (1 + Z95 * Z95 / n))


def _scored(r: Row) -> bool:
    """A candidate that passed the nets and was judged by its score. Restatements are served by
    rule or by the verifier's reading of the previous turn, not by score, so they take no part in
    choosing thresholds."""
    return r.nets_ok and r.score is not None and r.reason not in (Reason.RESTATEMENT, Reason.VERIFIED_PREVIOUS)


def _is_false(r: Row) -> bool:
    return r.expect_no_hit or not r.candidate_key_ok


def _score(r: Row) -> float:
    return r.score or 0.0


def _probability(r: Row) -> float:
    return r.verified or 0.0


def _threshold(
    scored: Sequence[Row], target: float, floor: float, key: Callable[[Row], float] = _score
) -> tuple[float, str]:
    """Lowest threshold on ``key`` whose bound meets the target; else just above the worst false
    candidate."""
    ordered = sorted(scored, key=lambda r: -key(r))
    best, false = None, 0
    for n, r in enumerate(ordered, start=1):
        false += _is_false(r)
        if upper_bound(false, n) <= target:
            best = key(r)
    worst_false = max((key(r) for r in scored if _is_false(r)), default=floor - MARGIN)
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
class VerifyCalibration:
    intent: str
    level: float
    samples: int  # requests whose best candidate passed the nets and was verified
    hits: int  # of those, at or above verify_accept
    false_hits: int
    fhr_upper: float  # one-sided 95 % upper bound of the false-hit rate at verify_accept
    note: str
    setting: str = "verify_accept"  # the policy key the level is written to


def _verified(r: Row) -> bool:
    """A candidate that passed the nets and went through the verifier (shadow replay verifies
    every intent that sets verify_accept; exact repeats skip it)."""
    return r.nets_ok and r.verified is not None and r.reason != Reason.VERIFIED_PREVIOUS


def _asked_again(r: Row) -> bool:
    """The session's previous turn, judged by the verifier (intents that set verify_previous),
    that passed every later net."""
    return r.nets_ok and r.verified is not None and r.reason == Reason.VERIFIED_PREVIOUS


def calibrate_verifier(
    rows: Sequence[Row],
    *,
    target: float = 1e-3,
    floor: float = VERIFY_FLOOR,
    min_samples: int = 30,
    setting: str = "verify_accept",
) -> dict[str, VerifyCalibration]:
    """Per intent that was verified, the lowest verifier probability whose false-hit rate meets the
    target with 95 % confidence; intents with fewer than ``min_samples`` take no lower than the
    level fitted on all of them together. ``setting`` says which verdicts: the best candidate's
    (``verify_accept``) or the session's previous turn's (``verify_previous``)."""
    verdict_of = _asked_again if setting == "verify_previous" else _verified
    judged = [r for r in rows if verdict_of(r)]
    if not judged:
        return {}
    pooled, _ = _threshold(judged, target, floor, _probability)
    by_intent: dict[str, list[Row]] = defaultdict(list)
    for r in judged:
        by_intent[r.intent].append(r)
    out = {}
    for intent, irows in sorted(by_intent.items()):
        level, note = _threshold(irows, target, floor, _probability)
        if len(irows) < min_samples:
            level, note = max(level, pooled), f"only {len(irows)} samples: no lower than the pooled level"
        hits = [r for r in irows if _probability(r) >= level]
        false = sum(_is_false(r) for r in hits)
        out[intent] = VerifyCalibration(intent, level, len(irows), len(hits), false,
                                        round(upper_bound(false, len(hits)), 5), note, setting)  # fmt: skip
    return out


def describe_verified(verified: Mapping[str, VerifyCalibration]) -> list[str]:
    """One line per verified intent, for the calibrate command."""
    return [f"{v.setting} {v.intent}: {v.level} ({v.samples} verified, {v.hits} hits, {v.false_hits} false, "
            f"FHR upper bound {v.fhr_upper:.4f}; {v.note})" for v in verified.values()]  # fmt: skip


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
        verified = calibrate_verifier(train, target=target, min_samples=min_samples)
        previous = calibrate_verifier(train, target=target, min_samples=min_samples, setting="verify_previous")
        unseen = max((c.accept for c in chosen.values()), default=0.999)  # an intent absent from training
        reusable += sum(r.session_reusable and not r.expect_no_hit for r in test)
        for r in test:
            if _served(r, chosen.get(r.intent), verified.get(r.intent), unseen, previous.get(r.intent)):
                bad = _is_false(r)
                hits, false = hits + 1, false + bad
                per[r.intent][0] += 1
                per[r.intent][1] += bad
    return HeldOut(folds, hits, false, reusable, {k: (v[0], v[1]) for k, v in sorted(per.items())})


def _served(
    r: Row,
    cal: Calibration | None,
    verified: VerifyCalibration | None,
    unseen: float,
    previous: VerifyCalibration | None = None,
) -> bool:
    """Would the fitted levels serve this shadow row? A verified intent is judged by the verifier's
    probability instead of the accept zone, restatements included; its exact repeats skip it. The
    previous turn judged by the verifier is served at its own level, and only there (shadow
    replay did not record what the request would have met below it)."""
    if not r.nets_ok or r.score is None:
        return False
    if r.reason == Reason.VERIFIED_PREVIOUS:
        return previous is not None and r.verified is not None and r.verified >= previous.level
    if verified is not None and r.verified is not None:
        return r.verified >= verified.level
    return r.reason == Reason.RESTATEMENT or r.score >= (cal.accept if cal else unseen)


def calibrated_version(template: str, chosen: Mapping[str, Any]) -> str:
    """A version of its own for every calibration that chose other numbers: records are stamped
    with the policy version, so thresholds from another calibration never serve them. Recalibrating
    a calibrated file replaces its digest instead of stacking another."""
    stem = template.split(_CALIBRATED, 1)[0]
    digest = hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:10]
    return f"{stem}{_CALIBRATED}{digest}"


def write_policy(
    source: Path,
    out: Path,
    results: Mapping[str, Calibration],
    *,
    traces: Sequence[str],
    target: float,
    embedding_model: str | None = None,
    verified: Mapping[str, VerifyCalibration] | None = None,
    previous: Mapping[str, VerifyCalibration] | None = None,
) -> str:
    """The input policy with calibrated thresholds (and verifier levels, for the intents that
    verify), each intent commented with its data, stamped with the embedding model whose scores
    they were measured on, under a new version. Returns that version."""
    data: dict[str, Any] = yaml.safe_load(source.read_text(encoding="utf-8"))
    intents: dict[str, Any] = {}
    comments: dict[str, list[str]] = {}
    for name, body in (data.get("intents") or {}).items():
        cached = (body or {}).get("cache", data["defaults"].get("cache", True)) is not False
        levels = [v for v in ((verified or {}).get(name), (previous or {}).get(name)) if v is not None]
        intents[name], comments[name] = _calibrated_intent(
            name, dict(body or {}), results.get(name) if cached else None, levels if cached else [], cached=cached
        )
    model = embedding_model or data.get("embedding_model")
    rest = {k: v for k, v in data.items() if k not in ("version", "embedding_model", "intents")}
    if isinstance(rest.get("defaults"), dict):
        # a template's verifier levels only ask shadow replay to verify: what serves is what was fitted
        rest["defaults"] = {k: v for k, v in rest["defaults"].items() if k not in VERIFY_SETTINGS}
    content = {**({"embedding_model": model} if model else {}), **rest, "intents": intents}
    version = calibrated_version(str(data.get("version", "")), content)
    header = [
        f"# Calibrated by `smartcache calibrate --target-false-hit {target:g}` on:",
        *[f"#   {t}" for t in traces],
        "# Per intent: samples = requests whose best candidate passed the nets.",
        "",
    ]
    top = {"version": version, **{k: v for k, v in content.items() if k != "intents"}}
    blocks = []
    for name, body in intents.items():
        dumped = yaml.safe_dump({name: body}, allow_unicode=True, sort_keys=False, width=110)
        blocks.append("\n".join(comments[name] + ["  " + ln if ln else ln for ln in dumped.splitlines()]))
    text = "\n".join(header) + yaml.safe_dump(top, allow_unicode=True, sort_keys=False, width=110)
    out.write_text(text + "intents:\n" + "\n\n".join(blocks) + "\n", encoding="utf-8")
    return version


def _calibrated_intent(
    name: str, body: dict[str, Any], cal: Calibration | None, levels: Sequence[VerifyCalibration], *, cached: bool
) -> tuple[dict[str, Any], list[str]]:
    """An intent's body with what calibration chose, and the comment lines that say on what data.
    A verifier level calibration did not fit is dropped: the template's number was never measured."""
    lines = []
    for setting in VERIFY_SETTINGS:
        body.pop(setting, None)
    if cal is not None:
        body["accept"], body["candidate"] = cal.accept, cal.candidate
        lines.append(
            f"  # {name}: {cal.samples} samples; at accept {cal.accept}: {cal.hits} hits, "
            f"{cal.false_hits} false, FHR upper bound {cal.fhr_upper:.4f}, recall {cal.recall:.3f}"
        )
        lines.append(f"  # {cal.note}")
    elif cached:
        lines.append(f"  # {name}: no data in these traces; thresholds left as they were")
    for v in levels:
        body[v.setting] = v.level
        lines.append(
            f"  # {name}: {v.samples} verified; at {v.setting} {v.level}: {v.hits} "
            f"hits, {v.false_hits} false, FHR upper bound {v.fhr_upper:.4f}; {v.note}"
        )
    return body, lines
