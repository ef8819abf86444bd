"""Entities of a text (places, products, people, numbers) and of a conversation (merged, the
ones still in force), and the conflicts between two such sets.

Extraction is deliberately conservative: a missed entity costs at most a wrong hit that the
validator may still catch, but a garbage entity makes every paraphrase of a request miss."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.core.text.gazetteer import (
    EN_AREA,
    EN_PLACE,
    PERSON_FLAGS,
    PLACE_ALIASES,
    PLACE_FLAGS,
    PRODUCT,
    ZH_AREA,
    area_of,
    canonical_place,
    is_person,
    is_place,
    wordset,
)
from proxy.core.text.normalize import CJK, Cutter, NormalText, default_segmenter, tagged_words
from proxy.core.text.numbers import NumericConstraint, extract_numbers


@dataclass(frozen=True)
class Entities:
    """The entities of a text or, merged, the ones still in force in a conversation. ``areas`` are
    parts of a place (north, centre, suburbs): a slot of their own, so that "the north of
    Beijing" and "the south of Beijing" conflict although they share the city."""

    places: frozenset[str] = field(default_factory=frozenset)
    products: frozenset[str] = field(default_factory=frozenset)
    people: frozenset[str] = field(default_factory=frozenset)
    numbers: tuple[NumericConstraint, ...] = ()
    areas: frozenset[str] = field(default_factory=frozenset)

    def is_empty(self) -> bool:
        return not (self.places or self.products or self.people or self.numbers or self.areas)

    def slots(self) -> frozenset[str]:
        return frozenset(n.slot for n in self.numbers)

    def values(self, slot: str) -> tuple[NumericConstraint, ...]:
        return tuple(n for n in self.numbers if n.slot == slot)

    def to_json(self) -> dict[str, Any]:
        return {
            "places": sorted(self.places),
            "products": sorted(self.products),
            "people": sorted(self.people),
            "numbers": [[n.slot, n.value, n.unit, n.op] for n in self.numbers],
            "areas": sorted(self.areas),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entities:
        return cls(
            places=frozenset(data.get("places", ())),
            products=frozenset(data.get("products", ())),
            people=frozenset(data.get("people", ())),
            numbers=tuple(NumericConstraint(s, float(v), u, o) for s, v, u, o in data.get("numbers", ())),
            areas=frozenset(data.get("areas", ())),
        )


_EN_PERSON: Final = re.compile(
    r"\b(?:mr|mrs|ms|miss|dr|prof)\.? ([a-z][a-z'-]+)|\bmy (?:boss|friend|wife|husband|colleague|manager|mom|"
    r"dad|mother|father|sister|brother|son|daughter|teacher|client) ([a-z][a-z'-]+)(?=[ ,.!?]|$)"
)
_EN_NOT_NAMES: Final = wordset("and or is was has will who to for at in on with about")


# jieba's name tag fires on shop names, dishes and places (韩式, 杨梅, 宋家庄); a name counts only
# next to a word that says a person is meant (给李娜写, 王经理, 同事张伟).
_PERSON_BEFORE: Final = wordset(
    "给 叫 问 找 联系 通知 邀请 提醒 告诉 回复 感谢 致 朋友 同事 老板 客户 领导 老师 同学 亲爱的 尊敬的 "
    "我是 名叫 叫做 帮 替 陪 把 让 请"
)
_PERSON_AFTER: Final = (
    "先生",
    "女士",
    "老师",
    "经理",
    "总",
    "同学",
    "医生",
    "教授",
    "小姐",
    "阿姨",
    "叔叔",
    "生日",
    "说",
    "同志",
    "老板",
)


def _person_context(tagged: Sequence[tuple[str, str]], i: int) -> bool:
    before = tagged[i - 1][0] if i > 0 else ""
    after = tagged[i + 1][0] if i + 1 < len(tagged) else ""
    return before in _PERSON_BEFORE or after.startswith(_PERSON_AFTER)


def _names(text: str, segmenter: Cutter | None) -> tuple[frozenset[str], frozenset[str]]:
    places: set[str] = {PLACE_ALIASES[m.group(1)] for m in EN_PLACE.finditer(text)}
    people: set[str] = set()
    for m in _EN_PERSON.finditer(text):
        name = m.group(1) or m.group(2)
        if name not in _EN_NOT_NAMES:
            people.add(name)
    if re.search(rf"[{CJK}]", text):
        tagged = tagged_words(segmenter or default_segmenter(), text)
        for i, (word, flag) in enumerate(tagged):
            if (flag in PLACE_FLAGS or word in PLACE_ALIASES) and is_place(word):
                places.add(canonical_place(word))
            elif flag in PERSON_FLAGS and is_person(word) and _person_context(tagged, i):
                people.add(word)
    return frozenset(places), frozenset(people)


def _products(text: str) -> frozenset[str]:
    found = set()
    for m in PRODUCT.finditer(text):
        found.add(re.sub(r"\s+", " ", (m.group(1) + m.group(2)).strip()))
    return frozenset(found)


def _areas(text: str) -> frozenset[str]:
    found = {area_of(m, zh=False) for m in EN_AREA.finditer(text)}
    found.update(area_of(m, zh=True) for m in ZH_AREA.finditer(text))
    return frozenset(found)


def places_and_products(norm: NormalText, *, segmenter: Cutter | None = None) -> tuple[frozenset[str], frozenset[str]]:
    """``extract_entities``' places and products alone: an answer's key facts read its numbers a
    line at a time already, and its people and areas not at all."""
    places, _ = _names(norm, segmenter)
    return places, _products(norm)


def extract_entities(norm: NormalText, *, segmenter: Cutter | None = None) -> Entities:
    """Places, products, people and numeric constraints of one normalised text (Chinese or English)."""
    places, people = _names(norm, segmenter)
    return Entities(
        places=places, products=_products(norm), people=people, numbers=extract_numbers(norm), areas=_areas(norm)
    )


# --- conversation-level tags ------------------------------------------------------------------


def merge_entities(history: Sequence[Entities], current: Entities) -> Entities:
    """The entities still in force after ``history`` then ``current``: a later turn that names a
    slot (places, products, people, or a numeric slot such as budget) replaces that slot."""
    places: frozenset[str] = frozenset()
    products: frozenset[str] = frozenset()
    people: frozenset[str] = frozenset()
    areas: frozenset[str] = frozenset()
    numbers: dict[str, tuple[NumericConstraint, ...]] = {}
    for turn in (*history, current):
        # another town drops the area of the old one; a new area keeps the town
        areas = turn.areas or (frozenset() if turn.places and turn.places != places else areas)
        places = turn.places or places
        products = turn.products or products
        people = turn.people or people
        for slot in dict.fromkeys(n.slot for n in turn.numbers):
            numbers.pop(slot, None)
            numbers[slot] = turn.values(slot)
    merged = tuple(n for values in numbers.values() for n in values)
    return Entities(places=places, products=products, people=people, numbers=merged, areas=areas)


def entities_conflict(a: Entities, b: Entities) -> list[str]:
    """Slots on which ``a`` and ``b`` disagree: both name the slot and share none of its values.

    Numeric slots compare per operator, so a budget range 100-150 conflicts with 100-200 (the
    ceilings differ) while a date range overlapping a single date does not.
    """
    conflicts = [
        name
        for name, left, right in (("places", a.places, b.places), ("areas", a.areas, b.areas),
                                  ("products", a.products, b.products), ("people", a.people, b.people))
        if left and right and not left & right
    ]  # fmt: skip
    for slot in sorted(a.slots() & b.slots()):
        left = {n.key() for n in a.values(slot)}
        right = {n.key() for n in b.values(slot)}
        shared_ops = {op for op, _ in left} & {op for op, _ in right}
        if not shared_ops or any(
            not {v for op, v in left if op == o} & {v for op, v in right if op == o} for o in shared_ops
        ):
            conflicts.append(slot)
    return conflicts
