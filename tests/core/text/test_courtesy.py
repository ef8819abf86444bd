"""Courtesy framing comes off a turn's ends and nothing else does: a greeting only before
punctuation, a closing thanks only after it, a closing please unless it is the word asked about."""

from __future__ import annotations

import pytest

from proxy.core.text.courtesy import bare_question


@pytest.mark.parametrize(
    ("framed", "plain"),
    [
        ("Quick question: recommend a good feel-good movie.", "Recommend a good feel-good movie."),
        ("Quick question: why do cats purr?", "Why do cats purr?"),
        ("Hi, how do I reset my password?", "how do I reset my password"),
        ("big O of heap sort? thanks", "big O of heap sort?"),
        ("How long does a repair take? Thank you so much!", "How long does a repair take?"),
        ("the monitor inside is broken please", "the monitor inside is broken"),
        ("Quick question: i need a pizza joke pls", "i need a pizza joke"),
        ("塞翁失马这个成语怎么理解，谢谢", "塞翁失马这个成语怎么理解"),
        ("下单后还能改发票抬头吗，谢谢！", "下单后还能改发票抬头吗？"),
        ("请问亲子游北海推荐去哪", "亲子游北海推荐去哪"),
        ("麻烦问一下，每个部门薪资排名前两的员工，sql怎么写", "每个部门薪资排名前两的员工，sql怎么写"),
        ("你好，请帮我写一封感谢信", "帮我写一封感谢信"),
    ],
)
def test_framing_comes_off(framed: str, plain: str) -> None:
    assert bare_question(framed) == bare_question(plain) != ""


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("How do I say please", "How do I say"),  # the word asked about
        ("How do I say thank you?", "How do I say?"),
        ("日语怎么说谢谢", "日语怎么说麻烦了"),  # no punctuation before it: asked about
        ("你好用英语怎么说", "您好用英语怎么说"),  # no punctuation after it: asked about
        ("hello world in java", "world in java"),
        ("请假怎么请", "假怎么请"),  # 请 of a word, not of courtesy
        ("What does \\S match?", "What does \\s match?"),  # case past the first letter stays
        ("what regular expression validates a UK postcode thanks", "what regular expression validates a UK postcode"),
        ("Why do cats purr?", "Why do dogs purr?"),
    ],
)
def test_what_is_asked_stays(one: str, other: str) -> None:
    assert bare_question(one) != bare_question(other)


def test_a_turn_of_framing_alone_is_empty_and_a_lone_thanks_is_its_own_turn() -> None:
    assert bare_question("Hi! Please,") == bare_question("  ") == ""
    assert bare_question("Thanks!") == "thanks"  # nothing before it: the whole turn, not a closing
