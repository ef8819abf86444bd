"""proxy/core/text/agreement.py: a fresh answer against the cached one for the same request, agreed,
contradicted or left unsure, in English and Chinese."""

from __future__ import annotations

import pytest

from proxy.core.text.agreement import NUMBER, Agreement, Verdict, agreement, compare, read_answer
from proxy.core.text.normalize import Segmenter, default_segmenter

AGREE, DISAGREE, UNSURE = Verdict.AGREE, Verdict.DISAGREE, Verdict.UNSURE


@pytest.fixture(scope="module")
def segmenter() -> Segmenter:
    return default_segmenter()


# (fresh, cached, verdict, kinds in conflict)
PAIRS = [
    # --- English: the same facts in other words agree
    pytest.param(
        "The capital of France is Paris.", "Paris is the capital city of France.", AGREE, (), id="en-paraphrase-entity"
    ),
    pytest.param(
        "A spider has eight legs.", "Spiders have 8 legs, like all arachnids.", AGREE, (), id="en-number-word-and-digit"
    ),
    pytest.param(
        "5 kilograms is about 11 pounds.", "Five kilograms equals roughly 11 pounds.", AGREE, (), id="en-units"
    ),
    pytest.param(
        "Adult tickets to the Louvre cost €22. Entry is free for visitors under 18.",
        "The Louvre charges €22 for an adult ticket, and visitors under 18 get in free.",
        AGREE,
        (),
        id="en-price-paraphrase",
    ),
    pytest.param(
        "Here are some tips:\n1. Drink water\n2. Sleep early\n3. Walk daily",
        "Some tips:\n1. Sleep early\n2. Drink water\n3. Walk daily",
        AGREE,
        (),
        id="en-list-reordered",
    ),
    # --- English: a number, a date, a time or an entity changed disagrees
    pytest.param(
        "The ticket costs $25 for adults.", "Adult tickets are priced at $30.", DISAGREE, ("money",), id="en-price"
    ),
    pytest.param(
        "The museum opens at 9:00 am on Monday.",
        "The museum opens at 10:00 am on Monday.",
        DISAGREE,
        ("time",),
        id="en-time",
    ),
    pytest.param(
        "The capital of France is Paris.", "Berlin is the capital of Germany.", DISAGREE, ("place",), id="en-entity"
    ),
    pytest.param(
        "The festival takes place on July 14, 2025.",
        "The festival takes place on July 21, 2025.",
        DISAGREE,
        ("date",),
        id="en-date",
    ),
    pytest.param(
        "The iPhone 15 has a 6.1-inch display.",
        "The iPhone 14 has a 6.1-inch display.",
        DISAGREE,
        ("product",),
        id="en-product",
    ),
    pytest.param(
        "For a 3-day trip, pack light.",
        "For a 5-day trip, pack light.",
        DISAGREE,
        ("quantity:duration_days",),
        id="en-duration",
    ),
    # --- English: neither the same nor contradicting
    pytest.param("A spider has 8 legs.", "An ant has 6 legs.", UNSURE, (NUMBER,), id="en-bare-numbers-differ"),
    pytest.param("12 times 12 is 128.", "12 times 12 equals 12.", UNSURE, (), id="en-a-figure-one-side-only"),
    pytest.param("The capital of France is Paris.", "Paris.", AGREE, (), id="en-a-name-more-on-one-side"),
    pytest.param(
        "Boil the egg for about ten minutes, then cool it in cold water.",
        "Crack the egg into a hot pan with butter and fry until the white sets.",
        UNSURE,
        (),
        id="en-other-words",
    ),
    pytest.param(
        "Paris is lovely in spring; visit the Louvre and walk along the Seine.",
        "Paris is lovely in spring. Also consider a day trip to Lyon for its food.",
        UNSURE,
        (),
        id="en-extra-place",
    ),
    # --- Chinese
    pytest.param(
        "故宫的门票是60元，旺季需要提前预约。",
        "故宫门票价格为60元，旺季要提前在网上预约。",
        AGREE,
        (),
        id="zh-price-paraphrase",
    ),
    pytest.param("一周有七天。", "一个星期有7天。", AGREE, (), id="zh-numeral-and-digit"),
    pytest.param("法国的首都是巴黎。", "巴黎是法国的首都。", AGREE, (), id="zh-reordered"),
    pytest.param("故宫的门票是60元。", "故宫的门票是40元。", DISAGREE, ("money",), id="zh-price"),
    pytest.param("法国的首都是巴黎。", "德国的首都是柏林。", DISAGREE, ("place",), id="zh-entity"),
    pytest.param("会议定在3月5日上午9点。", "会议定在3月6日上午9点。", DISAGREE, ("date",), id="zh-date"),
    pytest.param(
        "从北京到上海坐高铁大约需要5小时。",
        "从北京到上海坐高铁大约需要3小时。",
        DISAGREE,
        ("quantity:duration_hours",),
        id="zh-hours",
    ),
    pytest.param("北京是中国的首都。", "上海是中国最大的城市。", UNSURE, (), id="zh-city-swapped-country-shared"),
    pytest.param("多喝水，早点睡觉，保持好心情。", "注意休息，适当运动。", UNSURE, (), id="zh-other-words"),
    pytest.param("蜘蛛有8条腿。", "蚂蚁有6条腿。", UNSURE, (NUMBER,), id="zh-bare-numbers-differ"),
]


