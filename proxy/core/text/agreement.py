"""Answer agreement: does a freshly generated answer say what the cached answer for the same
request says? Agree, disagree or unsure, with the signals behind the verdict.

The facts are read by the rules the cache already reads answers with: numbers with units, money,
dates, times and weekdays (``numbers.extract_numbers``, a normalised line at a time, as an answer's
key facts are), places, people and products (``entities``), identifiers (letters and digits mixed:
an order number, a tracking code), and the bare numbers besides. Two
answers that both state a kind of fact and share none of its values contradict each other:
disagree. Bare numbers are a weaker kind (a list's length, a count of tips, a figure the model made
up): disjoint ones leave the pair unsure, never disagreeing. Agreement needs more than the absence
of a contradiction: the facts mostly shared and the content words overlapping (jieba's words for
Chinese), so two answers that happen to state nothing checkable are agreed only on their words, and
an answer stating a figure the other lacks ("12 times 12 is 128" against "12 times 12 equals 12")
is not agreed.

Verdicts lean to unsure: an agree is a label that lets a threshold serve without asking, so a
pair that is neither plainly the same nor plainly contradictory is left unlabelled.
``benchmarks/bench_agreement.py`` measures how often a near-miss pair is agreed all the same.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from proxy.core.text.entities import extract_entities
from proxy.core.text.lexical import tokens
from proxy.core.text.normalize import Cutter, NormalText, format_number, normalize_text
from proxy.core.text.numbers import NumericConstraint, extract_numbers

# The minimum content-word overlap (Dice) and fact overlap (Jaccard over stated facts) of an agree;
# bench_agreement reports what they give on answers sampled from the local engine.
MIN_OVERLAP: Final = 0.5
MIN_FACTS: Final = 0.5

NUMBER: Final = "number"  # bare numbers: the weak kind
# Kinds where an answer may name more than the other and still say the same ("Paris" and "Paris,
# France"); a number one answer states and the other lacks is another figure, never a detail.
_NAMES: Final = frozenset({"place", "person", "product"})
# Counts of an answer's own shape ("3 tips", "in 2 paragraphs") vary between two good answers;
# they are read as bare numbers, not as facts.
_SHAPE_SLOTS: Final = frozenset({"count", "length"})
_MONEY_SLOTS: Final = frozenset({"budget", "price"})
# a list's numbering at a line's start ("1." "2)" "3、"), which says nothing about the answer's facts
_LIST_MARKER: Final = re.compile(r"^[\s#>*_\-|]*\d{1,2}[.)、:](?!\d)")
_BARE_NUMBER: Final = re.compile(r"(?<![\d.])\d+(?:\.\d+)?(?![\d])")
# An identifier: letters and digits mixed, six or more (an order or ticket number, a tracking code,
# a model name such as A100 against H100 spelled out, a reference tag). Two answers naming different
# ones are about different things.
CODE: Final = "code"
_CODE: Final = re.compile(
    r"(?<![A-Za-z0-9_-])(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9_-]{5,}(?![A-Za-z0-9_-])"
)


class Verdict(StrEnum):
    AGREE = "agree"
    DISAGREE = "disagree"
    UNSURE = "unsure"


@dataclass(frozen=True, slots=True)
class AnswerReading:
    """One answer read once: its normalised text, its content words, and its facts by kind
    (``money``, ``quantity:<slot>``, ``date``, ``time``, ``weekday``, ``place``, ``person``,
    ``product``, ``number``), each a set of values spelled one way."""

    text: NormalText
    words: frozenset[str]
    facts: Mapping[str, frozenset[str]]


@dataclass(frozen=True, slots=True)
class Agreement:
    """The verdict and what it rests on: the kinds both answers state with no value in common
    (``conflicts``), those they state with some values on one side only (``partial``), the share
    of stated facts both hold (``facts``, 1.0 when neither states any) and the content-word
    overlap (``overlap``)."""

    verdict: Verdict
    conflicts: tuple[str, ...] = ()
    partial: tuple[str, ...] = ()
    facts: float = 1.0
    overlap: float = 1.0
    same_text: bool = False


def _fact_kind(n: NumericConstraint) -> tuple[str, str]:
    value = format_number(n.value)
    if n.slot in _MONEY_SLOTS:
        return "money", f"{value} {n.unit}".strip()
    if n.slot in ("date", "time", "weekday"):
        return n.slot, value
    if n.slot in _SHAPE_SLOTS:
        return NUMBER, value
    return f"quantity:{n.slot}", value


def _bare_numbers(line: str) -> set[str]:
    marker = _LIST_MARKER.match(line)
    body = line[marker.end() :] if marker else line
    return {format_number(float(m.group())) for m in _BARE_NUMBER.finditer(body)}


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def read_answer(answer: str, *, segmenter: Cutter | None = None) -> AnswerReading:
    """An answer's normalised text, content words and facts; read once, compared many times."""
    lines = [normalize_text(line, segmenter=segmenter) for line in answer.splitlines() if line.strip()]
    text = NormalText("\n".join(lines))
    facts: dict[str, set[str]] = {}
    codes = {m.group().lower() for m in _CODE.finditer(answer)}
    if codes:
        facts[CODE] = codes
    for line in lines:
        for n in extract_numbers(line):
            kind, value = _fact_kind(n)
            facts.setdefault(kind, set()).add(value)
        facts.setdefault(NUMBER, set()).update(_bare_numbers(line))
    entities = extract_entities(text, segmenter=segmenter)
    for kind, names in (("place", entities.places), ("person", entities.people), ("product", entities.products)):
        facts.setdefault(kind, set()).update(names)
    words = frozenset(_stem(w) for w in tokens(text, segmenter))
    return AnswerReading(text, words, {k: frozenset(v) for k, v in facts.items() if v})


