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

from proxy.decision.change import ChangeKind, detect_change
from proxy.decision.validate import KeyFacts, extract_constraints, validate_answer
from proxy.model import Candidate, Decision, Signature, Status
from proxy.policy import IntentPolicy
from proxy.signing.signer import fold_space
from proxy.text.entities import Entities, entities_conflict
from proxy.text.lexical import context_dependent, reordered, text_similarity

# Within one conversation, an answer is reused only for the very next turn (a rephrasing or a
# repeat right after it); once other turns come between, the whole-conversation key has changed.
MAX_TURN_GAP = 1
RESTATEMENT = "restatement"  # the reason of a hit served by rule, not by score
CONTEXT_REPLY_SIMILARITY = 0.8  # trigram Jaccard of the assistant messages a dependent turn answers


def hard_filter(candidates: Sequence[Candidate], sig: Signature) -> list[tuple[Candidate, str]]:
    """Each candidate with '' when it survives, else the reason it was dropped."""
    out = []
    for cand in candidates:
        tags = cand.record.coarse_tags
        reason = ""
        if tags.get("intent") != sig.tags.intent:
            reason = "intent"
        else:
            conflicts = entities_conflict(Entities.from_json(tags.get("entities", {})), sig.tags.entities)
            if conflicts:
                reason = "entities:" + ",".join(sorted(conflicts))
        out.append((cand, reason))
    return out


def lexical_guard(sig: Signature, cand: Candidate, *, restated: bool = False) -> str | None:
    """Why the embedding cannot be trusted for this pair, if it cannot (see proxy.text.lexical). A
    restatement was matched on the conversation's own words, so the reply it follows is moot."""
    tags = cand.record.coarse_tags
    if cand.same_session and (cand.turn_gap or 0) > MAX_TURN_GAP:
        # the conversation moved on since that answer: other turns now sit between them
        return "context_moved"
    question = str(tags.get("question", ""))
    if question and question != sig.current_text and reordered(sig.current_text, question):
        return "reordered_words"
    if (
        not restated
        and context_dependent(sig.current_text)
        and text_similarity(sig.previous_reply, str(tags.get("previous_reply", ""))) < CONTEXT_REPLY_SIMILARITY
    ):
        return "context_differs"
    return None


def decide(candidates: Sequence[Candidate], sig: Signature, policy: IntentPolicy) -> Decision:
    ranked = sorted(hard_filter(candidates, sig), key=lambda c: -c[0].score)
    survivors = [c for c, why in ranked if not why]
    if not survivors:
        reason = f"filtered:{ranked[0][1]}" if ranked else "no_candidate"
        return Decision(Status.MISS, reason, score=ranked[0][0].score if ranked else None)
    restated = _restated(survivors, sig, policy)
    best = restated or survivors[0]
    record, score = best.record, best.score
    if restated is None and score < policy.candidate:
        return Decision(Status.MISS, "below_candidate", record, score)
    verdict = detect_change(
        sig.current_text,
        candidate_entities=Entities.from_json(record.coarse_tags.get("entities", {})),
        request_entities=sig.tags.entities,
        candidate_intent=str(record.coarse_tags.get("intent")),
        request_intent=sig.tags.intent,
    )
    if verdict.kind is ChangeKind.NEW_TOPIC:
        return Decision(Status.MISS, "new_topic", record, score, signals=verdict.signals)
    if verdict.kind is ChangeKind.MODIFIES_CONTEXT:
        return Decision(Status.HALF_HIT, "modifies_context", record, score, signals=verdict.signals)
    guard = lexical_guard(sig, best, restated=restated is not None)
    if guard:
        return Decision(Status.HALF_HIT, guard, record, score, signals=verdict.signals)
    if restated is None and score < policy.accept:
        # The seed serves a no-change candidate here; our change detector finds under half of the
        # modifications on held-out data (benchmarks/bench_change.py), so this zone only reuses
        # the context upstream (KV prefix) and never serves the old answer.
        return Decision(Status.HALF_HIT, "candidate_zone", record, score, signals=verdict.signals)
    if not policy.direct_hit:
        return Decision(Status.HALF_HIT, "no_direct_hit", record, score)
    checked = validate_answer(
        KeyFacts.from_json(dict(record.key_facts)), extract_constraints(sig.active_user_text), policy.validate
    )
    if not checked.ok:
        return Decision(Status.MISS, "validation_failed", record, score, failed_checks=checked.failures)
    return Decision(Status.HIT, RESTATEMENT if restated else "accept", record, score, signals=verdict.signals)


def _restated(survivors: Sequence[Candidate], sig: Signature, policy: IntentPolicy) -> Candidate | None:
    """A spelled-out restatement of the previous, elliptical turn is that turn's request: its words
    show it where the vectors cannot ("San Mateo." vs the full question). The record must hold the
    very answer the user saw to that turn: a derived session id can join two conversations that
    opened alike. The score zones are for judging by similarity; every other net still runs."""
    if not (policy.restatement and sig.restates_previous):
        return None
    return next(
        (
            c
            for c in survivors
            if c.same_session and c.turn_gap == 1 and fold_space(c.record.answer_text) == sig.restated_answer
        ),
        None,
    )
