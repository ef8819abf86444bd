"""A turn's writing: Chinese (or Japanese, Korean) against Latin script, mixed turns by their
majority, and no verdict where the letters are too few to tell."""

from __future__ import annotations

import pytest

from proxy.core.text.language import languages_differ, writing_of


@pytest.mark.parametrize(
    ("text", "writing"),
    [
        ("推荐一部好看的喜剧电影", "cjk"),
        ("Kindle是直接买还是等大促？", "cjk"),  # a product name in a Chinese question
        ("ModuleNotFoundError: No module named requests 这个错怎么改", "cjk"),
        ("What does 'cut corners' mean?", "latin"),
        ("Wie komme ich zum Flughafen?", "latin"),
        ("What does 塞翁失马 mean?", "cjk"),  # the idiom is most of what it asks
        ("2 + 2", None),
        ("¿?", None),
    ],
)
def test_writing_of(text: str, writing: str | None) -> None:
    assert writing_of(text) == writing


def test_only_turns_plainly_in_two_writings_differ() -> None:
    assert languages_differ("推荐一部好看的喜剧电影", "Recommend a good comedy.")
    assert not languages_differ("推荐一部喜剧", "想看喜剧电影，推荐一下")
    assert not languages_differ("Recommend a comedy", "What's a good comedy?")
    assert not languages_differ("42", "推荐一部喜剧")  # nothing to tell by
