"""One frame, another subject: two questions that share their words but for one span in the
middle ("a fun fact about koalas" / "...about sharks", "帮我用Python写下反转链表，要有注释" /
"...合并两个有序数组..."). That is how a question turns into another one while its vector and a
reader's first impression barely move; a rewording of the same question changes the frame
instead ("纯中文字符的正则怎么写" / "写一个匹配纯中文字符的正则表达式").

Words that only say how the question is put (怎么 / 如何, "best" / "easiest", "faster" /
"quicker") do not make a subject: a span of nothing else is a rewording.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.core.text.lexical import STOPWORDS, stem, words
from proxy.core.text.normalize import Cutter

# the longest span (in words) taken for one subject: past it the turns differ by more than a slot
SLOT_MAX_WORDS = 6
# the shortest frame around it, in words and as a share of the longer turn's words
FRAME_MIN_WORDS = 2
FRAME_MIN_SHARE = 0.4

# words that name no subject: the grammar (the stop words), and how the question is put
_HOW_PUT = (
    "should way ways best good better easy easiest simple simply quick quickly fast faster quicker "
    "tips tip advice help need want get make know tell explain give show really actually just "
    "much many long exactly possible any some there kind sort we us people someone one "
    "recommend suggest suggestion idea option "
    "怎么 如何 怎样 咋 怎么样 怎么办 什么 啥 哪些 哪个 哪里 为什么 为啥 有没有 能不能 可不可以 可以 能 会 "
    "要 需要 应该 一般 大概 多久 多长时间 几天 办法 方法 技巧 建议 推荐 好 最好 快 快速 简单 到底 帮 帮我 给 一个 个"
)
_NO_SUBJECT = frozenset(stem(w) for w in (*STOPWORDS, *_HOW_PUT.split()))


def _frame(ta: Sequence[str], tb: Sequence[str]) -> tuple[int, int]:
    """The lengths of the longest common head and tail, not overlapping in either sequence."""
    most = min(len(ta), len(tb))
    head = 0
    while head < most and ta[head] == tb[head]:
        head += 1
    tail = 0
    while tail < most - head and ta[-1 - tail] == tb[-1 - tail]:
        tail += 1
    return head, tail


def slot_swapped(a: str, b: str, segmenter: Cutter | None = None) -> bool:
    """Do the turns ask the same frame about another subject: their words the same but for one
    span each, the spans sharing no word and each naming a subject?"""
    ta = [stem(w) for w in words(a, segmenter)]
    tb = [stem(w) for w in words(b, segmenter)]
    head, tail = _frame(ta, tb)
    mid_a, mid_b = ta[head : len(ta) - tail], tb[head : len(tb) - tail]
    if not mid_a or not mid_b or max(len(mid_a), len(mid_b)) > SLOT_MAX_WORDS:
        return False  # the same words, one more word, or more than a slot apart
    frame = head + tail
    if frame < FRAME_MIN_WORDS or frame < FRAME_MIN_SHARE * max(len(ta), len(tb)):
        return False
    subject_a, subject_b = set(mid_a) - _NO_SUBJECT, set(mid_b) - _NO_SUBJECT
    return bool(subject_a) and bool(subject_b) and not subject_a & subject_b
