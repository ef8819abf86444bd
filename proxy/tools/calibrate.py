"""Calibration from shadow-replay rows: per intent, the lowest accept threshold (a cosine) and,
for intents that verify, the lowest verifier probability whose false-hit rate stays under a
target with an upper confidence bound, so that every number a policy serves at rests on data
(never on taste). An intent too thin to fit alone borrows the threshold fitted on all intents
together; one the data cannot show safe gets nothing fitted, and the note says so."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from proxy.core.learning import labels_needed
from proxy.core.model import Reason
from proxy.core.policy import Policy
from proxy.tools.replay import Row

Z95 = 1.6449  # one-sided 95 %
MARGIN = 0.005  # above the highest-scoring false candidate: the boundary itself is not trusted
CANDIDATE_BAND = 0.05
# Verifier probabilities are calibrated: below one half the verifier says "another request".
VERIFY_FLOOR = 0.5


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
    return labels_needed(target) if 0 < target < 1 else 1


def _scored(r: Row) -> bool:
    """A candidate that passed the nets and was judged by its score. Restatements are served by
    rule or by the verifier's reading of the previous turn, not by score, so they take no part in
    choosing thresholds."""
    return r.nets_ok and r.score is not None and r.reason not in (Reason.RESTATEMENT, Reason.VERIFIED_PREVIOUS)


def is_false(r: Row) -> bool:
    """A candidate that would be a false hit if served: the request expects none, or its key differs."""
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
        false += is_false(r)
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


def template_calibration(intent: str, template: Policy) -> Calibration:
    """What an intent serves at when calibration fitted nothing for it: the template's thresholds."""
    accept, candidate, note = _kept(intent, template)
    return Calibration(intent, accept, candidate, 0, 0, 0, 1.0, 0, 0.0, note, fitted=False)


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
        false = sum(is_false(r) for r in hits)
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
        worst = max((key(r) + MARGIN for r in scored if is_false(r)), default=0.0)
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


def _verdicts(rows: Sequence[Row], setting: str) -> list[Row]:
    """The verdicts a setting is fitted on: the previous turn's (``verify_previous``) or the best
    candidates' (``verify_accept``)."""
    verdict_of = _asked_again if setting == "verify_previous" else _verified
    return [r for r in rows if verdict_of(r)]


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
    judged = _verdicts(rows, setting)
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
        false = sum(is_false(r) for r in hits)
        out[intent] = VerifyCalibration(intent, level, len(irows), len(hits), false,
                                        round(upper_bound(false, len(hits)), 5), note, setting,
                                        fitted is not None)  # fmt: skip
    return out


def describe_verified(verified: Mapping[str, VerifyCalibration]) -> list[str]:
    """One line per verified intent, for the calibrate command."""
    return [f"{v.setting} {v.intent}: {v.level} ({v.samples} verified, {v.hits} hits, {v.false_hits} false, "
            f"FHR upper bound {v.fhr_upper:.4f}; {v.note})" for v in verified.values()]  # fmt: skip


# The levels the verifier's top end is read at (``verifier_curve``): where a policy would set
# verify_accept or verify_previous, and above, up to what the calibrated scale reaches.
CURVE_LEVELS = (0.5, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99)


@dataclass(frozen=True, slots=True)
class VerifierLevel:
    setting: str  # verify_accept (best candidates) or verify_previous (the session's previous turn)
    level: float
    served: int  # verdicts at or above the level, every intent together
    false_hits: int
    fhr_upper: float  # one-sided 95 % upper bound of the false-hit rate at the level
    false_by_category: tuple[tuple[str, int], ...]  # the traces' categories of the false ones, most first


def verifier_curve(
    rows: Sequence[Row], *, setting: str = "verify_accept", levels: Sequence[float] = CURVE_LEVELS
) -> list[VerifierLevel]:
    """What the verifier would serve at each level, every intent together: how clean its top end
    is on these traces, and where its false verdicts come from (a pair set with noisy labels, or
    a conversation). ``calibrate_verifier`` picks one level per intent; this shows why it could
    or could not. Exact repeats and word restatements are not verified, so they take no part."""
    judged = _verdicts(rows, setting)
    if not judged:
        return []
    out = []
    for level in levels:
        served = [r for r in judged if _probability(r) >= level]
        false = Counter(r.category for r in served if is_false(r))
        n_false = sum(false.values())
        out.append(VerifierLevel(setting, level, len(served), n_false, round(upper_bound(n_false, len(served)), 5),
                                 tuple(false.most_common())))  # fmt: skip
    return out
