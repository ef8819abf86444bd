from __future__ import annotations

import pytest

from proxy.text.entities import Entities, entities_conflict, extract_entities, merge_entities
from proxy.text.normalize import Segmenter, normalize_text
from proxy.text.numbers import NumericConstraint
from proxy.text.phrases import KeywordRules, is_correction, is_reset_phrase

N = NumericConstraint


def numbers(text: str) -> set[tuple[str, str, float, str]]:
    return {(n.slot, n.op, n.value, n.unit) for n in extract_entities(normalize_text(text)).numbers}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("想买个轻薄本，预算八千以内", {("budget", "<=", 8000, "CNY")}, id="zh-budget-ceiling"),
        pytest.param("预算提高到一万", {("budget", "<=", 10000, "CNY")}, id="zh-budget-raised"),
        pytest.param("预算8k", {("budget", "<=", 8000, "CNY")}, id="k-budget"),
        pytest.param("a laptop under $1200", {("budget", "<=", 1200, "USD")}, id="en-under-dollars"),
        pytest.param("my budget is 900 dollars", {("budget", "<=", 900, "USD")}, id="en-budget-dollars"),
        pytest.param(
            "人均消费在100-150元的餐馆",
            {("price", ">=", 100, "CNY"), ("price", "<=", 150, "CNY")},
            id="zh-price-range",
        ),
        pytest.param("在杭州玩三天", {("duration_days", "=", 3, "day")}, id="zh-days"),
        pytest.param("plan 3 days in Rome", {("duration_days", "=", 3, "day")}, id="en-days"),
        pytest.param("a five-day trip", {("duration_days", "=", 5, "day")}, id="en-number-word-days"),
        pytest.param("a 2-week trip", {("duration_days", "=", 14, "day")}, id="weeks-to-days"),
        pytest.param("summarise it in 5 sentences", {("count", "=", 5, "sentence")}, id="en-sentences"),
        pytest.param("推荐三款降噪耳机", {("count", "=", 3, "item")}, id="zh-count"),
        pytest.param("give me four ideas for dinner", {("count", "=", 4, "item")}, id="en-count"),
        pytest.param("我们三个人住两晚", {("party_size", "=", 3, "person"), ("nights", "=", 2, "night")}, id="party"),
        pytest.param("重量1.5kg以下", {("weight", "<=", 1.5, "kg")}, id="weight-ceiling"),
        pytest.param("6月20日出发", {("date", "=", 620, "md")}, id="zh-date"),
        pytest.param("leave on 2025-06-20", {("date", "=", 20250620, "ymd")}, id="iso-date"),
        pytest.param("leave on June 20", {("date", "=", 620, "md")}, id="en-date"),
        pytest.param("the 20th of June, 2025", {("date", "=", 20250620, "ymd")}, id="en-date-dmy"),
        pytest.param("remind me at 7 pm", {("time", "=", 1900, "hhmm")}, id="clock"),
        pytest.param("下午3点开会", {("time", "=", 1500, "hhmm")}, id="zh-clock"),
        pytest.param("meet at 15:30", {("time", "=", 1530, "hhmm")}, id="24h-clock"),
        pytest.param("给我3点建议", set(), id="zh-points-are-not-a-time"),
        pytest.param("schedule it for Monday", {("weekday", "=", 1, "weekday")}, id="weekday"),
        pytest.param("3天后出发", set(), id="offset-is-not-duration"),
        pytest.param("那就这样吧，谢谢", set(), id="thanks"),
        pytest.param("我们一起去看一下", set(), id="yiqi-is-not-a-number"),
    ],
)
def test_numeric_constraints(text: str, expected: set[tuple[str, str, float, str]]) -> None:
    assert numbers(text) == expected


@pytest.mark.parametrize(
    ("text", "places"),
    [
        pytest.param("周末去杭州玩三天", {"杭州"}, id="zh-city"),
        pytest.param("Plan a weekend in Hangzhou", {"杭州"}, id="en-alias"),
        pytest.param("浙江省杭州市的酒店", {"浙江", "杭州"}, id="suffix-folded"),
        pytest.param("去日本东京玩", {"日本", "东京"}, id="country-and-city"),
        pytest.param("a trip from New York to Paris", {"纽约", "巴黎"}, id="en-multiword"),
        # ordinary words jieba tags as places must not become entities
        pytest.param("这个东西在东北卖得好吗", set(), id="dongxi-dongbei"),
        pytest.param("海鲜怎么做好吃", set(), id="seafood"),
        pytest.param("那家酒店的早餐值不值得吃", set(), id="no-place"),
        pytest.param("I like turkey sandwiches", set(), id="en-common-word"),
        pytest.param("帮我写一封请假邮件", set(), id="leave-email"),
    ],
)
def test_places_are_conservative(text: str, places: set[str]) -> None:
    assert extract_entities(normalize_text(text)).places == places


