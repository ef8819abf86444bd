"""The answer-validation stage of the decision: the key facts of a cached answer against the request.

Key facts are extracted once, when an answer is written, and stored as JSON on its record;
constraints come from the request's entities (its coarse tags) at serve time. Checks are hard rules:
a price above the budget, a date or place that differs, a list of 3 when 5 were asked fail.
An answer that states nothing checkable passes: it has nothing to contradict. Lists are counted
the way people write them: numbered ("1." "1)" "(1)" "1、" "一、" "①"), bulleted ("-" "*" "•"),
or on one line ("1) a 2) b 3) c", "Day 1 … Day 2 … Day 3"). The count check runs for every
intent (ALWAYS_CHECKED); the policy's `validate` list picks the others.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Final

from proxy.core.model import KeyFacts
from proxy.core.text.entities import Entities, extract_entities, merge_entities, places_and_products
from proxy.core.text.gazetteer import PLACE_ALIASES, canonical_place
from proxy.core.text.normalize import Cutter, NormalText, normalize_text
from proxy.core.text.numbers import extract_numbers

ALL_CHECKS: Final = ("budget", "dates", "counts", "entities")
# Checked for every intent, whatever its policy's `validate` list: a number of items, sentences or
# paragraphs is the request's own explicit constraint, and the check fails only on an answer that
# plainly holds another number (a list of 3 for "list 5"); an answer with no countable list passes.
# The list chooses the checks that need the intent's judgement (a budget, dates, places).
ALWAYS_CHECKED: Final = frozenset({"counts"})

_MONEY_SLOTS: Final = frozenset({"budget", "price"})
# circled, parenthesised and negative circled numbers (①, ⑴, ❶): a list's numbering, whatever the line holds
_ENCLOSED: Final = {
    **{chr(0x2460 + i): i + 1 for i in range(20)},
    **{chr(0x2474 + i): i + 1 for i in range(20)},
    **{chr(0x2776 + i): i + 1 for i in range(10)},
}
_ENCLOSED_CLASS: Final = "\u2460-\u2473\u2474-\u2487\u2776-\u277f"
_NUMBERED: Final = re.compile(
    r"^(?P<indent>\s*)(?:[#>*_\s]*)(?:\d{1,2}[.)、:：]|\(\d{1,2}\)|（\d{1,2}）|[一二三四五六七八九十]{1,3}[、.]"
    rf"|[{_ENCLOSED_CLASS}])(?!\d)\s*\S"
)
_BULLET: Final = re.compile(r"^(?P<indent>\s*)[-*•·+]\s+\S")
_ITEM_NUMBER: Final = re.compile(rf"\d{{1,2}}|[一二三四五六七八九十]{{1,3}}|[{_ENCLOSED_CLASS}]")
# an item marker inside a line ("1) a 2) b", "1、西湖 2、灵隐寺", "①早睡 ②早起"): after the line's start,
# a space or punctuation, and not a decimal ("1.5") or a time
_INLINE_MARKER: Final = re.compile(
    r"(?:^|(?<=[\s:：,，;；。.!?！？(（]))(?:(\d{1,2})[.)、](?![\d.])|\((\d{1,2})\)|（(\d{1,2})）)"
    rf"|([{_ENCLOSED_CLASS}])"
)
_INLINE_BULLET: Final = re.compile(r"(?:^|(?<=\s))•")
_DAY_HEADER: Final = re.compile(r"^[\s#>*_\-|]*(?:\d{1,2}[.)、]\s*)?(?:day\s?-?(\d{1,2})\b|第(\d{1,2})天|d(\d{1,2})\b)")
_DAY_INLINE: Final = re.compile(r"\bday\s?-?(\d{1,2})\b|第(\d{1,2})天")
_SENTENCE_END: Final = re.compile(r"[.!?](?:\s|$)|[。！？]")


def _list_items(lines: list[str]) -> int:
    """Top-level items, counted the way people write them: numbered lines at the shallowest
    indent ("1." "1)" "(1)" "1、" "一、" "①"; their highest number when the numbering is the list's
    own), else bullets at the shallowest indent ("-" "*" "•"), else a list written on one line:
    its markers numbered 1, 2, 3 … in order, or two or more "•"."""
    by_line = _line_items(lines)
    return by_line if by_line >= 2 else max([by_line, *(_inline_items(line) for line in lines)])


def _line_items(lines: list[str]) -> int:
    for pattern in (_NUMBERED, _BULLET):
        matches = [m for m in map(pattern.match, lines) if m]
        if not matches:
            continue
        top = min(len(m.group("indent").expandtabs(4)) for m in matches)
        items = [m for m in matches if len(m.group("indent").expandtabs(4)) == top]
        if pattern is _NUMBERED:
            numbers = [_item_number(m.group()) for m in items]
            if numbers[0] == 1 and numbers == sorted(numbers):
                return max(numbers)
        return len(items)
    return 0


def _inline_items(line: str) -> int:
    numbers = [int(next(g for g in m.groups()[:3] if g)) if not m.group(4) else _ENCLOSED[m.group(4)]
               for m in _INLINE_MARKER.finditer(line)]  # fmt: skip
    run = _run_from_one(numbers)
    if run >= 2:
        return run
    bullets = len(_INLINE_BULLET.findall(line))
    return bullets if bullets >= 2 else 0


def _run_from_one(numbers: Sequence[int]) -> int:
    """How far 1, 2, 3 … runs through ``numbers`` in order (other numbers between are skipped):
    an enumeration, not a number that happens to sit after a full stop."""
    expected = 1
    for n in numbers:
        if n == expected:
            expected += 1
    return expected - 1


def _item_number(line: str) -> int:
    match = _ITEM_NUMBER.search(line)
    assert match is not None
    text = match.group()
    if text in _ENCLOSED:  # before isdigit(), which "①" passes
        return _ENCLOSED[text]
    if text.isdigit():
        return int(text)
    tens, _, ones = text.rpartition("十") if "十" in text else ("", "", text)
    digits = "一二三四五六七八九"
    value = (digits.index(tens) + 1 if tens else 1) * 10 if "十" in text else 0
    return value + (digits.index(ones) + 1 if ones else 0)


def _day_sections(norm_lines: Sequence[str]) -> int:
    """The highest "Day N" / "第N天" header starting a line; with fewer than two such headers, an
    itinerary written on one line ("Day 1 … Day 2 … Day 3 …") counts its days numbered in order."""
    days = [int(next(g for g in m.groups() if g)) for m in map(_DAY_HEADER.match, norm_lines) if m]
    if len(days) >= 2:
        return max(days)
    inline = [int(next(g for g in m.groups() if g)) for line in norm_lines for m in _DAY_INLINE.finditer(line)]
    run = _run_from_one(inline)
    return run if run >= 2 else max(days, default=0)


def extract_key_facts(answer_text: str, *, segmenter: Cutter | None = None) -> KeyFacts:
    lines = [line for line in answer_text.splitlines() if line.strip()]
    norm_lines = [normalize_text(line, segmenter=segmenter) for line in lines]
    money: list[tuple[float, str]] = []
    units: list[tuple[float, str]] = []
    dates: list[int] = []
    for line in norm_lines:
        for n in extract_numbers(line):
            if n.slot in _MONEY_SLOTS:
                money.append((n.value, n.unit))
            elif n.slot == "date":
                dates.append(int(n.value))
            elif n.slot not in ("time", "weekday"):
                units.append((n.value, n.unit))
    places, products = places_and_products(NormalText("\n".join(norm_lines)), segmenter=segmenter)
    blocks = [b for b in re.split(r"\n\s*\n", answer_text.strip()) if b.strip()]
    return KeyFacts(
        money=tuple(dict.fromkeys(money)),
        numbers_with_units=tuple(dict.fromkeys(units)),
        dates=tuple(dict.fromkeys(dates)),
        list_items=_list_items(lines),
        day_sections=_day_sections(norm_lines),
        sentences=len(_SENTENCE_END.findall(answer_text.strip() + "\n")),
        paragraphs=len(blocks),
        places=places,
        products=products,
    )


@dataclass(frozen=True)
class Constraints:
    """What the request pins down, from its active user text."""

    budget_max: float | None = None
    budget_min: float | None = None
    currency: str = ""
    dates: tuple[int, ...] = ()
    duration_days: float | None = None
    count: int | None = None
    count_unit: str = "item"
    places: frozenset[str] = field(default_factory=frozenset)


def _single(entities: Entities, slot: str) -> float | None:
    values = {n.value for n in entities.values(slot)}
    return values.pop() if len(values) == 1 else None


def extract_constraints(request_text: str, *, segmenter: Cutter | None = None) -> Constraints:
    """Constraints of user turns written one per line; later lines override."""
    lines = [line for line in request_text.splitlines() if line.strip()]
    turns = [extract_entities(normalize_text(line, segmenter=segmenter), segmenter=segmenter) for line in lines]
    return constraints_of(merge_entities(turns[:-1], turns[-1]) if turns else Entities())


def constraints_of(active: Entities) -> Constraints:
    """The constraints in force, from the request's merged entities (its coarse tags)."""
    money = [n for n in active.numbers if n.slot in _MONEY_SLOTS]
    ceilings = [n.value for n in money if n.op == "<="]
    floors = [n.value for n in money if n.op == ">="]
    counts = active.values("count")
    count = _single(active, "count")
    return Constraints(
        budget_max=min(ceilings) if ceilings else None,
        budget_min=max(floors) if floors else None,
        currency=next((n.unit for n in money if n.unit), ""),
        dates=tuple(int(n.value) for n in active.values("date")),
        duration_days=_single(active, "duration_days"),
        count=int(count) if count is not None else None,
        count_unit=counts[0].unit if counts else "item",
        places=active.places,
    )


