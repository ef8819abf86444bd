"""What every stage of the decision reads (``DecisionContext``), and the two judgements that are
not stages of their own: the hard filter over every candidate and the lexical guard on one pair.

The context derives what several stages need once, on first use; what does not hang on the
verifier's verdicts is derived once for a whole decision (``DecisionContext.with_verdicts``).
Pure, as the decision is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from proxy.core.decision.change import ChangeVerdict, detect_change
from proxy.core.model import (
    PREVIOUS_QUESTION_CHARS,
    QUESTION_CHARS,
    REPLY_HEAD_CHARS,
    Candidate,
    Decision,
    Reason,
    Record,
    Signature,
    Status,
)
from proxy.core.policy import IntentPolicy
from proxy.core.text.courtesy import bare_question
from proxy.core.text.entities import entities_conflict, extract_entities
from proxy.core.text.language import languages_differ
from proxy.core.text.lexical import context_dependent, reordered, stands_alone, text_similarity, works_on_the_reply
from proxy.core.text.names import names_differ
from proxy.core.text.normalize import fold_space
from proxy.core.text.symbols import operators_differ

T = TypeVar("T")

__all__ = [
    "CONTEXT_REPLY_SIMILARITY",
    "MAX_TURN_GAP",
    "DecisionContext",
    "Filtered",
    "hard_filter",
    "lexical_guard",
    "same_request",
]

# Within one conversation, an answer is reused only for the very next turn (a rephrasing or a
# repeat right after it); once other turns come between, the whole-conversation key has changed.
MAX_TURN_GAP = 1
CONTEXT_REPLY_SIMILARITY = 0.8  # trigram Jaccard of the assistant messages a dependent turn answers


@dataclass(frozen=True, slots=True)
class Filtered:
    """A candidate and why the hard filters dropped it (``reason`` None: it survived)."""

    candidate: Candidate
    reason: Reason | None = None
    detail: str = ""
    same: bool = False  # the record answered this very request (``same_request``)


def same_request(sig: Signature, cand: Candidate) -> bool:
    """Did the candidate's record answer this very request: the same conversation byte for byte, or,
    in the same session, the same turn after the same turns with its courtesy framing edited
    ("Quick question: why do cats purr?" re-sent as "Why do cats purr?", "…吗，谢谢" as "…吗？";
    proxy.core.text.courtesy)? Another session's framing is another opening of a conversation, whose
    answer may have taken it elsewhere. A turn the verifier's side cut short is not compared; case
    and every other word must match."""
    record = cand.record
    if record.request_hash == sig.request_hash:
        return True
    if not cand.same_session:
        return False
    tags = record.coarse_tags
    mine, theirs = sig.question_raw, tags.question_raw
    if not sig.question_bare or not theirs or max(len(mine), len(theirs)) >= QUESTION_CHARS:
        return False
    if tags.history != sig.history_key or tags.previous_reply != sig.previous_reply:
        return False
    return sig.question_bare == bare_question(theirs)


def asked_again(sig: Signature, cand: Candidate) -> bool:
    """Does the session ask a question of its own again, after other turns: both turns name what
    they ask about (``stands_alone``), so each asks the same whatever came before it? Then the
    turns are what to compare: the conversations around them moved on between the two, so their
    vectors and their previous turns differ whatever the question means."""
    return cand.same_session and (cand.turn_gap or 0) > 1 and _both_stand_alone(sig, cand)


def opens_alike(sig: Signature, cand: Candidate) -> bool:
    """Is the request another conversation's opening asking what the candidate's opening asked,
    both naming what they ask about? Nothing came before either, so the turns are all there is to
    compare."""
    first = sig.turn_index == 1 and cand.record.coarse_tags.turn == 1
    return not cand.same_session and first and _both_stand_alone(sig, cand)


def _both_stand_alone(sig: Signature, cand: Candidate) -> bool:
    tags = cand.record.coarse_tags
    return stands_alone(sig.question_raw or sig.current_text) and stands_alone(tags.question_raw or tags.question)


def hard_filter(
    candidates: Sequence[Candidate], sig: Signature, *, neighbours: Collection[str] = frozenset()
) -> list[Filtered]:
    """Each candidate, with why it is dropped if it is. The intent filter spares the record of this
    very request (``same_request``): the classifier may name two framings of one turn differently;
    and a record of one of the request's intent's ``neighbours`` (proxy.core.policy), which the
    classifier's readings of one request straddle."""
    out = []
    for cand in candidates:
        tags = cand.record.coarse_tags
        same = same_request(sig, cand)
        if tags.intent != sig.tags.intent and tags.intent not in neighbours and not same:
            out.append(Filtered(cand, Reason.FILTERED_INTENT))
            continue
        conflicts = entities_conflict(tags.entities, sig.tags.entities)
        out.append(
            Filtered(cand, Reason.FILTERED_ENTITIES, ",".join(sorted(conflicts)), same)
            if conflicts
            else Filtered(cand, same=same)
        )
    return out