def _dice(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return 2 * len(a & b) / (len(a) + len(b))


def _fact_overlap(a: Mapping[str, frozenset[str]], b: Mapping[str, frozenset[str]]) -> float:
    left = {(k, v) for k, values in a.items() for v in values}
    right = {(k, v) for k, values in b.items() for v in values}
    union = left | right
    return len(left & right) / len(union) if union else 1.0


def _other_figures(fresh: AnswerReading, cached: AnswerReading, partial: tuple[str, ...]) -> bool:
    """Does one answer state a figure of a kind both state that the other does not, or name
    things neither of which the other's names contain?"""
    for kind in partial:
        a, b = fresh.facts[kind], cached.facts[kind]
        if kind not in _NAMES or not (a <= b or b <= a):
            return True
    return False


def compare(
    fresh: AnswerReading, cached: AnswerReading, *, min_overlap: float = MIN_OVERLAP, min_facts: float = MIN_FACTS
) -> Agreement:
    """The verdict on two answers already read (``read_answer``)."""
    if fresh.text == cached.text:
        return Agreement(Verdict.AGREE, same_text=True)
    shared = sorted(fresh.facts.keys() & cached.facts.keys())
    conflicts = tuple(k for k in shared if not fresh.facts[k] & cached.facts[k])
    partial = tuple(k for k in shared if k not in conflicts and fresh.facts[k] != cached.facts[k])
    facts = _fact_overlap(fresh.facts, cached.facts)
    overlap = _dice(fresh.words, cached.words)
    if any(k != NUMBER for k in conflicts):
        verdict = Verdict.DISAGREE
    elif not conflicts and not _other_figures(fresh, cached, partial) and facts >= min_facts and overlap >= min_overlap:
        verdict = Verdict.AGREE
    else:
        verdict = Verdict.UNSURE
    return Agreement(verdict, conflicts, partial, round(facts, 4), round(overlap, 4))


def agreement(
    fresh: str,
    cached: str,
    *,
    segmenter: Cutter | None = None,
    min_overlap: float = MIN_OVERLAP,
    min_facts: float = MIN_FACTS,
) -> Agreement:
    """Does ``fresh``, an answer generated now, say what ``cached``, the answer the cache holds for
    the same request, says?"""
    return compare(
        read_answer(fresh, segmenter=segmenter),
        read_answer(cached, segmenter=segmenter),
        min_overlap=min_overlap,
        min_facts=min_facts,
    )
