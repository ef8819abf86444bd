"""The reordered-words guard (proxy.text.lexical.reordered): the same words in another order are
often another question, which an embedding cannot tell from a paraphrase."""

from __future__ import annotations

import pytest

from proxy.text.lexical import numbers_reordered, reordered, spans_swapped, tokens, transposed
from proxy.text.normalize import normalize_text


def _reordered(a: str, b: str) -> bool:
    return reordered(normalize_text(a), normalize_text(b))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("北京到成都的火车票", "成都到北京的火车票"),
        ("东部北方邦和西部哈雅纳省", "西部北方邦和东部哈雅纳省"),
        # a long sentence where one exchange moves 3 % of the word pairs: under the discordance test's bar
        (
            "这种植物多生长在北部的高山草甸和南部的河谷平原，是当地居民常用的一种药材，也常见于各地的集市。",
            "这种植物多生长在南部的高山草甸和北部的河谷平原，是当地居民常用的一种药材，也常见于各地的集市。",
        ),
        (
            "Is a flight from Paris to Rome cheaper than the train?",
            "Is a flight from Rome to Paris cheaper than the train?",
        ),
        ("dogs chase cats in the garden every morning", "cats chase dogs in the garden every morning"),
    ],
)
def test_exchanged_words_are_reordered(a: str, b: str) -> None:
    assert _reordered(a, b)
    assert _reordered(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("北京到成都的火车票", "北京到成都的火车票多少钱"),
        ("How do I reset my password?", "how do i reset my password"),
        ("推荐一款轻薄本", "推荐一款轻薄笔记本"),
        ("What is the capital of France?", "Which city is the capital of France?"),
    ],
)
def test_same_order_or_other_words_are_not(a: str, b: str) -> None:
    assert not _reordered(a, b)


def test_transposed_needs_exactly_one_exchange() -> None:
    assert transposed(["a", "b", "c", "d"], ["c", "b", "a", "d"])
    assert not transposed(["a", "b", "c", "d"], ["a", "b", "c", "d"])
    assert not transposed(["a", "b", "c", "d"], ["b", "c", "a", "d"])  # a rotation, not an exchange
    assert not transposed(["a", "b", "c"], ["a", "b", "c", "d"])
    assert not transposed(["a", "b", "c", "d"], ["a", "x", "c", "y"])
    assert tokens(normalize_text("北京到成都的火车票"))[0] == "北京"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("自17世纪初至12世纪,凯塔王朝统治马里", "自12世纪至17世纪初,凯塔王朝统治马里", True),
        ("flights from 3 to 5 pm", "flights from 5 to 3 pm", True),
        ("book 2 rooms for 3 nights", "book 2 rooms for 3 nights please", False),
        ("2 apples and 2 pears", "2 pears and 2 apples", False),  # the numbers themselves kept their order
        ("3 days in rome", "rome for 3 days", False),  # one number: nothing to turn around
        ("from 3 to 5", "from 3 to 6", False),
    ],
)
def test_numbers_in_another_order_are_reordered(a: str, b: str, expected: bool) -> None:
    assert numbers_reordered(a, b) is expected
    if expected:  # the reordered-words guard reads it
        assert reordered(a, b)


def test_two_names_exchanged_across_word_boundaries_are_reordered() -> None:
    # jieba cuts "惠特兰后" as one word on one side and "惠特兰" "后" on the other, and splits the
    # longer name in three: no word list shows the exchange, the characters do
    a = normalize_text("大选中击败马尔科姆·弗雷泽后，惠特兰授予他爵士头衔，表彰他的贡献。")
    b = normalize_text("大选中击败惠特兰后，马尔科姆·弗雷泽授予他爵士头衔，表彰他的贡献。")
    assert not transposed(tokens(a), tokens(b))
    assert spans_swapped(a, b) and spans_swapped(b, a)
    assert reordered(a, b)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("我欠他钱", "他欠我钱", True),  # one character each side is enough in Chinese
        ("Fraser beat Whitlam in 1975", "Whitlam beat Fraser in 1975", True),
        ("what is teh weather", "what is the weather", False),  # one Latin letter traded: a typo
        ("百度贴吧怎么设置头像", "百度贴吧头像怎么设置", False),  # a rotation, no middle: the same question
        ("a, b", "b, a", False),  # no two letters in a span
        ("北京到成都", "北京到成都", False),
        ("北京到成都", "北京到重庆", False),
    ],
)
def test_spans_swapped(a: str, b: str, expected: bool) -> None:
    assert spans_swapped(a, b) is expected
