from __future__ import annotations

import pytest

from proxy.text.entities import Entities, entities_conflict, extract_entities, merge_entities
from proxy.text.normalize import normalize_text

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
