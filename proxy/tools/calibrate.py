"""Calibration from shadow-replay rows: per intent, the lowest accept threshold (a cosine) and,
for intents that verify, the lowest verifier probability whose false-hit rate stays under a
target with an upper confidence bound; and a policy file, under a version of its own, that
records the data behind each number (never by taste). An accept threshold the data cannot show
safe is not written: the template's stays, and the output says so."""

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

from proxy.core.model import Reason
from proxy.core.policy import Policy
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
    accept: float  # what the policy serves at: the fitted threshold, or the template's when none fits
    candidate: float
    samples: int  # requests that had a candidate passing the nets
    hits: int  # of those, at or above accept
    false_hits: int
    fhr_upper: float  # one-sided 95 % upper bound of the false-hit rate at accept
    reusable: int
    recall: float
    note: str
    fitted: bool = True  # False: the data cannot show the target; accept and candidate are the template's


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


def samples_needed(target: float) -> int:
    """The fewest accepted candidates, all of them right, whose bound meets ``target``: below
    this no threshold can be shown safe (about 3000 for a target of 1e-3)."""
    return max(1, math.ceil(math.log(0.05) / math.log1p(-target))) if 0 < target < 1 else 1


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


def _down4(x: float) -> float:
    """``x`` rounded down to the 4 decimals a policy file holds, so a threshold written there
    admits every candidate it was fitted on and no other."""
    return math.floor(x * 10_000 + 1e-9) / 10_000


def _fit(scored: Sequence[Row], target: float, floor: float, key: Callable[[Row], float] = _score) -> float | None:
    """The lowest threshold on ``key`` (at or above ``floor``) at which the one-sided 95 % upper
    bound of the false-hit rate among the candidates it admits is at most ``target``; None when
    no threshold shows that. Judged at each threshold a policy file can hold, ties included."""
    ordered = sorted(scored, key=key, reverse=True)
    best, false = None, 0
    for n, r in enumerate(ordered, start=1):
        false += _is_false(r)
        t = _down4(key(r))
        last_at_t = n == len(ordered) or _down4(key(ordered[n])) < t
        if last_at_t and t >= floor and upper_bound(false, n) <= target:
            best = t
    return best


def _kept(intent: str, template: Policy | None) -> tuple[float, float, str]:
    """The template's accept and candidate for an intent no threshold could be fitted for; with
    no template, near-duplicates only."""
    if template is None:
        return 0.999, round(0.999 - CANDIDATE_BAND, 4), "no template given: 0.999 (near-duplicates only)"
    own = template.for_intent(intent)
    return own.accept, own.candidate, f"kept the template's accept {own.accept:g}"


def calibrate(
    rows: Sequence[Row],
    *,
    template: Policy | None = None,
    target: float = 1e-3,
    floor: float = 0.80,
    min_samples: int = 30,
) -> dict[str, Calibration]:
    """Per intent, the lowest accept threshold whose false-hit rate meets ``target`` with 95 %
    confidence (an upper bound, never the point estimate): fitted on the intent's own candidates
    when it has ``min_samples``, else on every intent's together (and never below its own worst
    false candidate). Where the data cannot show the target (about 3000 clean candidates for
    1e-3), nothing is fitted: the template's thresholds stay, and the note says so."""
    by_intent: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_intent[r.intent].append(r)
    pooled = [r for r in rows if _scored(r)]
    pooled_t = _fit(pooled, target, floor)
    out = {}
    for intent, irows in sorted(by_intent.items()):
        scored = [r for r in irows if _scored(r)]
        fitted, note = _fit_intent(scored, len(pooled), pooled_t, target=target, floor=floor, min_samples=min_samples)
        if fitted is not None:
            accept, candidate = fitted, round(max(0.0, fitted - CANDIDATE_BAND), 4)
        else:
            accept, candidate, kept = _kept(intent, template)
            note = f"{kept}: {note}"
        hits = [r for r in scored if _score(r) >= accept]
        false = sum(_is_false(r) for r in hits)
        if fitted is None and false:
            note += f"; {false} false candidates score at or above it"
        reusable = sum(r.session_reusable and not r.expect_no_hit for r in irows)
        fhr = round(upper_bound(false, len(hits)), 5)
        recall = round((len(hits) - false) / reusable, 4) if reusable else 0.0
        out[intent] = Calibration(
            intent, accept, candidate, len(scored), len(hits), false, fhr, reusable, recall, note, fitted is not None
        )
    return out


