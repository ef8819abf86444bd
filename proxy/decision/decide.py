"""Hit, half-hit or miss: an ordered tuple of stages over the candidates, each of which may end
the decision (like structlog's processors). Pure: the verifier's probabilities come in computed.

1. Hard filters: a candidate of another intent, or whose active entities conflict with the
   request's, is dropped whatever its score. The best survivor (or the record a restatement
   names: by its words, or the session's previous turn when the verifier reads the request as
   that turn asked again, at ``verify_previous``) is judged by every later stage.
2. Score floor: below the intent's ``candidate`` score it is a miss.
3. Change detection: a turn that negates, adds or modifies a constraint of the candidate's
   context makes a half-hit (history still useful, answer not); another topic is a miss.
4. Lexical guards: pairs the embedding cannot be trusted on make a half-hit.
5. Accept zone, or verification where the intent sets ``verify_accept``: below ``accept``, or
   a verifier probability below ``verify_accept``, only reuses the context upstream.
6. ``direct_hit: false`` never serves; answer validation checks the cached answer's key facts
   against the request's constraints, and a failure never serves. Otherwise a hit.

An exact repeat (the same conversation byte for byte, perhaps another session's) is judged first
of all the survivors and goes from the hard filters to stage 6: stages 2 to 5 would only read the
conversation against itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from proxy.decision.change import ChangeKind, ChangeVerdict, detect_change
from proxy.decision.validate import KeyFacts, constraints_of, validate_answer
from proxy.model import Candidate, Decision, Reason, Signature, Status
from proxy.policy import IntentPolicy
from proxy.signing.signer import fold_space
from proxy.text.entities import Entities, entities_conflict
from proxy.text.lexical import context_dependent, reordered, text_similarity
from proxy.text.normalize import NormalText
from proxy.verify.sides import REPLY_HEAD_CHARS

# Within one conversation, an answer is reused only for the very next turn (a rephrasing or a
# repeat right after it); once other turns come between, the whole-conversation key has changed.
MAX_TURN_GAP = 1
RESTATEMENT = Reason.RESTATEMENT  # the reason of a hit served by rule, not by score
CONTEXT_REPLY_SIMILARITY = 0.8  # trigram Jaccard of the assistant messages a dependent turn answers


@dataclass(frozen=True, slots=True)
class Filtered:
    """A candidate and why the hard filters dropped it (``reason`` None: it survived)."""

    candidate: Candidate
    reason: Reason | None = None
    detail: str = ""


def hard_filter(candidates: Sequence[Candidate], sig: Signature) -> list[Filtered]:
    out = []
    for cand in candidates:
        tags = cand.record.coarse_tags
        if tags.get("intent") != sig.tags.intent:
            out.append(Filtered(cand, Reason.FILTERED_INTENT))
            continue
        conflicts = entities_conflict(Entities.from_json(tags.get("entities", {})), sig.tags.entities)
        out.append(
            Filtered(cand, Reason.FILTERED_ENTITIES, ",".join(sorted(conflicts))) if conflicts else Filtered(cand)
        )
    return out


def lexical_guard(sig: Signature, cand: Candidate, *, restated: bool = False, verified: bool = False) -> Reason | None:
    """Why the embedding cannot be trusted for this pair, if it cannot (see proxy.text.lexical). A
    restatement was matched on the conversation's own words, so the reply it follows is moot. A
    pair the verifier will read (``verified``) is held only to the exchanges word lists show for
    sure (two words or two numbers swapped); a looser reordering is the verifier's to judge."""
    tags = cand.record.coarse_tags
    if cand.same_session and (cand.turn_gap or 0) > MAX_TURN_GAP:
        # the conversation moved on since that answer: other turns now sit between them
        return Reason.CONTEXT_MOVED
    if not cand.same_session and tags.get("history") != sig.history_key:
        # another conversation's answer to the same words after other turns: the vectors of the
        # whole conversations are close, but what was said before may have shaped that answer
        return Reason.OTHER_HISTORY
    question = str(tags.get("question", ""))
    if question and question != sig.current_text and reordered(sig.current_text, question, loose=not verified):
        return Reason.REORDERED_WORDS
    if (
        not restated
        and context_dependent(sig.current_text)
        and text_similarity(sig.previous_reply, str(tags.get("previous_reply", ""))) < CONTEXT_REPLY_SIMILARITY
    ):
        return Reason.CONTEXT_DIFFERS
    return None


