"""Hit, half-hit or miss: the three safety nets as one pure function (seed §3).

1. Hard filters and score zones: a candidate of another intent, or whose active entities
   conflict with the request's, is dropped whatever its score; the best survivor's score
   falls in the accept, candidate or miss zone of the intent's policy.
2. Change detection: a turn that negates, adds or modifies a constraint of the candidate's
   context makes a half-hit (history still useful, answer not); another topic is a miss.
3. Answer validation: the cached answer's key facts are checked against the request's
   constraints; a failure never serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from proxy.change import ChangeKind, detect_change
from proxy.policy import IntentPolicy
from proxy.signer import Signature, entities_from_json
from proxy.store import Record
from proxy.tagger import entities_conflict
from proxy.validator import KeyFacts, extract_constraints, validate_answer


class Status(StrEnum):
    HIT = "hit"
    HALF_HIT = "half-hit"
    MISS = "miss"
    BYPASS = "bypass"


@dataclass(frozen=True, slots=True)
class Decision:
    status: Status
    reason: str
    record: Record | None = None
    score: float | None = None
    failed_checks: tuple[str, ...] = ()
    signals: tuple[str, ...] = ()

    @property
    def is_hit(self) -> bool:
        return self.status is Status.HIT


def hard_filter(candidates: Sequence[tuple[Record, float]], sig: Signature) -> list[tuple[Record, float, str]]:
    """Each candidate with '' when it survives, else the reason it was dropped."""
    out = []
    for record, score in candidates:
        tags = record.coarse_tags
        reason = ""
        if tags.get("intent") != sig.tags.intent:
            reason = "intent"
        else:
            conflicts = entities_conflict(entities_from_json(tags.get("entities", {})), sig.tags.entities)
            if conflicts:
                reason = "entities:" + ",".join(sorted(conflicts))
        out.append((record, score, reason))
    return out


def decide(candidates: Sequence[tuple[Record, float]], sig: Signature, policy: IntentPolicy) -> Decision:
    ranked = sorted(hard_filter(candidates, sig), key=lambda c: -c[1])
    survivors = [(r, s) for r, s, why in ranked if not why]
    if not survivors:
        reason = f"filtered:{ranked[0][2]}" if ranked else "no_candidate"
        return Decision(Status.MISS, reason, score=ranked[0][1] if ranked else None)
    record, score = survivors[0]
    if score < policy.candidate:
        return Decision(Status.MISS, "below_candidate", record, score)
    verdict = detect_change(
        sig.current_text,
        candidate_entities=entities_from_json(record.coarse_tags.get("entities", {})),
        request_entities=sig.tags.entities,
        candidate_intent=str(record.coarse_tags.get("intent")),
        request_intent=sig.tags.intent,
    )
    if verdict.kind is ChangeKind.NEW_TOPIC:
        return Decision(Status.MISS, "new_topic", record, score, signals=verdict.signals)
    if verdict.kind is ChangeKind.MODIFIES_CONTEXT:
        return Decision(Status.HALF_HIT, "modifies_context", record, score, signals=verdict.signals)
    if not policy.direct_hit:
        return Decision(Status.HALF_HIT, "no_direct_hit", record, score)
    checked = validate_answer(
        KeyFacts.from_json(dict(record.key_facts)), extract_constraints(sig.active_user_text), policy.validate
    )
    if not checked.ok:
        return Decision(Status.MISS, "validation_failed", record, score, failed_checks=checked.failures)
    zone = "accept" if score >= policy.accept else "candidate_no_change"
    return Decision(Status.HIT, zone, record, score, signals=verdict.signals)