@dataclass(frozen=True)
class ValidationResult:
    ok: bool
    failures: tuple[str, ...] = ()


def _check_budget(facts: KeyFacts, c: Constraints) -> list[str]:
    amounts = [v for v, cur in facts.money if not (cur and c.currency and cur != c.currency)]
    if not amounts:
        return []
    failures = []
    if c.budget_max is not None and max(amounts) > c.budget_max:
        failures.append(f"budget:{max(amounts):g}>{c.budget_max:g}")
    if c.budget_min is not None and max(amounts) < c.budget_min:
        failures.append(f"budget:{max(amounts):g}<{c.budget_min:g}")
    return failures


def _month_day(date: int) -> int:
    return date % 10000


def _check_dates(facts: KeyFacts, c: Constraints) -> list[str]:
    failures = []
    if c.dates and facts.dates and not {_month_day(d) for d in c.dates} & {_month_day(d) for d in facts.dates}:
        failures.append(f"dates:{facts.dates[0]}!={c.dates[0]}")
    if c.duration_days is not None and facts.day_sections and facts.day_sections != c.duration_days:
        failures.append(f"duration:{facts.day_sections}!={c.duration_days:g}")
    return failures


def _check_counts(facts: KeyFacts, c: Constraints) -> list[str]:
    if c.count is None or c.count < 2:
        return []  # "推荐一款" answers often bullet the one item's merits
    found = {"sentence": facts.sentences, "paragraph": facts.paragraphs}.get(c.count_unit, facts.list_items)
    if c.count_unit in ("item", "sentence", "paragraph") and found and found != c.count:
        return [f"count:{found}!={c.count}"]
    return []


def _check_entities(facts: KeyFacts, c: Constraints) -> list[str]:
    # Only known cities, provinces and countries can contradict: an itinerary for 杭州 naturally
    # names 西湖 and 灵隐寺 without repeating the city.
    known = {p for p in facts.places if canonical_place(p) in PLACE_ALIASES}
    if c.places and known and not c.places & known:
        return [f"places:{','.join(sorted(known))}"]
    return []


_CHECKS: Final = {"budget": _check_budget, "dates": _check_dates, "counts": _check_counts, "entities": _check_entities}


def validate_answer(
    facts: KeyFacts, constraints: Constraints, checks: Collection[str] = ALL_CHECKS
) -> ValidationResult:
    """Run the named checks ("budget", "dates" (with trip length), "counts", "entities"), and
    "counts" whatever ``checks`` names (ALWAYS_CHECKED)."""
    wanted = {*checks, *ALWAYS_CHECKED}
    failures = tuple(f for name in ALL_CHECKS if name in wanted for f in _CHECKS[name](facts, constraints))
    return ValidationResult(ok=not failures, failures=failures)
