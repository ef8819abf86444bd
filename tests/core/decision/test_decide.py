"""decide() through every exit: hand-built signatures, records and candidates, no model.

Each row names the Reason it expects; a Reason that decide can return and that no row reaches
fails the coverage test, so a new exit comes with its case."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from proxy.core.decision import context as context_module
from proxy.core.decision.decide import (
    STAGES,
    DecisionContext,
    accept_zone,
    candidates_to_verify,
    decide,
    decide_in,
    hard_filters,
    verification,
    verification_rounds,
)
from proxy.core.model import Candidate, Decision, KeyFacts, Reason, Record, RecordTags, Signature, Status
from proxy.core.policy import IntentPolicy
from proxy.core.text.courtesy import bare_question
from proxy.core.text.entities import Entities, extract_entities
from proxy.core.text.normalize import NormalText, normalize_text
from tests import factories

# Reasons the plan gives before any candidate is looked up (request shape, session, policy) or
# after it (a coalesced answer): never an exit of decide, covered by the openai and e2e tests.
PLAN_REASONS = {
    Reason.N_ABOVE_ONE,
    Reason.LOGPROBS,
    Reason.NON_TEXT_CONTENT,
    Reason.TOOLS,
    Reason.NO_USER_TURN,
    Reason.TOO_LONG,
    Reason.AUDIO_OUTPUT,
    Reason.WEB_SEARCH,
    Reason.HIGH_TEMPERATURE,
    Reason.SESSION_RESET,
    Reason.INTENT_DISABLED,
    Reason.REGENERATE,
    Reason.CORRECTION,
    Reason.TOPIC_SWITCH,
    Reason.NO_CACHE,
    Reason.PENDING,
    Reason.OVERLOADED,
    Reason.STORE_UNAVAILABLE,
    Reason.COALESCED,
    Reason.ACKNOWLEDGEMENT,
    # a Responses request's own (tests/core/openai/test_responses.py)
    Reason.BACKGROUND,
    Reason.REASONING_ITEMS,
    Reason.STORED_CONTEXT,
    Reason.UNKNOWN_PREVIOUS_RESPONSE,
    # the judge's, resumed after decide (tests/core/decision/test_judging.py)
    Reason.JUDGED,
    Reason.JUDGE_REFUSED,
    Reason.JUDGE_LATE,
    Reason.LEARNED,
    Reason.JUDGE_AUDIT,
}
QUESTION = "how do I reset my home router"


def make_policy(**changes: Any) -> IntentPolicy:
    base = IntentPolicy(
        name="support",
        cache=True,
        accept=0.9,
        candidate=0.8,
        direct_hit=True,
        validate=("counts",),
        ttl=60,
        scope="session",
        widen_to="session",
        global_safe=False,
        feedback_floor=0.0,
        prewarm=False,
        restatement=False,
        verify_accept=None,
    )
    return dataclasses.replace(base, **changes)


FIVE_TIPS = extract_entities(normalize_text("give me 5 tips for packing"))


def make_sig(
    text: str = QUESTION, *, entities: Entities | None = None, intent: str = "support", **changes: Any
) -> Signature:
    # no turn as written unless a row gives one: the rows' records stand for other requests in the
    # same words, which the courtesy comparison (context.same_request) would take for this one
    fields = {"current_text": text, "view_text": text, "question_raw": "", "turn_index": 3, **changes}
    fields.setdefault("question_bare", bare_question(fields["question_raw"]))  # as the signer reads it
    return factories.make_signature(intent=intent, entities=entities, **fields)


def make_record(
    question: str = QUESTION,
    *,
    cache_id: str = "sc-1",
    intent: str = "support",
    entities: Entities | None = None,
    answer: str = "Hold the reset button for ten seconds.",
    key_facts: KeyFacts | None = None,
    request_hash: str = "other",
    previous_reply: str = "",
    history: str | None = "",
) -> Record:
    tags = RecordTags(
        intent=intent,
        entities=entities or Entities(),
        question=NormalText(question),
        previous_reply=previous_reply,
        turn=2,
        question_raw=question,
        history=history,
    )
    return factories.make_record(
        cache_id=cache_id,
        intent=intent,
        coarse_tags=tags,
        answer_text=answer,
        key_facts=key_facts or KeyFacts(),
        request_hash=request_hash,
    )


def make_candidate(score: float = 0.95, record: Record | None = None, **changes: Any) -> Candidate:
    return Candidate(record or make_record(), score, score, **changes)


@dataclass(frozen=True)
class Case:
    reason: Reason
    status: Status
    candidates: list[Candidate]
    sig: Signature = field(default_factory=make_sig)
    policy: IntentPolicy = field(default_factory=make_policy)
    verdicts: Mapping[str, float] = field(default_factory=dict)
    check: Callable[[Decision], bool] = lambda d: True

    def run(self) -> Decision:
        return decide(self.candidates, self.sig, self.policy, verdicts=self.verdicts)


OSLO, BERGEN = Entities(places=frozenset({"Oslo"})), Entities(places=frozenset({"Bergen"}))
VERIFYING = make_policy(verify_accept=0.8)
CASES = [
    Case(Reason.NO_CANDIDATE, Status.MISS, []),
    Case(
        Reason.FILTERED_INTENT,
        Status.MISS,
        [make_candidate(record=make_record(intent="travel"))],
        check=lambda d: d.record is None and d.score == 0.95,
    ),
    Case(
        Reason.FILTERED_ENTITIES,
        Status.MISS,
        [make_candidate(record=make_record(entities=BERGEN))],
        sig=make_sig(entities=OSLO),
        check=lambda d: d.detail == "places" and d.summary == "filtered:entities:places",
    ),
    Case(Reason.BELOW_CANDIDATE, Status.MISS, [make_candidate(0.7)]),
    Case(
        Reason.NEW_TOPIC, Status.MISS, [make_candidate()], sig=make_sig("change the subject, how do I reset my router")
    ),
    Case(
        Reason.MODIFIES_CONTEXT,
        Status.HALF_HIT,
        [make_candidate(record=make_record(entities=Entities()))],
        sig=make_sig(entities=OSLO),
        check=lambda d: "new:places" in d.signals,
    ),
    Case(Reason.CONTEXT_MOVED, Status.HALF_HIT, [make_candidate(same_session=True, turn_gap=2)]),
    Case(
        Reason.REORDERED_WORDS,
        Status.HALF_HIT,
        [make_candidate(record=make_record("cheap flights from rome to paris"))],
        sig=make_sig("cheap flights from paris to rome"),
    ),
    Case(Reason.OTHER_HISTORY, Status.HALF_HIT, [make_candidate(record=make_record(history="h-other"))]),
    Case(
        Reason.CONTEXT_DIFFERS,
        Status.HALF_HIT,
        [make_candidate(record=make_record("where is it?", previous_reply="the museum opens at nine"))],
        sig=make_sig("where is it?", previous_reply="you can pay by card or in cash"),
    ),
    Case(Reason.CANDIDATE_ZONE, Status.HALF_HIT, [make_candidate(0.85)]),
    Case(Reason.NO_DIRECT_HIT, Status.HALF_HIT, [make_candidate()], policy=make_policy(direct_hit=False)),
    # widen_by judge: another session's record serves only on the judge's yes
    Case(Reason.JUDGE_ONLY, Status.HALF_HIT, [make_candidate()], policy=make_policy(widen_by="judge")),
    Case(
        Reason.VERIFIER_UNAVAILABLE,
        Status.HALF_HIT,
        [make_candidate(0.85)],
        policy=VERIFYING,
        check=lambda d: d.verified is None,
    ),
    Case(
        Reason.VERIFIER_REJECTED,
        Status.HALF_HIT,
        [make_candidate()],
        policy=VERIFYING,
        verdicts={"sc-1": 0.3},
        check=lambda d: d.verified == 0.3,
    ),
    Case(
        Reason.VALIDATION_FAILED,
        Status.MISS,
        # the constraints are the request's entities: its tags, read from the normalised turns
        [
            make_candidate(
                record=make_record("give me 5 tips for packing", entities=FIVE_TIPS, key_facts=KeyFacts(list_items=3))
            )
        ],
        sig=make_sig("give me 5 tips for packing", entities=FIVE_TIPS),
        check=lambda d: d.failed_checks == ("count:3!=5",),
    ),
    Case(Reason.ACCEPT, Status.HIT, [make_candidate()], check=lambda d: d.verified is None),
    # in the candidate zone by cosine, served on the verifier's word
    Case(
        Reason.VERIFIED,
        Status.HIT,
        [make_candidate(0.85)],
        policy=VERIFYING,
        verdicts={"sc-1": 0.9},
        check=lambda d: d.verified == 0.9,
    ),
    Case(
        Reason.EXACT_REPEAT,
        Status.HIT,
        [make_candidate(record=make_record(request_hash="req"))],
        policy=VERIFYING,
        check=lambda d: d.verified is None,
    ),
    Case(
        Reason.ASKED_AGAIN,
        Status.HALF_HIT,
        # the previous turn in its own words right after its answer: the user wants another
        [make_candidate(0.99, make_record("Can you give me an example?"), same_session=True, turn_gap=1)],
        sig=make_sig("can you give me an example", question_raw="Can you give me an example?", history_key="h|example"),
    ),
    Case(
        Reason.OTHER_NAMES,
        Status.HALF_HIT,
        # names no gazetteer holds: the vectors of the two trips are near
        [make_candidate(0.97, make_record("Is it better to take the train or fly from Mexico City to Marrakech?"))],
        sig=make_sig(
            "what's the smarter way to get from mexico city to prague, flying or the train",
            question_raw="What's the smarter way to get from Mexico City to Prague, flying or the train?",
        ),
    ),
    Case(
        Reason.OTHER_LANGUAGE,
        Status.HALF_HIT,
        # the same request to a multilingual reader, but its answer is in English
        [make_candidate(0.97, make_record("Recommend a good comedy for a movie night."))],
        sig=make_sig("推荐一部好看的喜剧电影", question_raw="推荐一部好看的喜剧电影"),
    ),
    Case(
        Reason.OTHER_OPERATORS,
        Status.HALF_HIT,
        # one sentence to the embedding: only the operators differ
        [make_candidate(0.98, make_record("What is the difference between '-' and '-=' in C++?"))],
        sig=make_sig(
            "what is the difference between == and = in c++",
            question_raw="What is the difference between == and = in C++?",
        ),
    ),
    Case(
        Reason.COURTESY_VARIANT,
        Status.HIT,
        # below the floor, named another intent, under an intent that serves no judged hit: none
        # of it reads a request that only dropped its framing
        [make_candidate(0.5, make_record("Why do cats purr?", intent="chitchat"), same_session=True, turn_gap=0)],
        sig=make_sig("quick question: why do cats purr", question_raw="Quick question: why do cats purr?"),
        policy=make_policy(direct_hit=False),
        check=lambda d: d.stage == "hit" and d.record is not None and d.record.cache_id == "sc-1",
    ),
    Case(
        Reason.RESTATEMENT,
        Status.HIT,
        [make_candidate(0.5, record=make_record("Five days."), same_session=True, turn_gap=1)],
        sig=make_sig(
            "I need a packing list for a five day ski trip",
            restated_answer="Hold the reset button for ten seconds.",
            previous_question="Five days.",
        ),
        policy=make_policy(restatement=True),
    ),
    # below the candidate floor by cosine; the verifier reads the turn as the previous one asked again
    Case(
        Reason.VERIFIED_PREVIOUS,
        Status.HIT,
        [make_candidate(0.5, record=make_record("Five days."), same_session=True, turn_gap=1)],
        sig=make_sig(
            "I need a packing list for a five day ski trip",
            previous_reply_head="Hold the reset button for ten seconds.",
        ),
        policy=make_policy(verify_previous=0.9),
        verdicts={"sc-1": 0.95},
        check=lambda d: d.verified == 0.95 and d.score == 0.5,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.reason.name for c in CASES])
def test_decide_exits(case: Case) -> None:
    d = case.run()
    assert (d.status, d.reason) == (case.status, case.reason)
    assert d.stage in {s.__name__ for s in STAGES} | {"hit"}
    assert case.check(d)


def test_every_reason_has_a_case() -> None:
    covered = {c.reason for c in CASES}
    assert covered.isdisjoint(PLAN_REASONS)
    assert covered | PLAN_REASONS == set(Reason), set(Reason) - covered - PLAN_REASONS


def test_the_stage_that_decided_is_named() -> None:
    by_reason = {c.reason: c.run().stage for c in CASES}
    assert by_reason[Reason.FILTERED_INTENT] == "hard_filters"
    assert by_reason[Reason.CANDIDATE_ZONE] == "accept_zone"
    assert by_reason[Reason.VERIFIER_REJECTED] == "verification"
    assert by_reason[Reason.VALIDATION_FAILED] == "answer_validation"
    assert by_reason[Reason.ACCEPT] == by_reason[Reason.VERIFIED] == "hit"


# one request read either side of a boundary the exemplars draw: "I forgot my password, how can I
# reset it?" left unsure, and so general, against "How do I reset my password?" (benchmarks/bench_filters.py)
NEIGHBOURLY = make_policy(neighbours=frozenset({"general"}))


def test_a_record_of_a_neighbouring_intent_is_judged_as_one_of_the_requests_own() -> None:
    record = make_record(intent="general")
    assert decide([make_candidate(record=record)], make_sig(), make_policy()).reason is Reason.FILTERED_INTENT
    served = decide([make_candidate(record=record)], make_sig(), NEIGHBOURLY)
    # nor is it another topic to change detection
    assert (served.status, served.reason, served.signals) == (Status.HIT, Reason.ACCEPT, ())
    gray = decide([make_candidate(0.85, record)], make_sig(), NEIGHBOURLY)
    assert (gray.status, gray.reason) == (Status.HALF_HIT, Reason.CANDIDATE_ZONE)


@pytest.mark.parametrize(
    ("why", "record", "sig"),
    [
        ("another intent than the neighbour", make_record(intent="refund"), make_sig()),
        ("conflicting entities", make_record(intent="general", entities=BERGEN), make_sig(entities=OSLO)),
    ],
)
def test_a_neighbouring_intents_record_meets_every_other_filter(why: str, record: Record, sig: Signature) -> None:
    decision = decide([make_candidate(record=record)], sig, NEIGHBOURLY)
    assert (decision.status, decision.stage) == (Status.MISS, "hard_filters"), why


def test_the_best_surviving_candidate_is_judged() -> None:
    weak, strong = (
        make_candidate(0.85, make_record(cache_id="weak")),
        make_candidate(0.95, make_record(cache_id="strong")),
    )
    other = make_candidate(0.99, make_record(cache_id="other", intent="travel"))
    d = decide([weak, other, strong], make_sig(), make_policy())
    assert (d.reason, d.record and d.record.cache_id) == (Reason.ACCEPT, "strong")


def test_without_verify_accept_the_verdicts_change_nothing() -> None:
    for case in CASES:
        if case.policy.verify_accept is None and case.policy.verify_previous is None:
            judged = dataclasses.replace(case, verdicts={"sc-1": 0.0}).run()
            assert (judged.status, judged.reason) == (case.status, case.reason)


@pytest.mark.parametrize(
    ("case", "asked"),
    [
        (Case(Reason.VERIFIED, Status.HIT, [make_candidate(0.85)], policy=VERIFYING), ["sc-1"]),
        # decided before verification, or never verified: nothing to ask
        (Case(Reason.BELOW_CANDIDATE, Status.MISS, [make_candidate(0.7)], policy=VERIFYING), []),
        (
            Case(
                Reason.CONTEXT_MOVED, Status.HALF_HIT, [make_candidate(same_session=True, turn_gap=2)], policy=VERIFYING
            ),
            [],
        ),
        (
            Case(
                Reason.EXACT_REPEAT,
                Status.HIT,
                [make_candidate(record=make_record(request_hash="req"))],
                policy=VERIFYING,
            ),
            [],
        ),
        (
            Case(
                Reason.NO_DIRECT_HIT,
                Status.HALF_HIT,
                [make_candidate()],
                policy=dataclasses.replace(VERIFYING, direct_hit=False),
            ),
            [],
        ),
        (Case(Reason.ACCEPT, Status.HIT, [make_candidate()]), []),
    ],
)
def test_candidates_to_verify_are_those_the_verification_stage_reads(case: Case, asked: list[str]) -> None:
    chosen = candidates_to_verify(case.candidates, case.sig, case.policy)
    assert [c.record.cache_id for c in chosen] == asked
    verdicts = {cid: 0.99 for cid in asked}
    assert dataclasses.replace(case, verdicts=verdicts).run().reason is case.reason


def ctx(candidates: list[Candidate], policy: IntentPolicy, **verdicts: float) -> DecisionContext:
    return DecisionContext(candidates, make_sig(), policy, verdicts)


@pytest.mark.parametrize(
    ("stage", "context", "expected"),
    [
        (hard_filters, ctx([make_candidate()], make_policy()), None),
        (hard_filters, ctx([], make_policy()), Reason.NO_CANDIDATE),
        (accept_zone, ctx([make_candidate(0.85)], make_policy()), Reason.CANDIDATE_ZONE),
        (accept_zone, ctx([make_candidate(0.85)], VERIFYING), None),  # the verifier decides instead
        (accept_zone, ctx([make_candidate(0.95)], make_policy()), None),
        (verification, ctx([make_candidate(0.85)], make_policy()), None),
        (verification, ctx([make_candidate(0.85)], VERIFYING, **{"sc-1": 0.8}), None),  # at the bound: accepted
        (verification, ctx([make_candidate(0.85)], VERIFYING, **{"sc-1": 0.79}), Reason.VERIFIER_REJECTED),
    ],
)
def test_stages_alone(
    stage: Callable[[DecisionContext], Decision | None], context: DecisionContext, expected: Reason | None
) -> None:
    decision = stage(context)
    assert (decision.reason if decision else None) == expected


def test_another_conversations_answer_is_judged_only_after_the_same_user_turns() -> None:
    """Across sessions the user turns so far must agree (case, spacing and punctuation aside);
    within the session the record's history is this conversation's own. A record from before the
    tag was kept is taken as another history."""
    sig = make_sig(history_key="h1")
    assert decide([make_candidate(record=make_record(history="h1"))], sig, make_policy()).reason is Reason.ACCEPT
    for history in ("h2", "", None):
        d = decide([make_candidate(record=make_record(history=history))], sig, make_policy())
        assert (d.status, d.reason) == (Status.HALF_HIT, Reason.OTHER_HISTORY)
    own = make_candidate(record=make_record(history="h2"), same_session=True, turn_gap=1)
    assert decide([own], sig, make_policy()).reason is Reason.ACCEPT


ASKED_AGAIN = "I need a packing list for a five day ski trip"
SEEN = "Hold the reset button for ten seconds."


def previous_turn(score: float = 0.5, **record: Any) -> Candidate:
    return make_candidate(
        score, record=make_record(record.pop("question", "Five days."), **record), same_session=True, turn_gap=1
    )


def test_the_previous_turn_below_its_level_is_judged_as_any_other_candidate() -> None:
    sig = make_sig(ASKED_AGAIN, previous_reply_head=SEEN)
    policy = make_policy(verify_previous=0.9)
    assert decide([previous_turn()], sig, policy, verdicts={"sc-1": 0.89}).reason is Reason.BELOW_CANDIDATE
    assert decide([previous_turn()], sig, policy).reason is Reason.BELOW_CANDIDATE  # verifier unavailable


def test_only_the_record_holding_the_answer_the_user_saw_is_asked_about() -> None:
    """A derived session id can join two conversations that opened alike: the previous turn's
    record must hold the reply this conversation carries."""
    policy = make_policy(verify_previous=0.9)
    cand = previous_turn()
    assert [
        c.record.cache_id for c in candidates_to_verify([cand], make_sig(ASKED_AGAIN, previous_reply_head=SEEN), policy)
    ] == ["sc-1"]
    other = make_sig(ASKED_AGAIN, previous_reply_head="Unplug it for a minute.")
    assert candidates_to_verify([cand], other, policy) == []
    assert decide([cand], other, policy, verdicts={"sc-1": 0.99}).reason is Reason.BELOW_CANDIDATE
    for not_previous in (make_candidate(0.5, same_session=True, turn_gap=2), make_candidate(0.5)):
        assert candidates_to_verify([not_previous], make_sig(ASKED_AGAIN, previous_reply_head=SEEN), policy) == []


def test_the_previous_turn_asked_again_still_meets_every_later_net() -> None:
    policy = make_policy(verify_previous=0.9)
    sig = make_sig("cheap flights from paris to rome", previous_reply_head=SEEN)
    swapped = previous_turn(question="cheap flights from rome to paris")
    assert decide([swapped], sig, policy, verdicts={"sc-1": 0.99}).reason is Reason.REORDERED_WORDS
    conflicting = previous_turn(entities=BERGEN)
    d = decide(
        [conflicting], make_sig(ASKED_AGAIN, entities=OSLO, previous_reply_head=SEEN), policy, verdicts={"sc-1": 0.99}
    )
    assert d.reason is Reason.FILTERED_ENTITIES
    short = previous_turn(question="give me 5 tips for packing", key_facts=KeyFacts(list_items=3), entities=FIVE_TIPS)
    sig = make_sig("give me 5 tips for packing", entities=FIVE_TIPS, previous_reply_head=SEEN)
    assert decide([short], sig, policy, verdicts={"sc-1": 0.99}).reason is Reason.VALIDATION_FAILED


def test_a_restatement_its_words_show_is_not_asked_about() -> None:
    policy = make_policy(verify_previous=0.9, restatement=True)
    sig = make_sig(ASKED_AGAIN, previous_reply_head=SEEN, restated_answer=SEEN, previous_question="Five days.")
    assert candidates_to_verify([previous_turn()], sig, policy) == []
    assert decide([previous_turn()], sig, policy).reason is Reason.RESTATEMENT


def test_a_restatement_is_served_only_the_record_of_the_turn_it_restates() -> None:
    """The record must be the restated turn's own: asked in its words (as written, spaces aside)
    and holding the answer the user saw. The record of another turn with the same answer ("great",
    answered alike) is judged by similarity, where it is far below the floor."""
    policy = make_policy(restatement=True)
    sig = make_sig(ASKED_AGAIN, restated_answer=SEEN, previous_question="Five  days.")
    assert decide([previous_turn()], sig, policy).reason is Reason.RESTATEMENT
    d = decide([previous_turn(question="great")], sig, policy)
    assert (d.status, d.reason) == (Status.MISS, Reason.BELOW_CANDIDATE)
    d = decide([previous_turn(question="great"), previous_turn(cache_id="own")], sig, policy)
    assert (d.reason, d.record and d.record.cache_id) == (Reason.RESTATEMENT, "own")


def test_both_levels_ask_about_the_previous_turn_and_the_best_candidate_once_each() -> None:
    policy = make_policy(verify_previous=0.9, verify_accept=0.8)
    best = make_candidate(0.95, make_record(cache_id="best"))
    sig = make_sig(ASKED_AGAIN, previous_reply_head=SEEN)
    assert [c.record.cache_id for c in candidates_to_verify([previous_turn(), best], sig, policy)] == ["sc-1", "best"]
    # the previous turn asked again is served at its own level, not at verify_accept
    d = decide([previous_turn(), best], sig, policy, verdicts={"sc-1": 0.92, "best": 0.1})
    assert (d.reason, d.record and d.record.cache_id) == (Reason.VERIFIED_PREVIOUS, "sc-1")
    d = decide([previous_turn(), best], sig, policy, verdicts={"sc-1": 0.2, "best": 0.85})
    assert (d.reason, d.record and d.record.cache_id) == (Reason.VERIFIED, "best")


def test_a_turn_leaning_on_another_reply_is_not_the_previous_turn_asked_again() -> None:
    """ "Yes please." twice: the second says yes to another offer, whatever the verifier read."""
    policy = make_policy(verify_previous=0.9)
    offer = previous_turn(
        question="yes please", previous_reply="no starbucks nearby, directions to another coffee shop?"
    )
    sig = make_sig("yes please", previous_reply="coupa is 6 miles away, would you like directions?",
                   previous_reply_head=SEEN)  # fmt: skip
    d = decide([offer], sig, policy, verdicts={"sc-1": 0.99})
    assert (d.status, d.reason) == (Status.HALF_HIT, Reason.CONTEXT_DIFFERS)


REPEAT = make_record(request_hash="req", cache_id="sc-repeat", answer="the answer this conversation got")


@pytest.mark.parametrize(
    ("sig", "record", "other_reason"),
    [
        # the record holds no entity the request names: another record is a modification
        (make_sig(entities=OSLO), REPEAT, "modifies_context"),
        (
            make_sig(),
            dataclasses.replace(REPEAT, coarse_tags=dataclasses.replace(REPEAT.coarse_tags, history="h-o")),
            "other_history",
        ),
        (
            make_sig("where is it?", previous_reply="you can pay by card or in cash"),
            make_record("where is it?", request_hash="req", previous_reply="the museum opens at nine"),
            "context_differs",
        ),
    ],
    ids=["modifies", "other-history", "context-differs"],
)
def test_an_exact_repeat_is_judged_on_its_answer_alone(sig: Signature, record: Record, other_reason: str) -> None:
    """The same conversation byte for byte: what change detection and the lexical guards read in
    the words is the conversation itself, not a difference from it (a record's tags can disagree
    with a request's only when written by an older tagger)."""
    policy = make_policy(accept=0.999)
    served = decide([make_candidate(0.995, record=record)], sig, policy)
    assert (served.status, served.reason, served.stage) == (Status.HIT, Reason.EXACT_REPEAT, "hit")
    other = decide([make_candidate(0.995, record=dataclasses.replace(record, request_hash="other"))], sig, policy)
    assert (other.status, other.summary) != (Status.HIT, "exact_repeat")
    assert other.reason == other_reason


def test_the_exact_repeat_comes_before_a_nearer_candidate_and_still_meets_answer_validation() -> None:
    near = make_candidate(1.0, record=make_record(cache_id="sc-near"))
    repeat = make_candidate(0.991, record=REPEAT)
    d = decide([near, repeat], make_sig(), make_policy())
    assert (d.status, d.reason, d.record and d.record.cache_id) == (Status.HIT, Reason.EXACT_REPEAT, "sc-repeat")
    three = make_record(
        "give me 5 tips for packing", request_hash="req", entities=FIVE_TIPS, key_facts=KeyFacts(list_items=3)
    )
    d = decide(
        [make_candidate(record=three, same_session=True, turn_gap=0)],
        make_sig("give me 5 tips for packing", entities=FIVE_TIPS),
        make_policy(),
    )
    assert (d.status, d.reason) == (Status.MISS, Reason.VALIDATION_FAILED)


def _near_miss_and_paraphrase() -> list[Candidate]:
    near = make_candidate(0.93, make_record("how do I reset my office router", cache_id="near"))
    para = make_candidate(0.88, make_record("what are the steps to reset a router", cache_id="para"))
    far = make_candidate(0.86, make_record("how do I reset a router", cache_id="far"))
    return [near, para, far]


def test_the_verifier_reads_the_nearest_few_and_serves_the_one_it_accepts() -> None:
    cands = _near_miss_and_paraphrase()
    asked = candidates_to_verify(cands, make_sig(), VERIFYING)
    assert [c.record.cache_id for c in asked] == ["near", "para", "far"]
    d = decide(cands, make_sig(), VERIFYING, verdicts={"near": 0.2, "para": 0.95, "far": 0.85})
    assert (d.status, d.reason, d.record and d.record.cache_id) == (Status.HIT, Reason.VERIFIED, "para")
    assert d.verified == 0.95


def test_the_alternates_are_read_only_when_the_first_round_accepts_none() -> None:
    cands = _near_miss_and_paraphrase()
    rounds = verification_rounds(DecisionContext(cands, make_sig(), VERIFYING))
    assert [c.record.cache_id for c in rounds.first] == ["near"]
    assert [c.record.cache_id for c in rounds.then] == ["para", "far"]
    assert rounds.settled({"near": 0.95})
    assert not rounds.settled({"near": 0.2}) and not rounds.settled({})
    both = make_policy(verify_previous=0.9, verify_accept=0.8)
    best = make_candidate(0.95, make_record(cache_id="best"))
    sig = make_sig(ASKED_AGAIN, previous_reply_head=SEEN)
    rounds = verification_rounds(DecisionContext([previous_turn(), best], sig, both))
    assert [c.record.cache_id for c in rounds.first] == ["sc-1", "best"] and rounds.then == []
    # each at its own level: the previous turn at verify_previous, the best at verify_accept
    assert not rounds.settled({"sc-1": 0.85, "best": 0.1}) and rounds.settled({"sc-1": 0.1, "best": 0.85})


def test_one_context_judges_each_candidate_once_around_the_verifier(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stages that chose what to verify are not run again once the verdicts come back."""
    calls: Counter[str] = Counter()
    for name in ("detect_change", "reordered"):
        real = getattr(context_module, name)
        monkeypatch.setattr(context_module, name, _counting(real, name, calls))
    cands = _near_miss_and_paraphrase()
    ctx = DecisionContext(cands, make_sig(), VERIFYING)
    rounds = verification_rounds(ctx)
    assert [c.record.cache_id for c in [*rounds.first, *rounds.then]] == ["near", "para", "far"]
    judged = dict(calls)
    d = decide_in(ctx.with_verdicts({"near": 0.2, "para": 0.95, "far": 0.85}))
    assert (d.status, d.reason, d.record and d.record.cache_id) == (Status.HIT, Reason.VERIFIED, "para")
    assert calls == judged == {"detect_change": 3, "reordered": 3}
    # the same decision as from scratch
    assert d == decide(cands, make_sig(), VERIFYING, verdicts={"near": 0.2, "para": 0.95, "far": 0.85})


def _counting(real: Callable[..., Any], name: str, calls: Counter[str]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    return counted


def test_verify_top_bounds_the_reading_and_no_accepted_alternate_keeps_the_first_verdict() -> None:
    cands = _near_miss_and_paraphrase()
    one = dataclasses.replace(VERIFYING, verify_top=1)
    assert [c.record.cache_id for c in candidates_to_verify(cands, make_sig(), one)] == ["near"]
    d = decide(cands, make_sig(), one, verdicts={"near": 0.2, "para": 0.95})
    assert (d.reason, d.record and d.record.cache_id) == (Reason.VERIFIER_REJECTED, "near")
    rejected = decide(cands, make_sig(), VERIFYING, verdicts={"near": 0.2, "para": 0.5, "far": 0.1})
    assert (rejected.reason, rejected.record and rejected.record.cache_id) == (Reason.VERIFIER_REJECTED, "near")


def test_an_alternate_still_passes_every_net_of_its_own() -> None:
    near = make_candidate(0.93, make_record(cache_id="near"))
    moved = make_candidate(0.9, make_record(cache_id="moved"), same_session=True, turn_gap=3)
    below = make_candidate(0.7, make_record(cache_id="below"))
    assert [c.record.cache_id for c in candidates_to_verify([near, moved, below], make_sig(), VERIFYING)] == ["near"]
    d = decide([near, moved, below], make_sig(), VERIFYING, verdicts={"near": 0.1, "moved": 0.99, "below": 0.99})
    assert (d.reason, d.record and d.record.cache_id) == (Reason.VERIFIER_REJECTED, "near")


def test_without_verify_accept_no_alternate_is_read() -> None:
    cands = _near_miss_and_paraphrase()
    d = decide(cands, make_sig(), make_policy(accept=0.95), verdicts={"para": 0.99})
    assert (d.reason, d.record and d.record.cache_id) == (Reason.CANDIDATE_ZONE, "near")


def test_the_count_a_request_asks_for_is_checked_whatever_the_intents_validate_list() -> None:
    """Issue 38.5: chitchat validates nothing, and 'List 5 tips' was served a 3-item answer."""
    record = make_record("give me 5 tips for packing", entities=FIVE_TIPS, key_facts=KeyFacts(list_items=3))
    sig = make_sig("give me 5 tips for packing", entities=FIVE_TIPS)
    d = decide([make_candidate(record=record)], sig, make_policy(validate=()))
    assert (d.status, d.reason, d.failed_checks) == (Status.MISS, Reason.VALIDATION_FAILED, ("count:3!=5",))


def test_a_loose_reordering_is_the_verifiers_to_judge_but_an_exchange_stays_a_guard() -> None:
    sig = make_sig("how do I reset my account password")
    reworded = make_candidate(0.9, make_record("what are the steps to reset the password of my account"))
    assert decide([reworded], sig, make_policy(accept=0.85)).reason is Reason.REORDERED_WORDS
    assert [c.record.cache_id for c in candidates_to_verify([reworded], sig, VERIFYING)] == ["sc-1"]
    assert decide([reworded], sig, VERIFYING, verdicts={"sc-1": 0.95}).reason is Reason.VERIFIED
    swapped = make_candidate(0.97, make_record("flights from Oslo to Bergen"))
    swapped_sig = make_sig("flights from Bergen to Oslo")
    assert candidates_to_verify([swapped], swapped_sig, VERIFYING) == []
    assert decide([swapped], swapped_sig, VERIFYING, verdicts={"sc-1": 0.99}).reason is Reason.REORDERED_WORDS


def test_nothing_to_verify_when_no_candidate_survives_the_hard_filters() -> None:
    other = make_candidate(0.95, make_record(intent="travel"))
    assert candidates_to_verify([other], make_sig(), VERIFYING) == []
    assert candidates_to_verify([], make_sig(), VERIFYING) == []


COURTEOUS = make_sig("quick question: why do cats purr", question_raw="Quick question: why do cats purr?")


@pytest.mark.parametrize(
    ("sig", "record"),
    [
        # one word more than framing
        (COURTEOUS, make_record("Why do dogs purr?")),
        # case is not framing: \S is not \s
        (make_sig("what does \\s match", question_raw="What does \\S match?"), make_record("What does \\s match?")),
        # after other turns, or another reply
        (COURTEOUS, make_record("Why do cats purr?", history="h-other")),
        (COURTEOUS, make_record("Why do cats purr?", previous_reply="cats are mammals")),
        # a turn the verifier's side cut short may differ past the cut
        (
            make_sig("x", question_raw="Quick question: " + "why do cats purr " * 12),
            make_record("why do cats purr " * 12),
        ),
    ],
    ids=["other-word", "case", "other-history", "other-reply", "cut-short"],
)
def test_only_framing_makes_a_courtesy_variant(sig: Signature, record: Record) -> None:
    d = decide([make_candidate(0.5, record, same_session=True, turn_gap=0)], sig, make_policy(direct_hit=False))
    assert d.reason is not Reason.COURTESY_VARIANT and d.status is not Status.HIT, d


def test_a_courtesy_variant_is_an_edit_in_its_own_session_not_another_sessions_opening() -> None:
    record = make_record("Hello, I am looking for a restaurant that serves international food.")
    sig = make_sig(
        "i am looking for a restaurant that serves international food",
        question_raw="I am looking for a restaurant that serves international food!",
    )
    edited = decide([make_candidate(0.5, record, same_session=True, turn_gap=0)], sig, make_policy())
    assert (edited.status, edited.reason) == (Status.HIT, Reason.COURTESY_VARIANT)
    # another user's opening, framed otherwise, got an answer that took its own conversation on
    other = decide([make_candidate(0.5, record)], sig, make_policy())
    assert (other.status, other.reason) == (Status.MISS, Reason.BELOW_CANDIDATE)


def test_a_courtesy_variant_comes_before_a_nearer_candidate_and_still_meets_answer_validation() -> None:
    near = make_candidate(0.99, record=make_record("why do cats meow", cache_id="sc-near"))
    variant = make_candidate(
        0.9, make_record("Why do cats purr?", cache_id="sc-variant"), same_session=True, turn_gap=0
    )
    d = decide([near, variant], COURTEOUS, make_policy())
    assert (d.reason, d.record and d.record.cache_id) == (Reason.COURTESY_VARIANT, "sc-variant")
    three = make_record("Give me 5 tips for packing", entities=FIVE_TIPS, key_facts=KeyFacts(list_items=3))
    sig = make_sig("give me 5 tips for packing, thanks", question_raw="Give me 5 tips for packing, thanks!")
    d = decide(
        [make_candidate(record=three, same_session=True, turn_gap=0)],
        dataclasses.replace(sig, tags=dataclasses.replace(sig.tags, entities=FIVE_TIPS)),
        make_policy(),
    )
    assert (d.status, d.reason) == (Status.MISS, Reason.VALIDATION_FAILED)


def test_an_exact_repeat_is_served_where_the_intent_serves_no_judged_hit() -> None:
    d = decide([make_candidate(record=REPEAT)], make_sig(), make_policy(direct_hit=False))
    assert (d.status, d.reason) == (Status.HIT, Reason.EXACT_REPEAT)


def test_widen_by_judge_still_serves_the_sessions_own_records_and_exact_repeats() -> None:
    judged_across = make_policy(widen_by="judge")
    own = decide([make_candidate(same_session=True, turn_gap=1)], make_sig(), judged_across)
    assert (own.status, own.reason) == (Status.HIT, Reason.ACCEPT)
    repeat = make_candidate(1.0, make_record(request_hash="req"))
    d = decide([repeat], make_sig(request_hash="req"), judged_across)
    assert (d.status, d.reason) == (Status.HIT, Reason.EXACT_REPEAT)
