"""ask_judge and judged: which candidates reach the model judge, and the decision it resumes.
Hand-built candidates, no model, no network."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.core.decision.decide import DecisionContext, decide
from proxy.core.decision.judging import ask_judge, judged, ranked_by_verifier
from proxy.core.model import Candidate, KeyFacts, Reason, Record, RecordTags, Signature, Status
from proxy.core.policy import IntentPolicy
from proxy.core.text.entities import Entities, NumericConstraint
from tests.core.decision.test_decide import FIVE_TIPS, make_candidate, make_policy, make_record, make_sig

JUDGING = make_policy(judge="race", judge_top=2, judge_floor=0.6)
# "how do I reset my home router" against a record of another wording, in the gray zone
GRAY = 0.75


def ask_ids(
    cands: list[Candidate],
    *,
    policy: IntentPolicy = JUDGING,
    sig: Signature | None = None,
    refused: frozenset[str] = frozenset(),
) -> list[str]:
    sig = sig or make_sig()
    decision = decide(cands, sig, policy)
    return [
        c.record.cache_id for c in ask_judge(DecisionContext(cands, sig, policy), decision, refused=refused).candidates
    ]


def test_the_gray_zone_is_asked_best_first_up_to_judge_top() -> None:
    cands = [make_candidate(s, make_record(cache_id=f"sc-{i}")) for i, s in enumerate((0.7, 0.85, 0.65, 0.8))]
    assert ask_ids(cands) == ["sc-1", "sc-3"]


@pytest.mark.parametrize(
    ("why", "candidate", "policy"),
    [
        ("below the judge's floor", make_candidate(0.55), JUDGING),
        ("judging off", make_candidate(GRAY), make_policy()),
        (
            "direct_hit false serves exact repeats only",
            make_candidate(GRAY),
            dataclasses.replace(JUDGING, direct_hit=False),
        ),
        ("never-cached intent", make_candidate(GRAY), dataclasses.replace(JUDGING, cache=False)),
        ("another intent", make_candidate(GRAY, make_record(intent="billing")), JUDGING),
        (
            "conflicting entities",
            make_candidate(GRAY, make_record(entities=Entities(places=frozenset({"杭州"})))),
            JUDGING,
        ),
        (
            "an alias is never judged for another wording",
            make_candidate(GRAY, make_record(cache_id="sc-a")),
            "alias",
        ),
    ],
)
def test_what_never_reaches_the_judge(why: str, candidate: Candidate, policy: IntentPolicy | str) -> None:
    sig = make_sig()
    if isinstance(policy, str):
        rec = candidate.record
        candidate = dataclasses.replace(
            candidate,
            record=dataclasses.replace(rec, coarse_tags=dataclasses.replace(rec.coarse_tags, alias_of="sc-9")),
        )
        policy = JUDGING
    assert isinstance(policy, IntentPolicy)
    if why == "conflicting entities":
        sig = make_sig(entities=Entities(places=frozenset({"苏州"})))
    assert ask_ids([candidate], policy=policy, sig=sig) == [], why


def test_a_neighbouring_intents_record_in_the_gray_zone_is_the_judges_to_read() -> None:
    cand = make_candidate(GRAY, make_record(intent="general"))
    assert ask_ids([cand]) == []
    assert ask_ids([cand], policy=dataclasses.replace(JUDGING, neighbours=frozenset({"general"}))) == ["sc-1"]


def test_a_record_the_judge_refused_for_this_wording_is_not_asked_again() -> None:
    cands = [make_candidate(0.8, make_record(cache_id="sc-1")), make_candidate(0.7, make_record(cache_id="sc-2"))]
    assert ask_ids(cands, refused=frozenset({"sc-1"})) == ["sc-2"]


def test_answer_validation_stands_before_the_judge() -> None:
    sig = make_sig("give me 5 tips for packing", entities=FIVE_TIPS)
    three = make_record("give me 5 tips for packing", entities=FIVE_TIPS, key_facts=KeyFacts(list_items=3))
    five = make_record("give me 5 tips for packing", entities=FIVE_TIPS, key_facts=KeyFacts(list_items=5))
    assert ask_ids([make_candidate(GRAY, three)], sig=sig) == []
    assert ask_ids([make_candidate(GRAY, five)], sig=sig) == ["sc-1"]


def test_a_hit_asks_nothing() -> None:
    assert ask_ids([make_candidate(0.97)]) == []


def test_judged_serves_the_first_yes_in_order() -> None:
    cands = [make_candidate(0.8, make_record(cache_id="sc-1")), make_candidate(0.7, make_record(cache_id="sc-2"))]
    sig = make_sig()
    ask = ask_judge(DecisionContext(cands, sig, JUDGING), decide(cands, sig, JUDGING))
    served = judged(ask, {"sc-1": False, "sc-2": True})
    assert (served.status, served.reason, served.record and served.record.cache_id) == (
        Status.HIT,
        Reason.JUDGED,
        "sc-2",
    )
    refused = judged(ask, {"sc-1": False, "sc-2": False})
    assert (refused.status, refused.reason) == (Status.HALF_HIT, Reason.JUDGE_REFUSED)
    late = judged(ask, {"sc-1": False}, late=True)
    assert (late.status, late.reason) == (Status.HALF_HIT, Reason.JUDGE_LATE)


def test_a_learned_yes_serves_as_learned_and_an_audited_yes_is_forwarded() -> None:
    cands = [make_candidate(0.8, make_record(cache_id="sc-1")), make_candidate(0.7, make_record(cache_id="sc-2"))]
    sig = make_sig()
    ask = ask_judge(DecisionContext(cands, sig, JUDGING), decide(cands, sig, JUDGING))
    learned = judged(ask, {"sc-1": True}, learned={"sc-1"})
    assert (learned.status, learned.reason, learned.stage) == (Status.HIT, Reason.LEARNED, "judge")
    audited = judged(ask, {"sc-1": True}, audited={"sc-1"})
    assert (audited.status, audited.reason) == (Status.HALF_HIT, Reason.JUDGE_AUDIT)
    # the first yes ends it: an audited one is not passed over for the next candidate's yes
    assert judged(ask, {"sc-1": True, "sc-2": True}, audited={"sc-1"}).reason is Reason.JUDGE_AUDIT


def test_the_alias_tag_survives_the_store_round_trip() -> None:
    tags = RecordTags(alias_of="sc-7")
    assert RecordTags.from_json(tags.to_json()).alias_of == "sc-7"
    assert RecordTags.from_json(RecordTags().to_json()).alias_of is None


def test_the_verifier_ranks_and_filters_what_the_judge_reads() -> None:
    policy = dataclasses.replace(JUDGING, judge_verify=0.9, verify_top=4, judge_top=2)
    cands = [make_candidate(s, make_record(cache_id=f"sc-{i}")) for i, s in enumerate((0.85, 0.8, 0.75, 0.7))]
    sig = make_sig()
    ask = ask_judge(DecisionContext(cands, sig, policy), decide(cands, sig, policy))
    assert len(ask.candidates) == 4  # the verifier reads verify_top of them
    ranked = ranked_by_verifier(ask, {"sc-0": 0.5, "sc-1": 0.93, "sc-2": 0.99, "sc-3": 0.95}, policy)
    assert [c.record.cache_id for c in ranked.candidates] == ["sc-2", "sc-3"]
    # unscored (the verifier busy or failed): nothing is worth a call
    assert not ranked_by_verifier(ask, {}, policy)


def test_a_near_question_reaches_the_judge_after_those_the_verifier_admitted() -> None:
    """``judge_near``: a rewording the verifier reads as another question still goes to the judge
    where the current turns are that near, behind every candidate the verifier admitted; one the
    verifier did not score never does."""
    policy = dataclasses.replace(JUDGING, judge_verify=0.5, judge_near=0.85, verify_top=4, judge_top=2)
    sims = (0.9, 0.8, 0.95, 0.6)  # the current turns' similarity
    cands = [Candidate(make_record(cache_id=f"sc-{i}"), 0.8, q) for i, q in enumerate(sims)]
    sig = make_sig()
    ask = ask_judge(DecisionContext(cands, sig, policy), decide(cands, sig, policy))
    assert len(ask.candidates) == 4
    ranked = ranked_by_verifier(ask, {"sc-0": 0.04, "sc-1": 0.1, "sc-2": 0.3, "sc-3": 0.7}, policy)
    # sc-3 admitted by the verifier first; then the near ones in the verifier's order; sc-1 is not near
    assert [c.record.cache_id for c in ranked.candidates] == ["sc-3", "sc-2"]
    only_near = ranked_by_verifier(ask, {"sc-0": 0.04, "sc-1": 0.1}, policy)
    assert [c.record.cache_id for c in only_near.candidates] == ["sc-0"]
    # without judge_near the verifier's level alone admits
    plain = dataclasses.replace(policy, judge_near=None)
    assert [c.record.cache_id for c in ranked_by_verifier(ask, {"sc-0": 0.04, "sc-3": 0.7}, plain).candidates] == [
        "sc-3"
    ]


def test_a_loose_reordering_is_the_judges_to_read_a_swap_is_not() -> None:
    reworded = make_record("what are the steps to reset the password of my account")
    sig = make_sig("how do I reset my account password")
    assert ask_ids([make_candidate(GRAY, reworded)], sig=sig) == ["sc-1"]
    swapped = make_record("flights from Paris to Rome")
    assert ask_ids([make_candidate(GRAY, swapped)], sig=make_sig("flights from Rome to Paris")) == []


def test_a_turn_leaning_on_another_reply_of_this_conversation_is_the_judges_to_read() -> None:
    # "what is their address" asked again in this session after another reply: the guard keeps
    # the scores from serving it, but the judge reads the whole conversation and so sees whether
    # "their" still names what the answer read
    leaning = "what is their address"
    record = make_record(leaning, previous_reply="Curry Prince serves Indian food in the east.")
    sig = make_sig(leaning, previous_reply="Sure, I booked it for 7 pm.")
    same_session = make_candidate(0.85, record, same_session=True, turn_gap=1)
    assert decide([same_session], sig, JUDGING).reason is Reason.CONTEXT_DIFFERS
    assert ask_ids([same_session], sig=sig) == ["sc-1"]
    # another conversation's answer after other turns is not: the judge never read that history
    tags = dataclasses.replace(record.coarse_tags, history="another")
    other = make_candidate(0.85, dataclasses.replace(record, coarse_tags=tags))
    assert ask_ids([other], sig=sig) == []


def test_a_question_asked_again_after_other_turns_of_this_conversation_is_the_judges_to_read() -> None:
    asked = make_record("I've always wondered why we yawn, can you explain?")
    sig = make_sig("why do we yawn")
    earlier = make_candidate(0.85, asked, same_session=True, turn_gap=3)
    assert decide([earlier], sig, JUDGING).reason is Reason.CONTEXT_MOVED
    assert ask_ids([earlier], sig=sig) == ["sc-1"]


def test_a_question_asked_again_is_held_to_its_own_words_not_to_the_conversations_around_it() -> None:
    # the turns in between pull the conversations' cosine far under the floor; the questions
    # themselves are near, and the judge reads what was said in between
    asked = make_record("I've always wondered why we yawn, can you explain?")
    sig = make_sig("why do we yawn, can you explain?")
    earlier = Candidate(asked, 0.1, 0.8, same_session=True, turn_gap=3)
    assert ask_ids([earlier], sig=sig) == ["sc-1"]
    # not a turn that leans on its context, nor another session's answer
    assert ask_ids([earlier], sig=make_sig("why is that, can you explain?")) == []
    assert ask_ids([dataclasses.replace(earlier, same_session=False, turn_gap=None)], sig=sig) == []
    # the questions themselves must still be near
    assert ask_ids([dataclasses.replace(earlier, question_similarity=0.5)], sig=sig) == []


def test_a_question_asked_again_is_weighed_on_its_own_constraints_not_the_conversations() -> None:
    # a budget another question of the session pinned is in force in the conversation, not in this
    # question, which names what it asks about
    budget = Entities(numbers=(NumericConstraint("budget", 300.0, "USD", "<="),))
    asked = make_record("I've always wondered why we yawn, can you explain?")
    sig = make_sig("why do we yawn, can you explain?", entities=budget)
    earlier = Candidate(asked, 0.1, 0.8, same_session=True, turn_gap=3)
    assert ask_ids([earlier], sig=sig) == ["sc-1"]
    # the previous turn is compared with the conversation's constraints, as every other candidate
    assert ask_ids([dataclasses.replace(earlier, view_similarity=0.8, turn_gap=1)], sig=sig) == []


def test_a_question_asked_again_reaches_the_judge_from_its_own_nearness() -> None:
    """``judge_near_again``: within one conversation a rewording of an earlier question is read by
    the judge from a lower cosine than another user's near wording, or the previous turn's."""
    policy = dataclasses.replace(
        JUDGING, judge_verify=0.5, judge_near=0.85, judge_near_again=0.7, verify_top=4, judge_top=2
    )
    asked = make_record("I've always wondered why we yawn, can you explain?", cache_id="sc-again")
    other = make_record("I've always wondered why we yawn, can you explain?", cache_id="sc-other")
    previous = make_record("I've always wondered why we yawn, can you explain?", cache_id="sc-previous")
    sig = make_sig("what makes people yawn, can you explain?")
    cands = [
        Candidate(asked, 0.3, 0.75, same_session=True, turn_gap=3),
        Candidate(other, 0.75, 0.75),
        Candidate(previous, 0.75, 0.75, same_session=True, turn_gap=1),
    ]
    ask = ask_judge(DecisionContext(cands, sig, policy), decide(cands, sig, policy))
    assert ask.near == {"sc-again": 0.7}
    scores = {"sc-again": 0.1, "sc-other": 0.1, "sc-previous": 0.1}
    assert [c.record.cache_id for c in ranked_by_verifier(ask, scores, policy).candidates] == ["sc-again"]
    unset = dataclasses.replace(policy, judge_near_again=None)
    assert not ranked_by_verifier(
        ask_judge(DecisionContext(cands, sig, unset), decide(cands, sig, unset)), scores, unset
    )


def test_another_conversations_opening_reaches_the_judge_from_its_own_nearness() -> None:
    """``judge_near_opening``: two openings, nothing before either, compared on their turns."""
    policy = dataclasses.replace(
        JUDGING, judge_verify=0.5, judge_near=0.85, judge_near_opening=0.7, verify_top=4, judge_top=2
    )
    opening = dataclasses.replace(
        make_record("I've always wondered why we yawn, can you explain?"),
        coarse_tags=dataclasses.replace(make_record().coarse_tags, question_raw="Why do we yawn at all?", turn=1),
    )
    cands = [Candidate(opening, 0.75, 0.75)]
    scores = {"sc-1": 0.1}
    first = make_sig("what makes people yawn, can you explain?", turn_index=1)
    ask = ask_judge(DecisionContext(cands, first, policy), decide(cands, first, policy))
    assert [c.record.cache_id for c in ranked_by_verifier(ask, scores, policy).candidates] == ["sc-1"]
    # a later turn is not an opening: judge_near holds it
    later = make_sig("what makes people yawn, can you explain?", turn_index=3)
    ask = ask_judge(DecisionContext(cands, later, policy), decide(cands, later, policy))
    assert ask.candidates and not ranked_by_verifier(ask, scores, policy)


def _opening(question: str, cache_id: str = "sc-1") -> Record:
    record = make_record(question, cache_id=cache_id)
    return dataclasses.replace(record, coarse_tags=dataclasses.replace(record.coarse_tags, turn=1))


def test_a_turn_asking_its_frame_about_another_subject_needs_the_verifiers_level() -> None:
    """Nearness admits a rewording the verifier read low, never a slot swapped ("a fun fact about
    koalas" / "...about sharks"): there the judge's false yes gather."""
    policy = dataclasses.replace(JUDGING, judge_verify=0.5, judge_near_opening=0.7, verify_top=4)
    sig = make_sig("tell me a fun fact about sharks", turn_index=1)
    swapped = Candidate(_opening("tell me a fun fact about koalas", "sc-koalas"), 0.8, 0.8)
    reworded = Candidate(_opening("tell me something fun about sharks", "sc-sharks"), 0.75, 0.75)
    ask = ask_judge(DecisionContext([swapped, reworded], sig, policy), decide([swapped, reworded], sig, policy))
    assert ask.swapped == {"sc-koalas"}
    low = {"sc-koalas": 0.1, "sc-sharks": 0.1}
    assert [c.record.cache_id for c in ranked_by_verifier(ask, low, policy).candidates] == ["sc-sharks"]
    # the verifier's own level still admits it: the judge then reads it
    vouched = {"sc-koalas": 0.9, "sc-sharks": 0.1}
    assert [c.record.cache_id for c in ranked_by_verifier(ask, vouched, policy).candidates] == [
        "sc-koalas",
        "sc-sharks",
    ]


def test_a_change_phrase_both_openings_ask_is_not_a_change_of_context() -> None:
    """Two first turns asking the same ("不想要了可以退吗"): the phrase is what both ask, so the
    judge reads the pair; asked after other turns, against another conversation's opening, it is
    still a modification."""
    question = "买的空气炸锅到手30天了，不想要了可以退吗"
    record = _opening(question)
    opening = make_sig(question, question_raw=question, turn_index=1)
    cands = [Candidate(record, 0.75, 0.75)]
    assert ask_ids(cands, sig=opening) == ["sc-1"]
    later = make_sig(question, question_raw=question, turn_index=3)
    assert decide([Candidate(record, 0.85, 0.85)], later, JUDGING).reason is Reason.MODIFIES_CONTEXT
