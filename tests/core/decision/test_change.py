from __future__ import annotations

import pytest

from proxy.core.decision.change import ChangeKind, ChangeVerdict, change_instruction, detect_change
from proxy.core.text.entities import extract_entities, merge_entities
from proxy.core.text.normalize import normalize_text

NO, MOD, NEW = ChangeKind.NO_CHANGE, ChangeKind.MODIFIES_CONTEXT, ChangeKind.NEW_TOPIC


def verdict(context: list[str], turn: str, *, intents: tuple[str, str] = ("x", "x")) -> ChangeVerdict:
    """The candidate answered ``context``; the request is ``context`` plus ``turn``."""
    history = [extract_entities(normalize_text(t)) for t in context]
    candidate = merge_entities(history[:-1], history[-1])
    request = merge_entities(history, extract_entities(normalize_text(turn)))
    return detect_change(
        normalize_text(turn),
        candidate_entities=candidate,
        request_entities=request,
        candidate_intent=intents[0],
        request_intent=intents[1],
    )


LAPTOP = ["帮我推荐一款适合编程的轻薄本，预算八千以内"]
TRIP = ["帮我排一个杭州两天的行程，要住酒店"]
EN_TRIP = ["Plan a 2-day trip to Kyoto with a hotel near the station"]


@pytest.mark.parametrize(
    ("context", "turn", "kind", "signal"),
    [
        pytest.param(LAPTOP, "预算提高到一万，重量再轻一点", MOD, "conflict:budget", id="zh-budget-raise"),
        pytest.param(TRIP, "不要酒店了", MOD, "negation:不要", id="zh-no-hotel"),
        pytest.param(TRIP, "改成三天", MOD, "conflict:duration_days", id="zh-three-days"),
        pytest.param(TRIP, "换成苏州吧", MOD, "conflict:places", id="zh-other-city"),
        pytest.param(TRIP, "再加一个博物馆", MOD, "addition:再加", id="zh-add"),
        pytest.param(TRIP, "去掉第二天的购物", MOD, "negation:去掉", id="zh-remove"),
        pytest.param(TRIP, "补充一下交通方式", MOD, "addition:补充", id="zh-supplement"),
        pytest.param(LAPTOP, "有没有更便宜的", MOD, "modification:更便宜", id="zh-cheaper"),
        pytest.param(LAPTOP, "别推荐游戏本", MOD, "negation:别", id="zh-dont"),
        pytest.param(LAPTOP, "最好是6月20日前能到货", MOD, "new:date", id="zh-new-date"),
        pytest.param(EN_TRIP, "Actually, make it 4 days", MOD, "conflict:duration_days", id="en-four-days"),
        pytest.param(EN_TRIP, "Remove the hotel please", MOD, "negation:remove", id="en-remove"),
        pytest.param(EN_TRIP, "Can you also include a tea ceremony?", MOD, "addition:also", id="en-also"),
        pytest.param(EN_TRIP, "Something cheaper instead", MOD, "modification:instead", id="en-instead"),
        pytest.param(EN_TRIP, "What about Osaka?", MOD, "conflict:places", id="en-other-city"),
        pytest.param(LAPTOP, "那就这样吧，谢谢", NO, None, id="zh-thanks"),
        pytest.param(LAPTOP, "好的，明白了", NO, None, id="zh-ok"),
        pytest.param(TRIP, "不用谢，挺好的", NO, None, id="zh-you-are-welcome"),
        pytest.param(TRIP, "这两个景点区别大吗", NO, None, id="zh-difference"),
        pytest.param(EN_TRIP, "Thanks, that looks great", NO, None, id="en-thanks"),
        pytest.param(EN_TRIP, "I don't know much about Kyoto, is it safe?", NO, None, id="en-dont-know"),
        pytest.param(TRIP, "换个话题，帮我写一封请假邮件", NEW, "topic_switch:换个话题", id="zh-topic-phrase"),
        pytest.param(
            EN_TRIP,
            "Different topic: how do I sort a list in Python?",
            NEW,
            "topic_switch:different topic",
            id="en-topic-phrase",
        ),
    ],
)
def test_detect_change(context: list[str], turn: str, kind: ChangeKind, signal: str | None) -> None:
    result = verdict(context, turn)
    assert result.kind is kind, result.signals
    if signal is None:
        assert result.signals == ()
    else:
        assert signal in result.signals