def lexical_guard(
    sig: Signature, cand: Candidate, *, restated: bool = False, verified: bool = False, judged: bool = False
) -> Reason | None:
    """Why the embedding cannot be trusted for this pair, if it cannot (see proxy.core.text.lexical). A
    restatement was matched on the conversation's own words, so the reply it follows is moot. A
    pair the verifier will read (``verified``) is held only to the exchanges word lists show for
    sure (two words or two numbers swapped); a looser reordering is the verifier's to judge. A
    pair the model judge reads (``judged``) is not held to what this conversation said between the
    answer and the request (context_moved, context_differs): the judge reads the whole conversation,
    so it sees whether what the request leans on is still what the answer read; another
    conversation's history it never reads, so other_history stands."""
    tags = cand.record.coarse_tags
    if cand.same_session and (cand.turn_gap or 0) > MAX_TURN_GAP and not judged:
        # the conversation moved on since that answer: other turns now sit between them
        return Reason.CONTEXT_MOVED
    if not cand.same_session and tags.history != sig.history_key:
        # another conversation's answer to the same words after other turns: the vectors of the
        # whole conversations are close, but what was said before may have shaped that answer
        return Reason.OTHER_HISTORY
    asked, theirs = sig.question_raw, tags.question_raw
    if languages_differ(asked or sig.current_text, theirs or tags.question):
        # the answer is in the other language: whatever a multilingual reader makes of the meanings
        return Reason.OTHER_LANGUAGE
    if operators_differ(asked or sig.current_text, theirs or tags.question):
        return Reason.OTHER_OPERATORS
    if (
        cand.same_session
        and cand.turn_gap == 1
        and asked
        and works_on_the_reply(asked)
        and sig.question_bare == bare_question(theirs)
    ):
        # a turn working on the last reply, asked again in its own words right after its answer
        # ("Can you give me an example?" twice): the user saw that answer and asks for another
        return Reason.ASKED_AGAIN
    if not restated and asked and theirs and names_differ(asked, theirs):
        # a name the gazetteer does not know ("to Prague" / "to Marrakech") moves a vector little;
        # a restatement spells out the names its elliptical turn left to the context
        return Reason.OTHER_NAMES
    question = tags.question
    if (
        question
        and question != sig.current_text
        and reordered(sig.current_text, question, loose=not verified, segmenter=sig.cuts)
    ):
        return Reason.REORDERED_WORDS
    if (
        not restated
        and not judged
        and context_dependent(sig.current_text)
        and text_similarity(sig.previous_reply, tags.previous_reply) < CONTEXT_REPLY_SIMILARITY
    ):
        return Reason.CONTEXT_DIFFERS
    return None


def _asked_in(record: Record, asked: str) -> bool:
    """Was the record's turn asked in these words (a turn as written, cut and folded as the
    signature holds the previous one)?"""
    return fold_space(record.coarse_tags.question_raw[:PREVIOUS_QUESTION_CHARS]) == asked


