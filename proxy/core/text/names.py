"""Names the gazetteer may not know, told apart by their spelling: an English turn's capitalised
words, and the Latin-script words of a Chinese turn. An embedding moves little for another name
("to Prague" / "to Marrakech", "Prosipho crassicostatus 是一种海螺" / "Notoficula signeyensis 是一种海
螺"), so a pair that names different things is held apart before anything scores it."""

from __future__ import annotations

import re
from typing import Final

_EN_WORD: Final = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_CJK: Final = re.compile(r"[\u3400-\u9fff]")
_NAME_EN: Final = re.compile(r"(?<![.!?]\s)(?<!^)\b(?:[A-Z][a-z]+|[A-Z]{2,})\b")
_NOT_NAMES: Final = frozenset({"I", "OK", "I'm", "I'd", "I'll", "I've"})
# a name after a preposition of place or movement: where the question goes, which a paraphrase
# keeps ("a US visa" / "an American visa" name no destination)
_PLACED_NAME_EN: Final = re.compile(
    r"\b(?:to|from|in|at|near|via|into|around|between|and|or|vs\.?|versus)\s+(?:the\s+)?([A-Z][a-z]+|[A-Z]{2,})\b"
)
# in a Chinese turn a word in Latin letters is a name: a brand, a product, a species, an
# identifier ("Kindle", "HashMap", "Dockerfile"); one letter ("A股", "X光") is a word's part, and
# a few loanwords are everyday words
_LATIN_WORD: Final = re.compile(r"[A-Za-z][A-Za-z'-]*[A-Za-z]")
_LATIN_NOT_NAMES: Final = frozenset({"ok", "okay", "hi", "app"})

__all__ = ["names_differ", "names_in"]


def names_in(raw: str) -> bool:
    """Does a raw English turn name something the gazetteer may not know (a capitalised word past
    the start of a sentence: "learn the Rust language", "call Jack") or carry a number? Chinese
    turns always count as naming: without capitals their names cannot be told from words."""
    if _CJK.search(raw) or any(c.isdigit() for c in raw):
        return True
    return any(m.group(0) not in _NOT_NAMES for m in _NAME_EN.finditer(raw.strip()))


def names_differ(raw_a: str, raw_b: str) -> bool:
    """Does either turn name something the other does not mention in any case? In English, a
    place it goes to or from (a capitalised word after a preposition): "from Mexico City to
    Prague" / "from Mexico City to Marrakech", while "mexico city" typed in lower case still
    matches "Mexico City". In Chinese, where both turns name things in Latin letters, one the
    other does not: "帮我给Vue前端写个Dockerfile" / "帮我给Spring Boot服务写个Dockerfile" (where only
    one does, the other may have written the name in characters: "Abies lasiocarpa" / "亚高山冷杉")."""
    latin_a, latin_b = _latin_names(raw_a), _latin_names(raw_b)
    if latin_a and latin_b and latin_a != latin_b:
        return True
    words_a, words_b = set(_EN_WORD.findall(raw_a.lower())), set(_EN_WORD.findall(raw_b.lower()))
    for raw, other in ((raw_a, words_b), (raw_b, words_a)):
        for m in _PLACED_NAME_EN.finditer(raw.strip()):
            if m.group(1) not in _NOT_NAMES and m.group(1).lower() not in other:
                return True
    return False


def _latin_names(raw: str) -> frozenset[str]:
    """A Chinese turn's words in Latin letters, folded to lower case; none for another turn."""
    if not _CJK.search(raw):
        return frozenset()
    return frozenset(w.lower() for w in _LATIN_WORD.findall(raw)) - _LATIN_NOT_NAMES