def test_other_intent_is_a_new_topic() -> None:
    result = verdict(TRIP, "明天的会议纪要帮我整理一下", intents=("travel", "doc_rewrite"))
    assert result.kind is NEW
    assert result.signals[0] == "intent:travel->doc_rewrite"


def test_new_topic_wins_over_change_phrases() -> None:
    assert verdict(TRIP, "不要酒店了", intents=("travel", "shopping")).kind is NEW


def test_a_count_of_one_is_not_a_new_constraint() -> None:
    assert verdict(["有什么适合编程的轻薄本"], "推荐一款适合编程的轻薄本").kind is NO


def test_a_restatement_names_what_was_pointed_at_without_changing_it() -> None:
    """The elliptical turn had no place of its own; the restatement names the one the conversation
    settled on. That slot is not news for a restatement, though a negation or a conflict is."""
    request = extract_entities(normalize_text("帮我查一下明天去上海的高铁"))

    def judge(turn: str, *, restated: bool, candidate: str = "帮我查一下明天的高铁") -> ChangeVerdict:
        return detect_change(
            normalize_text(turn),
            candidate_entities=extract_entities(normalize_text(candidate)),
            request_entities=request,
            candidate_intent="x",
            request_intent="x",
            restated_turn=normalize_text(candidate) if restated else None,
        )

    turn = "帮我查一下明天去上海的高铁"
    assert judge(turn, restated=False).signals == ("new:places",)  # judged by similarity: news
    assert judge(turn, restated=True).kind is NO
    assert judge("查一下明天去上海的高铁，不要动车", restated=True).kind is MOD
    assert judge(turn, restated=True, candidate="帮我查一下明天去北京的高铁").signals == ("conflict:places",)


def test_the_same_amount_filed_under_another_slot_is_not_news() -> None:
    # "under 1500 dollars" parses as a budget, "for 1500 dollars" as a price: one amount
    asked = "what's the best espresso machine i can get for 1500 dollars?"
    assert verdict([asked], "Recommend a espresso machine under 1500 dollars.").kind is NO
    assert verdict([asked], "Recommend a espresso machine under 1000 dollars.").kind is MOD
    # another quantity with the same figure is still news
    assert verdict(["a hotel in Rome for 3 nights"], "a hotel in Rome for 3 people").kind is MOD


def test_a_change_phrase_the_candidates_own_turn_asked_was_answered() -> None:
    asked, turn = "蓝牙耳机想换成粉色，需要自己出运费吗", "蓝牙耳机可以换成粉色的吗？"

    def signals(candidate_turn: str | None) -> tuple[str, ...]:
        return detect_change(
            normalize_text(turn),
            candidate_entities=extract_entities(normalize_text(asked)),
            request_entities=extract_entities(normalize_text(turn)),
            candidate_intent="x",
            request_intent="x",
            candidate_turn=None if candidate_turn is None else normalize_text(candidate_turn),
        ).signals

    assert signals(None) == ("modification:换成",)
    assert signals(asked) == ()
    assert signals("蓝牙耳机的运费谁出") == ("modification:换成",)


def test_same_constraints_in_other_words_is_no_change() -> None:
    result = verdict(["推荐三款轻薄本，预算八千以内"], "8000以内的轻薄本，给我推荐3款")
    assert result.kind is NO, result.signals


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("不要酒店了", True, id="negation"),
        pytest.param("再加一个景点", True, id="addition"),
        pytest.param("预算提高到一万", True, id="modification"),
        pytest.param("make it shorter", True, id="en-modification"),
        pytest.param("那就这样吧，谢谢", False, id="thanks"),
        pytest.param("要不要带伞", False, id="yaobuyao-is-a-question"),
        pytest.param("这个特别好", False, id="tebie-is-not-bie"),
        pytest.param("I don't understand the second step", False, id="dont-understand"),
    ],
)
def test_change_instruction(text: str, expected: bool) -> None:
    assert change_instruction(normalize_text(text)) is expected


def test_a_neighbouring_intents_record_is_no_other_topic() -> None:
    turn = normalize_text("I forgot my password, how can I reset it?")
    facts = extract_entities(turn)

    def kind(neighbours: frozenset[str]) -> ChangeKind:
        return detect_change(
            turn,
            candidate_entities=facts,
            request_entities=facts,
            candidate_intent="customer_support",
            request_intent="general",
            neighbours=neighbours,
        ).kind

    assert kind(frozenset()) is NEW
    assert kind(frozenset({"customer_support"})) is NO
