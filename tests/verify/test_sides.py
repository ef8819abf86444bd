from __future__ import annotations

import pytest

from proxy.core.model import PREVIOUS_QUESTION_CHARS, QUESTION_CHARS, REPLY_HEAD_CHARS
from proxy.verify import PairSide, side_text

CASES = [
    ("question only", PairSide("花呗怎么还款"), "花呗怎么还款"),
    ("full-width folds and spaces collapse", PairSide("  ＬＧ　Optimus   G？ "), "LG Optimus G?"),
    (
        "previous question only",
        PairSide("what is their address?", "a cheap place in the south"),
        "what is their address? ¦ a cheap place in the south",
    ),
    (
        "reply only keeps an empty previous slot",
        PairSide("营业时间？", "", "推荐您去讲礼驴肉馆。"),
        "营业时间? ¦  ¦ 推荐您去讲礼驴肉馆。",
    ),
    (
        "all three parts",
        PairSide("and the phone?", "address of Nandos", "Nandos is at 33 Bridge St."),
        "and the phone? ¦ address of Nandos ¦ Nandos is at 33 Bridge St.",
    ),
    ("blank context is no context", PairSide("hello", " ", "\n\t"), "hello"),
    ("newlines in a reply become spaces", PairSide("q", "p", "line one\n\nline two"), "q ¦ p ¦ line one line two"),
]


@pytest.mark.parametrize(("side", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_side_text(side: PairSide, expected: str) -> None:
    assert side_text(side) == expected


def test_each_part_is_bounded_and_the_question_comes_first() -> None:
    text = side_text(PairSide("q" * 500, "p" * 500, "r" * 500))
    question, previous, reply = text.split(" ¦ ")
    assert (len(question), len(previous), len(reply)) == (QUESTION_CHARS, PREVIOUS_QUESTION_CHARS, REPLY_HEAD_CHARS)


def test_context_changes_the_text() -> None:
    a = PairSide("What is their address?", "", "Nandos is in the city centre.")
    b = PairSide("What is their address?", "", "Chiquito is in the south.")
    assert side_text(a) != side_text(b)
