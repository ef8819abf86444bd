"""proxy/core/text/entities.py: places, areas, people, products and numbers of a text, merged over
turns and compared between two texts."""

from __future__ import annotations

import pytest

from proxy.core.text.entities import Entities, entities_conflict, extract_entities, merge_entities
from proxy.core.text.normalize import Segmenter, normalize_text
from proxy.core.text.numbers import NumericConstraint

AREAS = [
    ("I'm looking for a cheap restaurant in the north part of town", {"north"}),
    ("I need an expensive restaurant that's in the south section of the city", {"south"}),
    ("a restaurant in the centre", {"centre"}),
    ("somewhere in the center of town", {"centre"}),
    ("something downtown", {"centre"}),
    ("in the city centre please", {"centre"}),
    ("a hotel on the east side", {"east"}),
    ("the northern part of the city", {"north"}),
    ("a pub in the west end", {"west"}),
    ("a guesthouse in the south-east area", {"southeast"}),
    ("a flat in the suburbs", {"suburbs"}),
    ("北京城北有什么好吃的", {"north"}),
    ("南京市中心的酒店", {"centre"}),
    ("住在郊区方便吗", {"suburbs"}),
    ("城东有没有便宜的宾馆", {"east"}),
    ("上海西边的公园", {"west"}),
    ("东北部的景点", {"northeast"}),
    # a direction inside a name, a cuisine or a country is not an area
    ("北京有什么好玩的", set()),
    ("南京的鸭血粉丝汤", set()),
    ("东北菜馆推荐", set()),
    ("a trip to South Korea", set()),
    ("in the centre of the image", set()),
    ("how do I get to the North Pole", set()),
]


@pytest.mark.parametrize(("text", "areas"), AREAS)
def test_areas_are_extracted_in_both_languages(text: str, areas: set[str]) -> None:
    assert extract_entities(normalize_text(text)).areas == frozenset(areas)


@pytest.mark.parametrize(
    ("left", "right", "conflict"),
    [
        ("a cheap restaurant in the north part of town", "a cheap restaurant in the south part of town", True),
        ("a cheap restaurant in the north part of town", "a cheap restaurant on the north side", False),
        ("北京城北有什么好吃的", "北京城南有什么好吃的", True),
        ("北京城北有什么好吃的", "北京市中心有什么好吃的", True),
        ("a cheap restaurant in the centre", "a cheap restaurant downtown", False),
        ("a cheap restaurant in the north part of town", "a cheap restaurant", False),  # one side names none
    ],
)
def test_other_areas_conflict_like_other_places(left: str, right: str, conflict: bool) -> None:
    slots = entities_conflict(extract_entities(normalize_text(left)), extract_entities(normalize_text(right)))
    assert ("areas" in slots) is conflict
    assert "places" not in slots


def test_a_new_town_drops_the_old_area_and_a_new_area_keeps_the_town() -> None:
    north = Entities(places=frozenset({"北京"}), areas=frozenset({"north"}))
    assert merge_entities([north], Entities(places=frozenset({"上海"}))).areas == frozenset()
    moved = merge_entities([north], Entities(areas=frozenset({"south"})))
    assert (moved.places, moved.areas) == (frozenset({"北京"}), frozenset({"south"}))


def test_areas_round_trip_through_json_and_old_records_have_none() -> None:
    e = extract_entities(normalize_text("a hotel on the east side"))
    assert Entities.from_json(e.to_json()) == e
    assert Entities.from_json({"places": ["巴黎"]}).areas == frozenset()


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


N = NumericConstraint


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
