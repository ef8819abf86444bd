"""Which writing a turn is in, so an answer written for one language is not served to another.

A model answers in the language it is asked in: the cached answer to "推荐一部喜剧电影" is Chinese,
to "recommend a comedy" English, and each is wrong for the other however close the meanings (a
multilingual embedding, the verifier and a judge all read them as the same request). Turns mix
scripts ("Kindle是直接买还是等大促？", "ModuleNotFoundError 这个错怎么改"), so a turn counts as
Chinese when its CJK characters are at least as many as its Latin words, and as Latin-script
when it has no CJK at all; only two turns each plainly one or the other differ.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = ["Writing", "languages_differ", "writing_of"]

Writing = Literal["cjk", "latin"]

# Han (with extension A and compatibility ideographs), kana and hangul: one character is about a word
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_LATIN_WORD = re.compile(r"[A-Za-z\u00c0-\u024f]{2,}")


def writing_of(text: str) -> Writing | None:
    """The turn's writing, or None where it has too few letters to say (numbers, code, "ok")."""
    cjk = len(_CJK.findall(text))
    latin = len(_LATIN_WORD.findall(text))
    if cjk and cjk >= latin:
        return "cjk"
    if not cjk and latin:
        return "latin"
    return None


def languages_differ(a: str, b: str) -> bool:
    """Are the two turns plainly in different writings (one Chinese, Japanese or Korean, the other not)?"""
    wa, wb = writing_of(a), writing_of(b)
    return wa is not None and wb is not None and wa != wb