@pytest.mark.parametrize(("fresh", "cached", "verdict", "conflicts"), PAIRS)
def test_agreement(fresh: str, cached: str, verdict: Verdict, conflicts: tuple[str, ...], segmenter: Segmenter) -> None:
    result = agreement(fresh, cached, segmenter=segmenter)
    assert result.verdict is verdict, result
    assert set(conflicts) <= set(result.conflicts), result
    if verdict is AGREE:
        assert not result.conflicts


def test_the_same_text_agrees_whatever_its_spacing_and_width(segmenter: Segmenter) -> None:
    result = agreement("故宫门票６０元。", "故宫门票 60 元", segmenter=segmenter)
    assert result == Agreement(AGREE, same_text=True)


def test_answers_with_no_facts_are_agreed_on_their_words_alone(segmenter: Segmenter) -> None:
    result = agreement(
        "Rest well and drink plenty of water.", "Drink plenty of water and rest well.", segmenter=segmenter
    )
    assert result.verdict is AGREE and result.facts == 1.0 and result.overlap == 1.0


def test_a_shape_count_is_a_bare_number_not_a_fact(segmenter: Segmenter) -> None:
    """Two good answers may give 3 tips or 5: never a contradiction."""
    result = agreement("Here are 3 tips for sleeping well.", "Here are 5 tips for sleeping well.", segmenter=segmenter)
    assert result.verdict is UNSURE and result.conflicts == (NUMBER,)


def test_list_numbering_is_not_a_number(segmenter: Segmenter) -> None:
    reading = read_answer("1. Drink water\n2. Sleep early", segmenter=segmenter)
    assert NUMBER not in reading.facts


def test_the_levels_decide_an_agree(segmenter: Segmenter) -> None:
    fresh = read_answer("Paris is the capital of France.", segmenter=segmenter)
    cached = read_answer("France's capital, Paris, is also its largest city.", segmenter=segmenter)
    assert compare(fresh, cached, min_overlap=0.0).verdict is AGREE
    assert compare(fresh, cached, min_overlap=1.0).verdict is UNSURE


def test_identifiers_are_facts(segmenter: Segmenter) -> None:
    # another order number, tracking code or reference: another answer, however alike the words
    other = agreement("Your order A10017 ships on Monday.", "Your order B20028 ships on Monday.", segmenter=segmenter)
    assert (other.verdict, other.conflicts) == (Verdict.DISAGREE, ("code", "number"))
    same = agreement("Your order A10017 ships on Monday.", "Order A10017 ships Monday.", segmenter=segmenter)
    assert same.verdict is Verdict.AGREE
    # words that only mix letters and digits under six characters are no identifiers ("5G", "H2O")
    assert "code" not in read_answer("5G phones need H2O proof cases.", segmenter=segmenter).facts
