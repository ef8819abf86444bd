"""Levels learned from the cache's own traffic: where the labels say the pair verifier's score alone
is right often enough, a request is served without asking the judge (docs/architecture.md,
"Learned levels"). Pure: labels in, a level with its bound out.

A label is one pair read against the truth as well as the proxy can know it: the judge's verdict,
the fresh answer of a forwarded request agreeing or not with the cached one
(``core/text/agreement.py``), or the user correcting a served answer. Labels are pooled per tenant
and intent, never across tenants, and no end user counts for more than ``per_user`` of them, so one
user cannot teach the cache what everyone else is served.

A level is the lowest score above which the wrong answers, with an upper confidence bound
(Clopper-Pearson, one-sided), stay under the intent's ``max_error``. The candidate levels are tried
from the top down and the search stops at the first that fails (fixed-sequence testing: the error
stays bounded without correcting for the number of levels tried). It starts at the highest level
with enough labels to pass at all, which depends on how many labels there are, never on what they
say, and never goes down into a band of scores no label fell in. An agreement is a weaker label
than a verdict: the agreement check itself agrees on a near-miss now and then
(``benchmarks/bench_agreement.py`` measures how often), so each right label resting on it counts
as that fraction of an error.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

__all__ = [
    "LEVELS",
    "Label",
    "Level",
    "Source",
    "fit_level",
    "labels_needed",
    "lower_bound",
    "sampled",
    "upper_bound",
]

# the scores a level may sit at, highest first
LEVELS: Final = (
    0.995,
    0.99,
    0.98,
    0.97,
    0.96,
    0.95,
    0.94,
    0.93,
    0.92,
    0.9,
    0.88,
    0.85,
    0.8,
    0.75,
    0.7,
    0.65,
    0.6,
    0.55,
    0.5,
)
CONFIDENCE: Final = 0.95
# The share of near-miss answer pairs the agreement check agrees on all the same: the upper bound
# of bench_agreement's worse language (Chinese). A right label resting on an agreement alone is that
# much of an error.
AGREEMENT_DOUBT: Final = 0.022


class Source(StrEnum):
    JUDGE = "judge"  # the judge's yes or no
    AGREEMENT = "agreement"  # the forwarded answer agreed or disagreed with the cached one
    FEEDBACK = "feedback"  # the user regenerated or corrected a served answer
    TRACE = "trace"  # a labelled trace's answer keys, read offline (``smartcache calibrate``)


@dataclass(frozen=True, slots=True)
class Label:
    """One pair labelled: the request's ``intent``, the verifier's ``score`` for the pair, whether
    the cached answer was ``right`` for it, what says so, who asked (``user``: the end user's id or
    session, hashed upstream of here), the record and when."""

    intent: str
    score: float
    right: bool
    source: Source
    user: str
    cache_id: str
    at: float


@dataclass(frozen=True, slots=True)
class Level:
    """A score level in force: requests whose best candidate scores at least ``score`` are served
    without asking; over the ``n`` labels there, ``errors`` (weighted) were wrong and the wrong
    answers' rate is at most ``bound`` at the stated confidence."""

    score: float
    n: int
    errors: float
    bound: float


def labels_needed(max_error: float, confidence: float = CONFIDENCE) -> int:
    """The fewest labels that can bound the error under ``max_error``: all of them right."""
    return math.ceil(math.log(1 - confidence) / math.log1p(-max_error))


def upper_bound(errors: float, n: int, confidence: float = CONFIDENCE) -> float:
    """The one-sided Clopper-Pearson upper bound of an error rate from ``errors`` (which may be
    fractional) in ``n``: the rate p at which seeing at most ``errors`` has probability
    ``1 - confidence``, i.e. the ``confidence`` quantile of Beta(errors + 1, n - errors)."""
    if n <= 0:
        return 1.0
    errors = min(max(errors, 0.0), float(n))
    if errors >= n:
        return 1.0
    a, b, target = errors + 1.0, n - errors, confidence
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection on a monotone CDF: 2^-60 is far below any rate that matters
        mid = (lo + hi) / 2
        if _beta_cdf(mid, a, b) < target:
            lo = mid
        else:
            hi = mid
    return hi


def fit_level(
    labels: Iterable[Label],
    *,
    max_error: float,
    per_user: int,
    confidence: float = CONFIDENCE,
    exclude: frozenset[Source] = frozenset(),
) -> Level | None:
    """The lowest of ``LEVELS`` whose labels bound the wrong answers under ``max_error``, tried from
    the top down and stopping at the first that fails; None where none passes. Each user's newest
    ``per_user`` labels count; labels from ``exclude``'s sources (a judge no longer trusted) not at all."""
    kept = sorted(_capped([lb for lb in labels if lb.source not in exclude], per_user), key=lambda lb: -lb.score)
    needed = labels_needed(max_error, confidence)
    found: Level | None = None
    n, errors = 0, 0.0
    for level in LEVELS:
        before = n
        while n < len(kept) and kept[n].score >= level:
            errors += _error(kept[n])
            n += 1
        if n < needed:
            if found is None:
                continue  # too few to pass at all: the search has not started
            break
        if found is not None and n == before:
            break  # no label scored in this band: nothing says a level this low is safe
        bound = upper_bound(errors, n, confidence)
        if bound > max_error:
            break
        found = Level(level, n, round(errors, 6), bound)
    return found


def lower_bound(hits: float, n: int, confidence: float = CONFIDENCE) -> float:
    """The one-sided Clopper-Pearson lower bound of a rate from ``hits`` in ``n``."""
    return 0.0 if n <= 0 else 1.0 - upper_bound(n - hits, n, confidence)


def sampled(key: str, rate: float, purpose: str) -> bool:
    """Is ``key`` in the ``rate`` share set aside for ``purpose``? By hash, so a replay samples the
    same requests every time and each purpose draws its own share."""
    if rate <= 0.0:
        return False
    digest = hashlib.blake2b(f"{purpose}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < rate


def _error(label: Label) -> float:
    if not label.right:
        return 1.0
    return AGREEMENT_DOUBT if label.source is Source.AGREEMENT else 0.0


def _capped(labels: Sequence[Label], per_user: int) -> list[Label]:
    """Each user's newest ``per_user`` labels."""
    seen: Counter[str] = Counter()
    kept: list[Label] = []
    for label in sorted(labels, key=lambda lb: -lb.at):
        if seen[label.user] < per_user:
            seen[label.user] += 1
            kept.append(label)
    return kept


def _beta_cdf(x: float, a: float, b: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(1 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float) -> float:
    """Lentz's evaluation of the incomplete beta's continued fraction."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((a + m2 - 1) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h