# what a context derives without the verifier's verdicts: carried to the context that has them
_BEFORE_VERDICTS = ("ranked", "survivors", "words_restated", "previous_turn", "_alternate_contexts")


@dataclass(frozen=True)
class DecisionContext:
    """What every stage reads: the request, its policy, the candidates and the verifier's
    probabilities (cache_id -> p). What several stages need is derived once, on first use, and
    what does not hang on the verdicts is derived once for the whole decision: the context that
    chose what to verify hands it to the one that reads the verdicts (``with_verdicts``)."""

    candidates: Sequence[Candidate]
    sig: Signature
    policy: IntentPolicy
    verdicts: Mapping[str, float] = field(default_factory=dict)
    # change detection per judged record (best, restated?): the best may move once verdicts come
    _changes: dict[tuple[str, bool], ChangeVerdict] = field(default_factory=dict, compare=False, repr=False)
    # the lexical guard per judged record (best, restated by its words?, verified?)
    _guards: dict[tuple[str, bool, bool], Reason | None] = field(default_factory=dict, compare=False, repr=False)

    def with_verdicts(self, verdicts: Mapping[str, float]) -> DecisionContext:
        """This context with the verifier's verdicts, keeping what it derived without them."""
        ctx = DecisionContext(self.candidates, self.sig, self.policy, verdicts, self._changes, self._guards)
        for name in _BEFORE_VERDICTS:
            if name in self.__dict__:
                ctx.__dict__[name] = self.__dict__[name]
        return ctx

    @cached_property
    def ranked(self) -> list[Filtered]:
        """Best first; the record of this very conversation first of all, whatever its score."""
        sig = self.sig
        return sorted(
            hard_filter(self.candidates, sig),
            key=lambda f: (f.candidate.record.request_hash != sig.request_hash, -f.candidate.score),
        )

    @cached_property
    def survivors(self) -> list[Candidate]:
        return [f.candidate for f in self.ranked if f.reason is None]

    @cached_property
    def words_restated(self) -> Candidate | None:
        """A spelled-out restatement of the previous, elliptical turn is that turn's request: its
        words show it where the vectors cannot ("San Mateo." vs the full question). The record must
        hold the very answer the user saw to that turn: a derived session id can join two
        conversations that opened alike. The score zones are for judging by similarity; every other
        net still runs."""
        if not (self.policy.restatement and self.sig.restates_previous):
            return None
        answer = self.sig.restated_answer
        return self._previous_turn_answering(lambda text: fold_space(text) == answer)

    def _previous_turn_answering(self, saw: Callable[[str], bool]) -> Candidate | None:
        """The session's previous turn, if its record holds the answer the user saw (``saw``).
        The intent filter does not apply: the classifier may well name the two wordings of one
        request differently; an entity conflict still drops the record."""
        return next(
            (
                f.candidate
                for f in self.ranked
                if f.reason in (None, Reason.FILTERED_INTENT)
                and f.candidate.same_session
                and f.candidate.turn_gap == 1
                and saw(f.candidate.record.answer_text)
            ),
            None,
        )

    @cached_property
    def previous_turn(self) -> Candidate | None:
        """The record of the session's previous turn, holding the very answer the user saw to it,
        when the intent lets the verifier judge it (``verify_previous``) and its words did not
        already name it. Like a restatement, the intent filter does not apply to it."""
        if self.policy.verify_previous is None or not self.policy.direct_hit or self.words_restated is not None:
            return None
        seen = fold_space(self.sig.previous_reply_head)
        if not seen:
            return None
        return self._previous_turn_answering(lambda text: fold_space(text[:REPLY_HEAD_CHARS]) == seen)

    @property
    def asked_again(self) -> bool:
        """Does the verifier read this request as the session's previous turn asked again?"""
        level, prev = self.policy.verify_previous, self.previous_turn
        p = None if prev is None else self.verdicts.get(prev.record.cache_id)
        return p is not None and level is not None and p >= level

    @property
    def restated(self) -> Candidate | None:
        return self.words_restated or (self.previous_turn if self.asked_again else None)

    @property
    def best(self) -> Candidate:
        """The candidate the stages after the hard filters judge (only read once one survived)."""
        return self.restated or self.survivors[0]

    @property
    def change(self) -> ChangeVerdict:
        key = (self.best.record.cache_id, self.restated is not None)
        if key not in self._changes:
            self._changes[key] = self._detect_change()
        return self._changes[key]

    @property
    def guard(self) -> Reason | None:
        """Why the embedding cannot be trusted for the best candidate, if it cannot (``lexical_guard``)."""
        restated, verifies = self.words_restated is not None, self.verifies
        key = (self.best.record.cache_id, restated, verifies)
        if key not in self._guards:
            self._guards[key] = lexical_guard(self.sig, self.best, restated=restated, verified=verifies)
        return self._guards[key]

    def _detect_change(self) -> ChangeVerdict:
        record = self.best.record
        return detect_change(
            self.sig.current_text,
            candidate_entities=Entities.from_json(record.coarse_tags.get("entities", {})),
            request_entities=self.sig.tags.entities,
            candidate_intent=str(record.coarse_tags.get("intent")),
            request_intent=self.sig.tags.intent,
            restated_turn=NormalText(str(record.coarse_tags.get("question", ""))) if self.restated else None,
        )

    @property
    def exact_repeat(self) -> bool:
        """The same conversation, byte for byte (another session's, where the intent shares
        repeats): nothing changed, nothing reworded, nothing for the verifier to tell apart, so only
        the checks on the answer itself still run."""
        return self.restated is None and self.best.record.request_hash == self.sig.request_hash

    @property
    def verifies(self) -> bool:
        """Does the verification stage judge this candidate, instead of the accept zone? Not an
        exact repeat, nor a restatement its words show: both are matched on the conversation's own
        words, and the verifier has nothing to tell apart there."""
        return (
            self.policy.verify_accept is not None
            and self.policy.direct_hit
            and not self.exact_repeat
            and self.words_restated is None
        )

    def alternates(self) -> list[DecisionContext]:
        """The next survivors above the candidate floor, each judged alone, when the intent
        verifies: the nearest vector is not always the same request (a paraphrase can sit below a
        near-miss), so the verifier reads up to ``verify_top`` of them. Each still passes every
        net on its own."""
        if self.restated is not None:
            return []
        return [alt.with_verdicts(self.verdicts) for alt in self._alternate_contexts]

    @cached_property
    def _alternate_contexts(self) -> list[DecisionContext]:
        if self.policy.verify_accept is None or not self.survivors:
            return []
        floor, top = self.policy.candidate, self.policy.verify_top
        return [
            DecisionContext((cand,), self.sig, self.policy)
            for cand in self.survivors[1:top]
            if cand.score >= floor and cand.record.request_hash != self.sig.request_hash
        ]

    def about_best(
        self, status: Status, reason: Reason, *, signals: bool = True, failed_checks: tuple[str, ...] = ()
    ) -> Decision:
        """A decision on the best candidate, carrying the change signals and any verifier verdict."""
        best = self.best
        return Decision(
            status,
            reason,
            best.record,
            best.score,
            failed_checks=failed_checks,
            signals=self.change.signals if signals else (),
            verified=self.verdicts.get(best.record.cache_id) if self.verifies or self.asked_again else None,
        )


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


