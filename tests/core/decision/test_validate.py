from __future__ import annotations

import json

import pytest

from proxy.core.decision.validate import Constraints, extract_constraints, extract_key_facts, validate_answer
from proxy.core.model import KeyFacts

LAPTOPS_7500_9000 = """根据你的需求，推荐以下三款编程轻薄本：
1. ThinkPad X1 Carbon：约7500元，重量1.1kg
   - 键盘手感好，接口齐全
2. MacBook Air M3：售价8999元，续航长
3. 小米笔记本Pro 14：价格 8,299 元
"""
LAPTOPS_UNDER_8000 = """推荐这三款：
1. 联想小新Pro 14，到手价5999元
2. 华硕无畏Pro 15，6499元
3. ThinkBook 14+，7299元
"""
HANGZHOU_3_DAYS = """杭州三日游行程：
**第一天**：西湖、断桥残雪、雷峰塔
**第二天**：灵隐寺、龙井村
**第三天**：宋城、河坊街
"""
EN_3_DAYS = """Here is a plan for Kyoto:
Day 1: Fushimi Inari and Gion
Day 2: Arashiyama bamboo grove
Day 3: Kinkaku-ji and Nishiki market
"""
BOOKS_3 = """Here are some picks:
- Dune by Frank Herbert
- Neuromancer by William Gibson
- Foundation by Isaac Asimov
"""
FLIGHT_0620 = "已为您查到6月20日上午从北京飞往上海的航班，票价约1200元。"
PLAIN = "好的，有什么其他问题随时问我。"


@pytest.mark.parametrize(
    ("answer", "request_text", "ok", "failure"),
    [
        pytest.param(
            LAPTOPS_7500_9000, "推荐三款编程轻薄本，预算八千以内", False, "budget:8999>8000", id="over-budget"
        ),
        pytest.param(LAPTOPS_7500_9000, "推荐三款编程轻薄本，预算一万以内", True, None, id="within-raised-budget"),
        pytest.param(LAPTOPS_UNDER_8000, "推荐三款编程轻薄本，预算八千以内", True, None, id="within-budget"),
        pytest.param(
            LAPTOPS_UNDER_8000, "three laptops under $800 please", True, None, id="other-currency-not-compared"
        ),
        pytest.param(LAPTOPS_UNDER_8000, "推荐五款编程轻薄本", False, "count:3!=5", id="three-of-five"),
        pytest.param(HANGZHOU_3_DAYS, "帮我排一个杭州五天的行程", False, "duration:3!=5", id="zh-3-day-plan-5-asked"),
        pytest.param(HANGZHOU_3_DAYS, "帮我排一个杭州三天的行程", True, None, id="zh-3-day-plan-ok"),
        pytest.param(HANGZHOU_3_DAYS, "帮我排一个苏州三天的行程", False, "places:", id="zh-other-city"),
        pytest.param(EN_3_DAYS, "Plan a 5-day trip to Kyoto", False, "duration:3!=5", id="en-3-day-plan-5-asked"),
        pytest.param(EN_3_DAYS, "Plan a three day trip to Kyoto", True, None, id="en-3-day-plan-ok"),
        pytest.param(BOOKS_3, "Recommend 5 sci-fi books", False, "count:3!=5", id="en-three-of-five"),
        pytest.param(BOOKS_3, "Recommend 3 sci-fi books", True, None, id="en-three-of-three"),
        pytest.param(FLIGHT_0620, "查一下6月21日北京到上海的航班", False, "dates:", id="other-date"),
        pytest.param(FLIGHT_0620, "查一下2025年6月20日北京到上海的航班", True, None, id="same-date-with-year"),
        pytest.param(
            FLIGHT_0620, "查一下6月20日北京到上海的航班，预算1000以内", False, "budget:1200>1000", id="fare-over-budget"
        ),
        pytest.param(PLAIN, "推荐五款轻薄本，预算八千以内，6月20日前到货", True, None, id="no-facts-passes"),
        pytest.param(LAPTOPS_7500_9000, "这几款哪个续航最好", True, None, id="no-constraints-passes"),
    ],
)
def test_validate_answer(answer: str, request_text: str, ok: bool, failure: str | None) -> None:
    result = validate_answer(extract_key_facts(answer), extract_constraints(request_text))
    assert result.ok is ok, result.failures
    if failure is not None:
        assert any(f.startswith(failure) for f in result.failures), result.failures
    else:
        assert result.failures == ()


