"""A task skeleton: the few content words that say what a conversation is about."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from proxy.text.gazetteer import wordset
from proxy.text.normalize import CJK, Segmenter, default_segmenter, normalize_text

_SKELETON_FLAGS: Final = frozenset({"n", "nr", "ns", "nt", "nz", "nrt", "vn", "v", "eng", "an", "l", "i"})
_ZH_STOP: Final = wordset(
    "帮 帮忙 帮我 请 请问 可以 能 能够 需要 想 想要 要 觉得 知道 告诉 看看 一下 什么 怎么 怎么样 如何 为什么 "
    "是 有 没有 做 给 让 说 问 用 还有 这个 那个 这些 那些 东西 问题 时候 谢谢 好的 推荐 建议 了解 麻烦"
)
_EN_STOP: Final = wordset(
    "the a an and or but if then of to in on at for with about from by as is are was were be been being do does "
    "did have has had can could would should will shall may might must i me my we our you your he she it its they "
    "them their this that these those what which who whom whose when where why how please help tell give make "
    "want need like just also some any more most very much many not no yes ok okay thanks thank let get know "
    "there here than so such into over under again up down out new one two three"
)


def _content_words(text: str, segmenter: Segmenter) -> list[str]:
    words: list[str] = re.findall(r"[a-z][a-z'-]{2,}", text)
    words = [w[:-1] if w.endswith("s") and len(w) > 4 else w for w in words if w not in _EN_STOP]
    if re.search(rf"[{CJK}]", text):
        for word, flag in segmenter.tagged(re.sub(r"[a-z0-9]+", " ", text)):
            if flag in _SKELETON_FLAGS and len(word) >= 2 and word not in _ZH_STOP and re.fullmatch(rf"[{CJK}]+", word):
                words.append(word)
    return words


def task_skeleton(texts: Sequence[str], *, top: int = 5, segmenter: Segmenter | None = None) -> str:
    """A few content keywords of a conversation, alphabetically, so paraphrases tend to agree.

    Later texts weigh more (the task drifts towards the latest turns); ties go to longer words.
    """
    seg = segmenter or default_segmenter()
    scores: dict[str, float] = {}
    for position, text in enumerate(texts):
        weight = 1.0 + position / max(1, len(texts))
        for word in _content_words(normalize_text(text, segmenter=seg), seg):
            scores[word] = scores.get(word, 0.0) + weight
    ranked = sorted(scores, key=lambda w: (-scores[w], -len(w), w))[:top]
    return " ".join(sorted(ranked))