@pytest.mark.parametrize(
    ("text", "people", "products"),
    [
        pytest.param("帮我给李娜写一封邮件", {"李娜"}, set(), id="zh-person"),
        pytest.param("那就这样吧，谢谢", set(), set(), id="xiexie-is-not-a-name"),
        pytest.param("韩式烤肉和杨梅汁哪家好", set(), set(), id="dishes-are-not-names"),
        pytest.param("约了同事张伟吃饭", {"张伟"}, set(), id="zh-person-with-cue"),
        pytest.param("email Dr. Smith about the results", {"smith"}, set(), id="en-title"),
        pytest.param(
            "MacBook Air M3和ThinkPad X1 Carbon哪个好", set(), {"macbook air m3", "thinkpad x1 carbon"}, id="laptops"
        ),
        pytest.param("华为手机好还是小米好", set(), {"华为", "小米"}, id="zh-brands"),
        pytest.param("推荐一款苹果派的做法", set(), set(), id="apple-pie-is-food"),
    ],
)
def test_people_and_products(text: str, people: set[str], products: set[str]) -> None:
    entities = extract_entities(normalize_text(text))
    assert entities.people == people
    assert entities.products == products


def test_private_segmenter_is_used() -> None:
    seg = Segmenter()
    assert extract_entities(normalize_text("去苏州玩两天"), segmenter=seg).places == {"苏州"}


def test_entities_json_round_trip() -> None:
    entities = extract_entities(normalize_text("去杭州玩三天，预算五千以内，和李娜一起，带上MacBook Air"))
    assert Entities.from_json(entities.to_json()) == entities


def test_merge_later_turns_override_the_same_slot() -> None:
    first = extract_entities(normalize_text("帮我推荐一款轻薄本，预算八千以内"))
    second = extract_entities(normalize_text("预算提高到一万，重量再轻一点"))
    merged = merge_entities([first], second)
    assert [(n.slot, n.value) for n in merged.values("budget")] == [("budget", 10000)]
    assert merged.values("count") == first.values("count")


def test_merge_keeps_places_until_a_turn_names_others() -> None:
    turns = [
        extract_entities(normalize_text("周末去杭州玩三天")),
        extract_entities(normalize_text("那家酒店的早餐值不值得吃")),
    ]
    assert merge_entities(turns[:1], turns[1]).places == {"杭州"}
    assert merge_entities(turns, extract_entities(normalize_text("还是改成苏州吧"))).places == {"苏州"}


def _e(places: set[str] = frozenset(), *nums: NumericConstraint) -> Entities:  # type: ignore[assignment]
    return Entities(places=frozenset(places), numbers=nums)


@pytest.mark.parametrize(
    ("a", "b", "conflicts"),
    [
        pytest.param(_e({"杭州"}), _e({"苏州"}), ["places"], id="hangzhou-vs-suzhou"),
        pytest.param(_e({"杭州", "西湖"}), _e({"杭州"}), [], id="places-overlap"),
        pytest.param(_e({"杭州"}), _e(), [], id="one-side-empty"),
        pytest.param(
            _e(set(), N("budget", 8000, "CNY", "<=")),
            _e(set(), N("budget", 10000, "CNY", "<=")),
            ["budget"],
            id="budget",
        ),
        pytest.param(
            _e(set(), N("budget", 8000, "CNY", "<=")), _e(set(), N("budget", 8000, "CNY", "<=")), [], id="same-budget"
        ),
        pytest.param(
            _e(set(), N("duration_days", 3, "day")),
            _e(set(), N("duration_days", 5, "day")),
            ["duration_days"],
            id="3-vs-5-days",
        ),
        pytest.param(
            _e(set(), N("price", 100, "CNY", ">="), N("price", 150, "CNY", "<=")),
            _e(set(), N("price", 100, "CNY", ">="), N("price", 200, "CNY", "<=")),
            ["price"],
            id="range-ceiling-differs",
        ),
        pytest.param(
            _e(set(), N("date", 20250620, "ymd")), _e(set(), N("date", 620, "md")), [], id="date-without-year"
        ),
        pytest.param(_e(set(), N("date", 620, "md")), _e(set(), N("date", 621, "md")), ["date"], id="other-date"),
    ],
)
def test_entities_conflict(a: Entities, b: Entities, conflicts: list[str]) -> None:
    assert entities_conflict(a, b) == conflicts
    assert entities_conflict(b, a) == conflicts