def test_only_requested_checks_run_and_the_count_asked_for_always() -> None:
    """Issue 38.5: 'List 5 tips' was served a 3-item answer under chitchat, which validates
    nothing. The count the request asks for is its own explicit constraint: checked whatever the
    intent's list says; the list chooses the rest."""
    facts = extract_key_facts(LAPTOPS_7500_9000)
    constraints = extract_constraints("推荐五款编程轻薄本，预算八千以内")
    assert validate_answer(facts, constraints, ("counts",)).failures == ("count:3!=5",)
    assert validate_answer(facts, constraints, ("budget",)).failures == ("budget:8999>8000", "count:3!=5")
    assert validate_answer(facts, constraints, ()).failures == ("count:3!=5",)
    assert validate_answer(facts, extract_constraints("推荐编程轻薄本，预算八千以内"), ()).ok
    tips = extract_key_facts("1. Keep a schedule\n2. Avoid caffeine\n3. Keep the room dark")
    assert validate_answer(tips, extract_constraints("List 5 tips for better sleep"), ()).failures == ("count:3!=5",)


@pytest.mark.parametrize(
    ("answer", "items"),
    [
        pytest.param("1. a\n2. b\n3. c", 3, id="numbered-dot"),
        pytest.param("1) a\n2) b\n3) c\n4) d", 4, id="numbered-paren"),
        pytest.param("(1) a\n(2) b", 2, id="parenthesised"),
        pytest.param("一、早睡\n二、早起\n三、运动", 3, id="zh-numerals"),
        pytest.param("① 早睡\n② 早起\n③ 运动\n④ 喝水\n⑤ 读书", 5, id="circled"),
        pytest.param("⑴ a\n⑵ b\n⑶ c", 3, id="parenthesised-digits"),
        pytest.param("❶ a\n❷ b", 2, id="negative-circled"),
        pytest.param("- a\n- b\n- c", 3, id="dash"),
        pytest.param("* a\n* b", 2, id="star"),
        pytest.param("• a\n• b\n• c\n• d", 4, id="bullet"),
        pytest.param("1. a\n   - x\n   - y\n2. b", 2, id="nested-bullets-not-counted"),
        pytest.param("Here are tips: 1) a 2) b 3) c 4) d 5) e", 5, id="inline-paren"),
        pytest.param("Tips: (1) a (2) b (3) c", 3, id="inline-parenthesised"),
        pytest.param("推荐：1、西湖 2、灵隐寺 3、龙井", 3, id="inline-zh-comma"),
        pytest.param("①早睡 ②早起 ③运动", 3, id="inline-circled"),
        pytest.param("• a • b • c • d", 4, id="inline-bullets"),
        pytest.param("Meet at 10:30. Then 1. first, 2. second and 3. third.", 3, id="inline-after-a-time"),
        pytest.param("It costs 1.5 dollars and weighs 2.3 kg.", 0, id="decimals-are-not-items"),
        pytest.param("Chapter 2. It begins.", 0, id="a-lone-number-is-not-a-list"),
        pytest.param("Apples, bananas and cherries.", 0, id="a-comma-list-is-not-counted"),
    ],
)
def test_list_items_are_counted_the_way_people_write_them(answer: str, items: int) -> None:
    assert extract_key_facts(answer).list_items == items