def direct_hit(ctx: DecisionContext) -> Decision | None:
    return None if ctx.policy.direct_hit else ctx.about_best(Status.HALF_HIT, Reason.NO_DIRECT_HIT, signals=False)


def answer_validation(ctx: DecisionContext) -> Decision | None:
    facts = KeyFacts.from_json(dict(ctx.best.record.key_facts))
    checked = validate_answer(facts, constraints_of(ctx.sig.tags.entities), ctx.policy.validate)
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
    accept: float | None
    accept_previous: float | None

    def settled(self, verdicts: Mapping[str, float]) -> bool:
        """Does a verdict of the first round already serve, so the alternates need no reading?"""
        for c in self.first:
            level = self.accept_previous if c is self.previous else self.accept
            p = verdicts.get(c.record.cache_id)
            if level is not None and p is not None and p >= level:
                return True
        return False


def verification_rounds(ctx: DecisionContext) -> VerificationRounds:
    """What to ask the verifier about, from a context without verdicts (``candidates_to_verify``)."""
    policy = ctx.policy
    if policy.verify_accept is None and policy.verify_previous is None:
        return VerificationRounds([], [], None, None, None)
    previous = ctx.previous_turn
    asked = [] if previous is None else [previous]
    for judged in [ctx, *ctx.alternates()]:
        if _verifiable(judged) and judged.best not in asked:
            asked.append(judged.best)
    head = 1 + (previous is not None)
    return VerificationRounds(asked[:head], asked[head:], previous, policy.verify_accept, policy.verify_previous)