def test_extracted_entities_conflict_end_to_end() -> None:
    assert entities_conflict(
        extract_entities(normalize_text("杭州三天游")), extract_entities(normalize_text("苏州三天游"))
    ) == ["places"]
    assert entities_conflict(
        extract_entities(normalize_text("玩三天")), extract_entities(normalize_text("plan 5 days"))
    ) == ["duration_days"]
    assert (
        entities_conflict(
            extract_entities(normalize_text("帮我排杭州三天的行程")),
            extract_entities(normalize_text("杭州3天行程怎么排")),
        )
        == []
    )


KEYWORDS = {
    "realtime": ["天气", "股价", "汇率", "现在", "today", "now", "latest"],
    "medical": ["症状", "用药", "诊断", "dose"],
}


@pytest.mark.parametrize(
    ("text", "intent"),
    [
        pytest.param("明天杭州天气怎么样", "realtime", id="zh-weather"),
        pytest.param("What is the latest news?", "realtime", id="en-latest"),
        pytest.param("Is the store open NOW?", "realtime", id="en-case"),
        pytest.param("布洛芬的用药剂量", "medical", id="zh-medicine"),
        pytest.param("What dose of ibuprofen is safe?", "medical", id="en-dose"),
        pytest.param("I know how to cook rice", None, id="know-is-not-now"),
        pytest.param("The doses of humour were large", None, id="dose-word-boundary"),
        pytest.param("帮我写一封请假邮件", None, id="none"),
    ],
)
def test_keyword_intent(text: str, intent: str | None) -> None:
    assert KeywordRules(KEYWORDS).intent(normalize_text(text)) == intent


def test_keyword_intent_follows_mapping_order() -> None:
    assert KeywordRules(KEYWORDS).intent(normalize_text("现在有什么症状")) == "realtime"
    assert KeywordRules(dict(reversed(list(KEYWORDS.items())))).intent(normalize_text("现在有什么症状")) == "medical"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("重新开始", True, id="zh-restart"),
        pytest.param("忘了之前的吧", True, id="zh-forget"),
        pytest.param("好吧，我们重新开始吧", True, id="zh-filler"),
        pytest.param("清空上下文", True, id="zh-clear"),
        pytest.param("start over", True, id="en-start-over"),
        pytest.param("Let's start over.", True, id="en-lets"),
        pytest.param("Forget everything I said", True, id="en-forget"),
        pytest.param("如何重新开始生活", False, id="zh-question-about-restarting"),
        pytest.param("重新开始游戏的方法", False, id="zh-game"),
        pytest.param("how do I start over after a layoff", False, id="en-question"),
        pytest.param("杭州有什么好玩的", False, id="unrelated"),
    ],
)
def test_is_reset_phrase(text: str, expected: bool) -> None:
    assert is_reset_phrase(normalize_text(text)) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("不对", True, id="zh-wrong"),
        pytest.param("不对，我要的是苏州", True, id="zh-wrong-then-fix"),
        pytest.param("不是这个意思", True, id="zh-not-what-i-meant"),
        pytest.param("你理解错了", True, id="zh-misunderstood"),
        pytest.param("你说的不对", True, id="zh-you-said-wrong"),
        pytest.param("答案不对吧", True, id="zh-answer-wrong"),
        pytest.param("That's not what I asked", True, id="en-not-asked"),
        pytest.param("wrong", True, id="en-wrong"),
        pytest.param("No, that is incorrect.", True, id="en-incorrect"),
        pytest.param("You misunderstood me", True, id="en-misunderstood"),
        pytest.param("这不对称吗", False, id="zh-symmetric"),
        pytest.param("感觉有点不对劲", False, id="zh-feels-off"),
        pytest.param("我写错了代码怎么办", False, id="zh-own-mistake"),
        pytest.param("What's wrong with my code?", False, id="en-whats-wrong-with"),
        pytest.param("what went wrong in the 2008 crisis", False, id="en-went-wrong"),
        pytest.param("谢谢，很有帮助", False, id="thanks"),
    ],
)
def test_is_correction(text: str, expected: bool) -> None:
    assert is_correction(normalize_text(text)) is expected