@pytest.mark.parametrize(
    ("answer", "days"),
    [
        pytest.param(EN_3_DAYS, 3, id="headers"),
        pytest.param(HANGZHOU_3_DAYS, 3, id="zh-headers"),
        pytest.param("Day 1: West Lake. Day 2: Lingyin Temple. Day 3: tea fields.", 3, id="one-line"),
        pytest.param("Day 1 Louvre, Day 2 Eiffel Tower, Day 3 Versailles", 3, id="one-line-no-colon"),
        pytest.param("第一天：西湖 第二天：灵隐寺 第三天：龙井", 3, id="zh-one-line"),
        pytest.param("Day 1: arrive.\nRest well; on day 2 and day 3 we hike.", 3, id="header-then-inline"),
        pytest.param("Day 1: arrive and rest.", 1, id="one-day"),
        pytest.param("You will be tired on day 2.", 0, id="a-mention-is-not-an-itinerary"),
    ],
)
def test_day_sections_are_counted_on_one_line_too(answer: str, days: int) -> None:
    """Issue 38.5: a one-line 'Day 1 … Day 3' itinerary was rejected for a 3-day request."""
    assert extract_key_facts(answer).day_sections == days


def test_a_one_line_itinerary_meets_the_trip_length_it_states() -> None:
    facts = extract_key_facts("Day 1: West Lake. Day 2: Lingyin Temple. Day 3: tea fields.")
    assert validate_answer(facts, extract_constraints("Plan a 3-day trip to Hangzhou")).ok
    assert validate_answer(facts, extract_constraints("Plan a 5-day trip to Hangzhou")).failures == ("duration:3!=5",)


def test_key_facts_of_a_priced_list() -> None:
    facts = extract_key_facts(LAPTOPS_7500_9000)
    assert {v for v, _ in facts.money} == {7500, 8999, 8299}
    assert {c for _, c in facts.money} == {"CNY"}
    assert facts.list_items == 3
    assert (1.1, "kg") in facts.numbers_with_units
    assert "thinkpad x1 carbon" in facts.products


def test_key_facts_of_an_itinerary() -> None:
    facts = extract_key_facts(HANGZHOU_3_DAYS)
    assert facts.day_sections == 3
    assert "杭州" in facts.places


def test_key_facts_json_round_trip() -> None:
    for answer in (LAPTOPS_7500_9000, HANGZHOU_3_DAYS, FLIGHT_0620, PLAIN):
        facts = extract_key_facts(answer)
        assert KeyFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts


def test_key_facts_from_older_records_load() -> None:
    assert KeyFacts.from_json({"money": [[10, "USD"]]}) == KeyFacts(money=((10.0, "USD"),))


def test_constraints_later_turns_override() -> None:
    constraints = extract_constraints("推荐三款轻薄本，预算八千以内\n预算提高到一万")
    assert constraints == Constraints(budget_max=10000, currency="CNY", count=3)


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        pytest.param(
            "去杭州玩三天，预算五千以内",
            Constraints(budget_max=5000, currency="CNY", duration_days=3, places=frozenset({"杭州"})),
            id="zh-trip",
        ),
        pytest.param("Summarize this in 5 sentences", Constraints(count=5, count_unit="sentence"), id="sentences"),
        pytest.param("人均100-150元的餐馆", Constraints(budget_max=150, budget_min=100, currency="CNY"), id="range"),
        pytest.param("flights on June 20", Constraints(dates=(620,)), id="en-date"),
    ],
)
def test_extract_constraints(request_text: str, expected: Constraints) -> None:
    assert extract_constraints(request_text) == expected


def test_sentence_count_check() -> None:
    facts = extract_key_facts("The sky is blue. Water is wet. Fire is hot.")
    assert facts.sentences == 3
    assert not validate_answer(facts, extract_constraints("Describe it in 5 sentences")).ok
    assert validate_answer(facts, extract_constraints("Describe it in three sentences")).ok


@pytest.mark.parametrize("answer", [LAPTOPS_7500_9000, LAPTOPS_UNDER_8000, HANGZHOU_3_DAYS])
def test_key_facts_name_the_places_and_products_the_entities_of_the_whole_answer_do(answer: str) -> None:
    """An answer's key facts read its places and products alone (its numbers a line at a time):
    the same as every entity of the whole answer read at once would give."""
    from proxy.core.text.entities import extract_entities
    from proxy.core.text.normalize import NormalText, normalize_text

    whole = extract_entities(NormalText("\n".join(normalize_text(x) for x in answer.splitlines() if x.strip())))
    facts = extract_key_facts(answer)
    assert (facts.places, facts.products) == (whole.places, whole.products)
    assert facts.places or facts.products
