"""Hit, half-hit or miss: an ordered tuple of stages over the candidates, each of which may end
the decision (like structlog's processors). Pure: the verifier's probabilities come in computed.

1. Hard filters: a candidate of another intent (other than the intent's declared ``neighbours``),
   or whose active entities conflict with the request's, is dropped whatever its score. The best
   survivor (or the record a restatement names: by its words, or the session's previous turn when
   the verifier reads the request as that turn asked again, at ``verify_previous``) is judged by
   every later stage.
2. Score floor: below the intent's ``candidate`` score it is a miss.
3. Change detection: a turn that negates, adds or modifies a constraint of the candidate's
   context makes a half-hit (history still useful, answer not); another topic is a miss.
4. Lexical guards: pairs the embedding cannot be trusted on make a half-hit.
5. Accept zone, or verification where the intent sets ``verify_accept``: below ``accept``, or
   a verifier probability below ``verify_accept``, only reuses the context upstream.
6. ``widen_by: judge`` serves another session's record only on the judge's yes, and
   ``direct_hit: false`` nothing but exact repeats; answer validation checks the cached
   answer's key facts against the request's constraints, and a failure never serves. Otherwise a
   hit.

An exact repeat (the same conversation byte for byte, perhaps another session's, or the same turn
after the same turns with courtesy framing added or dropped: ``same_request``) is judged first of
all the survivors and goes from the hard filters to stage 6: stages 2 to 5 would only read the
conversation against itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from proxy.core.decision.change import ChangeKind
from proxy.core.decision.context import (
    CONTEXT_REPLY_SIMILARITY,
    MAX_TURN_GAP,
    DecisionContext,
    Filtered,
    hard_filter,
    lexical_guard,
)
from proxy.core.decision.validate import constraints_of, validate_answer
from proxy.core.model import Candidate, Decision, Reason, Signature, Status
from proxy.core.policy import IntentPolicy

# the context and the filter and guard it runs are re-exported: callers know the decision by this name
__all__ = [
    "CONTEXT_REPLY_SIMILARITY",
    "MAX_TURN_GAP",
    "RESTATEMENT",
    "STAGES",
    "DecisionContext",
    "Filtered",
    "VerificationRounds",
    "candidates_to_verify",
    "decide",
    "decide_in",
    "hard_filter",
    "lexical_guard",
    "verification_rounds",
]

RESTATEMENT = Reason.RESTATEMENT  # the reason of a hit served by rule, not by score

Stage = Callable[[DecisionContext], Decision | None]


def hard_filters(ctx: DecisionContext) -> Decision | None:
    if ctx.survivors or ctx.restated is not None:
        return None
    if not ctx.ranked:
        return Decision(Status.MISS, Reason.NO_CANDIDATE)
    top = ctx.ranked[0]
    return Decision(Status.MISS, top.reason or Reason.NO_CANDIDATE, score=top.candidate.score, detail=top.detail)


def score_floor(ctx: DecisionContext) -> Decision | None:
    if ctx.restated is None and not ctx.exact_repeat and ctx.best.score < ctx.policy.candidate:
        return ctx.about_best(Status.MISS, Reason.BELOW_CANDIDATE, signals=False)
    return None


def change_detection(ctx: DecisionContext) -> Decision | None:
    if ctx.exact_repeat:
        return None
    if ctx.change.kind is ChangeKind.NEW_TOPIC:
        return ctx.about_best(Status.MISS, Reason.NEW_TOPIC)
    if ctx.change.kind is ChangeKind.MODIFIES_CONTEXT:
        return ctx.about_best(Status.HALF_HIT, Reason.MODIFIES_CONTEXT)
    return None


def lexical_guards(ctx: DecisionContext) -> Decision | None:
    # a turn that leans on its context, asked after another reply, asks something else whatever the
    # verifier read: only a restatement its words show is exempt
    if ctx.exact_repeat:
        return None
    guard = ctx.guard
    return ctx.about_best(Status.HALF_HIT, guard) if guard else None


def accept_zone(ctx: DecisionContext) -> Decision | None:
    # Below accept only the context is reused upstream (KV prefix), never the old answer: the
    # change detector finds under half of the modifications on held-out data
    # (benchmarks/bench_change.py), so a no-change verdict alone does not make a hit.
    if (
        ctx.policy.verify_accept is not None
        or ctx.restated is not None
        or ctx.exact_repeat
        or ctx.best.score >= ctx.policy.accept
    ):
        return None
    return ctx.about_best(Status.HALF_HIT, Reason.CANDIDATE_ZONE)


def verification(ctx: DecisionContext) -> Decision | None:
    """The pair verifier reads both requests with their context; its calibrated probability, not
    the cosine, says whether the cached answer answers this request."""
    if not ctx.verifies:
        return None
    p = ctx.verdicts.get(ctx.best.record.cache_id)
    if p is None:  # not asked (disabled, overloaded or failed): the safe side is not to serve
        return ctx.about_best(Status.HALF_HIT, Reason.VERIFIER_UNAVAILABLE)
    assert ctx.policy.verify_accept is not None
    return ctx.about_best(Status.HALF_HIT, Reason.VERIFIER_REJECTED) if p < ctx.policy.verify_accept else None


def other_session(ctx: DecisionContext) -> Decision | None:
    # ``widen_by: judge``: the scores were set on sessions' own records; another user's near-miss
    # scores as high, so only the judge, which reads the answer, serves one (ask_judge)
    best = ctx.best
    if ctx.policy.widen_by == "scores" or best.same_session or ctx.exact_repeat:
        return None
    return ctx.about_best(Status.HALF_HIT, Reason.JUDGE_ONLY, signals=False)


def direct_hit(ctx: DecisionContext) -> Decision | None:
    # ``direct_hit: false`` distrusts judging by meaning, where one changed word is another answer
    # (legal); this very request asked again has nothing to judge
    if ctx.policy.direct_hit or ctx.exact_repeat:
        return None
    return ctx.about_best(Status.HALF_HIT, Reason.NO_DIRECT_HIT, signals=False)


def answer_validation(ctx: DecisionContext) -> Decision | None:
    checked = validate_answer(ctx.best.record.key_facts, constraints_of(ctx.sig.tags.entities), ctx.policy.validate)
    if checked.ok:
        return None
    return ctx.about_best(Status.MISS, Reason.VALIDATION_FAILED, signals=False, failed_checks=checked.failures)


def hit(ctx: DecisionContext) -> Decision:
    if ctx.words_restated is not None:
        reason = Reason.RESTATEMENT
    elif ctx.asked_again:
        reason = Reason.VERIFIED_PREVIOUS
    elif ctx.verifies:
        reason = Reason.VERIFIED
    elif ctx.courtesy_variant:
        reason = Reason.COURTESY_VARIANT
    elif ctx.exact_repeat:
        reason = Reason.EXACT_REPEAT
    else:
        reason = Reason.ACCEPT
    return ctx.about_best(Status.HIT, reason)


STAGES: tuple[Stage, ...] = (
    hard_filters,
    score_floor,
    change_detection,
    lexical_guards,
    accept_zone,
    verification,
    other_session,
    direct_hit,
    answer_validation,
)
# The stages before the verifier: a candidate they all pass is the one the verifier is asked about.
_BEFORE_VERIFICATION = STAGES[: STAGES.index(verification)]


def decide(
    candidates: Sequence[Candidate],
    sig: Signature,
    policy: IntentPolicy,
    *,
    verdicts: Mapping[str, float] | None = None,
) -> Decision:
    return decide_in(DecisionContext(candidates, sig, policy, verdicts or {}))


def decide_in(ctx: DecisionContext) -> Decision:
    """The decision on a context: pass the one ``verification_rounds`` read, ``with_verdicts``,
    and the stages before verification are not run again for what they already judged."""
    decision = _fold(ctx)
    if decision.status is Status.HIT:
        return decision
    # the best verified alternate, if one passes every stage: the verifier's order, not the vector's
    ranked = sorted(ctx.alternates(), key=lambda alt: -ctx.verdicts.get(alt.best.record.cache_id, -1.0))
    for alt in ranked:
        if alt.best.record.cache_id in ctx.verdicts:
            served = _fold(alt)
            if served.status is Status.HIT:
                return served
    return decision


def _fold(ctx: DecisionContext) -> Decision:
    for stage in STAGES:
        decision = stage(ctx)
        if decision is not None:
            return replace(decision, stage=stage.__name__)
    return replace(hit(ctx), stage=hit.__name__)


def _verifiable(ctx: DecisionContext) -> bool:
    """Does the best candidate of ``ctx`` pass every stage before verification, and verify?"""
    # the stages first: the hard filters end it before ``best`` is read when nothing survived
    return not any(stage(ctx) is not None for stage in _BEFORE_VERIFICATION) and ctx.verifies


def candidates_to_verify(candidates: Sequence[Candidate], sig: Signature, policy: IntentPolicy) -> list[Candidate]:
    """The candidates whose verifier probability ``decide`` will read: the session's previous turn,
    when the intent verifies it (``verify_previous``); and, when the intent verifies
    (``verify_accept``), the best one and its alternates among the nearest ``verify_top``, each
    that passes every stage before verification. Usually a few, often none."""
    rounds = verification_rounds(DecisionContext(candidates, sig, policy))
    return [*rounds.first, *rounds.then]


@dataclass(frozen=True, slots=True)
class VerificationRounds:
    """``candidates_to_verify`` in two rounds: the alternates are read only when neither the
    session's previous turn nor the best candidate is accepted, so a verified hit costs the
    verifier one or two pairs, not ``verify_top`` of them."""

    first: list[Candidate]  # the session's previous turn, the best candidate
    then: list[Candidate]  # the alternates
    previous: Candidate | None
    policy: IntentPolicy

    def settled(self, verdicts: Mapping[str, float]) -> bool:
        """Does a verdict of the first round already serve, so the alternates need no reading?"""
        for c in self.first:
            level = self.policy.verify_previous if c is self.previous else self.policy.verify_accept
            p = verdicts.get(c.record.cache_id)
            if level is not None and p is not None and p >= level:
                return True
        return False


def verification_rounds(ctx: DecisionContext) -> VerificationRounds:
    """What to ask the verifier about, from a context without verdicts (``candidates_to_verify``)."""
    policy = ctx.policy
    if policy.verify_accept is None and policy.verify_previous is None:
        return VerificationRounds([], [], None, policy)
    previous = ctx.previous_turn
    asked = [] if previous is None else [previous]
    for judged in [ctx, *ctx.alternates()]:
        if _verifiable(judged) and judged.best not in asked:
            asked.append(judged.best)
    head = 1 + (previous is not None)
    return VerificationRounds(asked[:head], asked[head:], previous, policy)
