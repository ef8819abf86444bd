"""slot_swapped: one frame asked about another subject, told from a rewording of one question."""

from __future__ import annotations

import pytest

from proxy.core.text.normalize import normalize_text
from proxy.core.text.slots import slot_swapped


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Tell me a fun fact about koalas", "Tell me a fun fact about sharks"),
        ("How much RAM do I need for music production?", "How much RAM do I need for photo editing?"),
        ("how do i containerize a FastAPI app", "how do i containerize a Node Express API"),
        ("帮我用Python写下反转链表，要有注释", "帮我用Python写下合并两个有序数组，要有注释"),
        ("二分查找的复杂度怎么算", "冒泡排序的复杂度怎么算"),
        ("写一个匹配yyyy-mm-dd格式的日期的正则表达式", "写一个匹配手机号的正则表达式"),
        ("花呗可以分期吗", "借呗可以分期吗"),
    ],
)
def test_another_subject_in_the_same_frame_is_a_swap(a: str, b: str) -> None:
    assert slot_swapped(a, b)
    assert slot_swapped(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # the frame reworded around one subject
        ("纯中文字符的正则怎么写", "写一个匹配纯中文字符的正则表达式"),
        ("想看悬疑电影，推荐一下", "推荐一部好看的悬疑电影"),
        ("为什么猫会发出呼噜声？", "猫打呼噜是什么原因"),
        (
            "How do I get from the airport to the city center in Istanbul?",
            "Istanbul airport to downtown, cheapest way?",
        ),
        # only how the question is put differs
        ("花呗怎么还款", "花呗如何还款"),
        ("How do I fall asleep faster?", "How do I fall asleep quicker?"),
        ("How do I reset my password?", "How can I reset my password?"),
        ("Why do we yawn?", "Why do people yawn?"),
        ("Can you recommend a good mystery movie?", "Can you suggest a good mystery movie?"),
        # a word more is a constraint added, for change detection to weigh, not a swap
        ("What is quicksort?", "What is quicksort in Python?"),
        ("the same words", "the same words"),
    ],
)
def test_a_rewording_is_not_a_swap(a: str, b: str) -> None:
    assert not slot_swapped(a, b)


def test_numbers_compare_as_the_normaliser_writes_them() -> None:
    five, spelled = normalize_text("per-department top 5 by salary, sql?"), normalize_text("top five by salary, sql?")
    assert not slot_swapped(five, normalize_text("per-department top five by salary, sql?"))
    assert not slot_swapped(five, spelled)
    assert slot_swapped(
        normalize_text("top 5 salaries per department"), normalize_text("top 3 salaries per department")
    )