def _fit_intent(
    scored: Sequence[Row],
    pooled: int,
    pooled_t: float | None,
    *,
    target: float,
    floor: float,
    min_samples: int,
    key: Callable[[Row], float] = _score,
    unit: str = "samples",
    what: str = "threshold",
) -> tuple[float | None, str]:
    """An intent's fitted threshold on ``key`` (None: none meets the target) and what it rests on:
    its own rows from ``min_samples``, else the pooled threshold, never below its own worst false
    row. ``unit`` and ``what`` name the rows and the threshold in the note."""
    if len(scored) >= min_samples:
        fitted, data = _fit(scored, target, floor, key), f"its {len(scored)} {unit}"
        if fitted is not None:
            return fitted, f"meets target on its own {len(scored)} {unit}"
    else:
        worst = max((key(r) + MARGIN for r in scored if _is_false(r)), default=0.0)
        if pooled_t is not None:
            return round(min(0.999, max(pooled_t, worst)), 4), (
                f"only {len(scored)} {unit}: the {what} fitted on all {pooled} together"
            )
        data = f"only {len(scored)} {unit}, and all {pooled} together,"
    return None, (
        f"{data} cannot show a false-hit rate under {target:g} with 95 % confidence "
        f"(that needs at least {samples_needed(target)} accepted candidates, all right)"
    )


def describe_kept(results: Mapping[str, Calibration]) -> str | None:
    """The warning the calibrate command prints when some intents could not be fitted."""
    kept = [c.intent for c in results.values() if not c.fitted]
    if not kept:
        return None
    return (
        f"warning: too few samples for the false-hit target in {len(kept)} of {len(results)} intents "
        f"({', '.join(kept)}): their thresholds stay as the template has them"
    )


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
    fitted: bool = True  # False: the data cannot show the target; no level is written


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
    target with 95 % confidence (an upper bound, as for ``calibrate``): on the intent's own
    verdicts when it has ``min_samples``, else on every intent's together (one calibrated scale:
    the probability means the same whatever the intent), and never below the intent's own worst
    false candidate. An intent the data cannot show safe gets no level (``fitted`` False): it is
    not written, so that intent does not serve by the verifier. ``setting`` says which verdicts:
    the best candidate's (``verify_accept``) or the session's previous turn's (``verify_previous``)."""
    verdict_of = _asked_again if setting == "verify_previous" else _verified
    judged = [r for r in rows if verdict_of(r)]
    if not judged:
        return {}
    pooled = _fit(judged, target, floor, _probability)
    by_intent: dict[str, list[Row]] = defaultdict(list)
    for r in judged:
        by_intent[r.intent].append(r)
    out = {}
    for intent, irows in sorted(by_intent.items()):
        fitted, note = _fit_intent(irows, len(judged), pooled, target=target, floor=floor, min_samples=min_samples,
                                   key=_probability, unit="verdicts", what="level")  # fmt: skip
        level = 1.0 if fitted is None else fitted
        if fitted is None:
            note += ": not written"
        hits = [r for r in irows if _probability(r) >= level]
        false = sum(_is_false(r) for r in hits)
        out[intent] = VerifyCalibration(intent, level, len(irows), len(hits), false,
                                        round(upper_bound(false, len(hits)), 5), note, setting,
                                        fitted is not None)  # fmt: skip
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
    rows: Sequence[Row],
    *,
    template: Policy | None = None,
    folds: int = 2,
    target: float = 1e-3,
    floor: float = 0.80,
    min_samples: int = 30,
) -> HeldOut:
    """K-fold by conversation: calibrate on the other folds, serve this one. Thresholds set just above
    the worst false candidate look perfect on their own data; this shows whether they generalise."""
    hits = false = reusable = 0
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for k in range(folds):
        train = [r for r in rows if fold_of(r.conversation, folds) != k]
        test = [r for r in rows if fold_of(r.conversation, folds) == k]
        chosen = calibrate(train, template=template, target=target, floor=floor, min_samples=min_samples)
        verified = calibrate_verifier(train, target=target, min_samples=min_samples)
        previous = calibrate_verifier(train, target=target, min_samples=min_samples, setting="verify_previous")
        # an intent absent from training serves at the template's accept (else the strictest chosen)
        unseen = max((c.accept for c in chosen.values()), default=0.999)
        reusable += sum(r.session_reusable and not r.expect_no_hit for r in test)
        for r in test:
            cal = chosen.get(r.intent) or (_template_calibration(r.intent, template) if template else None)
            if _served(r, cal, verified.get(r.intent), unseen, previous.get(r.intent)):
                bad = _is_false(r)
                hits, false = hits + 1, false + bad
                per[r.intent][0] += 1
                per[r.intent][1] += bad
    return HeldOut(folds, hits, false, reusable, {k: (v[0], v[1]) for k, v in sorted(per.items())})


