"""Operators an embedding cannot read: runs of operator characters, counted; a hyphen or slash
inside words and runs of emphasis are not operators."""

from __future__ import annotations

import pytest

from proxy.core.text.symbols import operators_differ, operators_in


def test_operator_runs_are_counted() -> None:
    assert operators_in("What is the difference between '-' and '-=' in C++?") == {"-": 1, "-=": 1, "++": 1}
    assert operators_in("is a -> b the same as a => b") == {"->": 1, "=>": 1}


@pytest.mark.parametrize(
    "text",
    ["a feel-good film", "an x-ray", "and/or", "from 2024-05-01", "Thanks!!", "好的~", "about ~300 dollars"],
)
def test_words_dates_and_emphasis_hold_no_operators(text: str) -> None:
    assert operators_in(text) == {}


def test_turns_differ_only_where_their_operators_do() -> None:
    assert operators_differ("difference between == and =?", "difference between '-' and '-='?")
    assert operators_differ("what is 2+2", "what is 2*2")
    assert operators_differ("what does += do", "what does it do")  # one side writes one
    assert not operators_differ("C++ or Java?", "Java vs C++")
    assert not operators_differ("a feel-good movie", "a feel-good film!")