@dataclass(frozen=True)
class DecisionContext:
    """What every stage reads: the request, its policy, the candidates and the verifier's
    probabilities (cache_id -> p). What several stages need is derived once, on first use, into
    ``_memo``, which the context that chose what to verify shares with the one that reads the
    verdicts (``with_verdicts``): what hangs on the verdicts is keyed by the record it judged."""

    candidates: Sequence[Candidate]
    sig: Signature
    policy: IntentPolicy
    verdicts: Mapping[str, float] = field(default_factory=dict)
    _memo: dict[Hashable, Any] = field(default_factory=dict, compare=False, repr=False)

    def with_verdicts(self, verdicts: Mapping[str, float]) -> DecisionContext:
        """This context with the verifier's verdicts, keeping all it derived."""
        return replace(self, verdicts=verdicts)

    def _once(self, key: Hashable, derive: Callable[[], T]) -> T:
        if key not in self._memo:
            self._memo[key] = derive()
        return cast(T, self._memo[key])

    @property
    def ranked(self) -> list[Filtered]:
        """Best first; the record of this very request first of all, whatever its score: the same
        conversation byte for byte before the same one courtesy aside (``same_request``)."""
        sig = self.sig
        return self._once(
            "ranked",
            lambda: sorted(
                hard_filter(self.candidates, sig, neighbours=self.policy.neighbours),
                key=lambda f: (not f.same, f.candidate.record.request_hash != sig.request_hash, -f.candidate.score),
            ),
        )

    @property
    def survivors(self) -> list[Candidate]:
        return self._once("survivors", lambda: [f.candidate for f in self.ranked if f.reason is None])

    @property
    def words_restated(self) -> Candidate | None:
        """A spelled-out restatement of the previous, elliptical turn is that turn's request: its
        words show it where the vectors cannot ("San Mateo." vs the full question). The record must
        be that turn's own: asked in its words, holding the very answer the user saw to it (a
        derived session id can join two conversations that opened alike). The score zones are for
        judging by similarity; every other net still runs."""
        if not (self.policy.restatement and self.sig.restates_previous):
            return None
        answer, asked = self.sig.restated_answer, fold_space(self.sig.previous_question)
        return self._once(
            "words_restated",
            lambda: self._previous_turn_answering(lambda t: fold_space(t) == answer, asked=asked),
        )

    def _previous_turn_answering(self, saw: Callable[[str], bool], *, asked: str | None = None) -> Candidate | None:
        """The session's previous turn, if its record holds the answer the user saw (``saw``) and,
        given ``asked`` (that turn as written, cut as ``Signature.previous_question`` is), was asked
        in those words. The intent filter does not apply: the classifier may well name the two
        wordings of one request differently; an entity conflict still drops the record."""
        return next(
            (
                f.candidate
                for f in self.ranked
                if f.reason in (None, Reason.FILTERED_INTENT)
                and f.candidate.same_session
                and f.candidate.turn_gap == 1
                and saw(f.candidate.record.answer_text)
                and (asked is None or _asked_in(f.candidate.record, asked))
            ),
            None,
        )

    @property
    def previous_turn(self) -> Candidate | None:
        """The record of the session's previous turn, holding the very answer the user saw to it,
        when the intent lets the verifier judge it (``verify_previous``) and its words did not
        already name it. Like a restatement, the intent filter does not apply to it."""
        if self.policy.verify_previous is None or not self.policy.direct_hit or self.words_restated is not None:
            return None
        seen = fold_space(self.sig.previous_reply_head)
        if not seen:
            return None
        return self._once(
            "previous_turn", lambda: self._previous_turn_answering(lambda t: fold_space(t[:REPLY_HEAD_CHARS]) == seen)
        )

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
        # keyed by the judged record: the best may move once the verdicts come
        return self._once(("change", self.best.record.cache_id, self.restated is not None), self._detect_change)

    @property
    def guard(self) -> Reason | None:
        """Why the embedding cannot be trusted for the best candidate, if it cannot (``lexical_guard``)."""
        restated, verifies = self.words_restated is not None, self.verifies
        return self._once(
            ("guard", self.best.record.cache_id, restated, verifies),
            lambda: lexical_guard(self.sig, self.best, restated=restated, verified=verifies),
        )

    def _detect_change(self) -> ChangeVerdict:
        sig, best = self.sig, self.best
        tags = best.record.coarse_tags
        theirs, ours = tags.entities, sig.tags.entities
        again = asked_again(sig, best)
        # two openings, each naming what it asks: the candidate's turn is all its context, so a
        # change phrase both turns have ("不想要了可以退吗") is what both ask, as for a question asked again
        alike = again or opens_alike(sig, best)
        if again:
            # both turns name what they ask about: what the turns in between pinned (another
            # question's budget) is not a constraint of this one, so the turns' own are compared,
            # and a change phrase both have is what both ask ("…换成粉色"), not a change to either's
            # context (a "太长了" after "太长了" is one: it asks to shorten another reply)
            theirs = extract_entities(tags.question, segmenter=sig.cuts)
            ours = extract_entities(sig.current_text, segmenter=sig.cuts)
        return detect_change(
            sig.current_text,
            candidate_entities=theirs,
            request_entities=ours,
            candidate_intent=tags.intent,
            request_intent=sig.tags.intent,
            restated_turn=tags.question if self.restated else None,
            candidate_turn=tags.question if alike else None,
            neighbours=self.policy.neighbours,
        )

    @property
    def exact_repeat(self) -> bool:
        """This very request again: the same conversation, byte for byte (another session's, where
        the intent shares repeats), or the same turn after the same turns, courtesy aside. Nothing
        changed, nothing reworded, nothing for the verifier to tell apart, so only the checks on
        the answer itself still run."""
        if self.restated is not None or not self.survivors:
            return False
        return self._once("survivor_same", lambda: next(f.same for f in self.ranked if f.reason is None))

    @property
    def courtesy_variant(self) -> bool:
        """An exact repeat that differs from the record's request in courtesy framing alone."""
        return self.exact_repeat and self.best.record.request_hash != self.sig.request_hash

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

    @property
    def _alternate_contexts(self) -> list[DecisionContext]:
        if self.policy.verify_accept is None or not self.survivors:
            return []
        floor, top = self.policy.candidate, self.policy.verify_top
        return self._once(
            "alternates",
            lambda: [
                DecisionContext((cand,), self.sig, self.policy)
                for cand in self.survivors[1:top]
                if cand.score >= floor and cand.record.request_hash != self.sig.request_hash
            ],
        )

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
