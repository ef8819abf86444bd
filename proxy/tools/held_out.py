"""Whether calibrated thresholds generalise: K-fold by conversation, each fold served with the
levels fitted on the others. A threshold set just above the worst false candidate looks perfect
on its own data; only rows it was not fitted on show whether it holds."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.core.model import Reason
from proxy.core.policy import Policy
from proxy.tools.calibrate import (
    Calibration,
    VerifyCalibration,
    calibrate,
    calibrate_verifier,
    is_false,
    template_calibration,
)
from proxy.tools.replay import Row


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
            cal = chosen.get(r.intent) or (template_calibration(r.intent, template) if template else None)
            if _served(r, cal, verified.get(r.intent), unseen, previous.get(r.intent)):
                bad = is_false(r)
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