def _template_calibration(intent: str, template: Policy) -> Calibration:
    accept, candidate, note = _kept(intent, template)
    return Calibration(intent, accept, candidate, 0, 0, 0, 1.0, 0, 0.0, note, fitted=False)


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
    verify_target: float | None = None,
) -> str:
    """The input policy with calibrated thresholds (and verifier levels, for the intents that
    verify), each intent commented with its data, stamped with the embedding model whose scores
    they were measured on, under a new version. Returns that version."""
    data: dict[str, Any] = yaml.safe_load(source.read_text(encoding="utf-8"))
    intents: dict[str, Any] = {}
    comments: dict[str, list[str]] = {}
    for name, body in (data.get("intents") or {}).items():
        cached = (body or {}).get("cache", data["defaults"].get("cache", True)) is not False
        levels = [v for v in ((verified or {}).get(name), (previous or {}).get(name)) if v is not None and v.fitted]
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
    verify_flag = "" if verify_target in (None, target) else f" --verify-target {verify_target:g}"
    header = [
        f"# Calibrated by `smartcache calibrate --target-false-hit {target:g}{verify_flag}` on:",
        *[f"#   {t}" for t in traces],
        "# Per intent: samples = requests whose best candidate passed the nets. An intent whose",
        "# data cannot show the target keeps the template's thresholds (said at the intent).",
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
    candidate_floor = body.get("candidate")
    for setting in VERIFY_SETTINGS:
        body.pop(setting, None)
    if cal is not None and not cal.fitted:
        lines.append(f"  # {name}: {cal.samples} samples; thresholds left as they were")
        lines.append(f"  # {cal.note}")
    elif cal is not None:
        body["accept"], body["candidate"] = cal.accept, cal.candidate
        lines.append(
            f"  # {name}: {cal.samples} samples; at accept {cal.accept}: {cal.hits} hits, "
            f"{cal.false_hits} false, FHR upper bound {cal.fhr_upper:.4f}, recall {cal.recall:.3f}"
        )
        lines.append(f"  # {cal.note}")
    elif cached:
        lines.append(f"  # {name}: no data in these traces; thresholds left as they were")
    if any(v.setting == "verify_accept" for v in levels):
        # the verifier decides from the template's candidate floor up: a floor fitted for the accept
        # zone would hide from it the paraphrases that score low by cosine
        template_floor = candidate_floor
        if template_floor is None:
            body.pop("candidate", None)
        else:
            body["candidate"] = template_floor
    for v in levels:
        body[v.setting] = v.level
        lines.append(
            f"  # {name}: {v.samples} verified; at {v.setting} {v.level}: {v.hits} "
            f"hits, {v.false_hits} false, FHR upper bound {v.fhr_upper:.4f}; {v.note}"
        )
    return body, lines
