"""Numeric constraints pinned by a text: money (budgets, prices, ceilings, floors), quantities
with units (days, nights, people, items), dates, weekdays and clock times."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from proxy.core.text.normalize import CJK

Op = Literal["<=", ">=", "="]


# --- numbers --------------------------------------------------------------------------------
_EN_NUMBERS: Final = {
    word: str(value)
    for value, word in enumerate(
        ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
    )
}
_EN_NUMBER_WORD: Final = re.compile(r"\b(" + "|".join(_EN_NUMBERS) + r")\b(?=[ -][a-z])")
_NUM: Final = r"\d+(?:\.\d+)?"
_CURRENCY_BEFORE: Final = {"¥": "CNY", "$": "USD", "€": "EUR", "£": "GBP", "rmb": "CNY", "usd": "USD"}
_CURRENCY_AFTER: Final = {
    "元": "CNY", "块钱": "CNY", "块": "CNY", "人民币": "CNY", "rmb": "CNY", "cny": "CNY", "yuan": "CNY",
    "美元": "USD", "美金": "USD", "dollars": "USD", "dollar": "USD", "bucks": "USD", "usd": "USD",
    "欧元": "EUR", "euros": "EUR", "euro": "EUR", "eur": "EUR", "英镑": "GBP", "pounds": "GBP",
}  # fmt: skip
_MONEY: Final = re.compile(
    rf"(?<![a-z\d.])(?P<pre>¥|\$|€|£|rmb ?|usd ?)?(?P<lo>{_NUM})(?:\s?(?:-|~|到|至|to)\s?(?:¥|\$|€|£)?(?P<hi>{_NUM}))?"
    rf"\s?(?P<post>{'|'.join(sorted(_CURRENCY_AFTER, key=len, reverse=True))}(?![a-z]))?"
)
_BUDGET_CUE: Final = re.compile(r"预算|budget|afford|spend|花费|价位|控制在|价格区间|price range")
_PRICE_CUE: Final = re.compile(r"价格|售价|报价|价钱|定价|到手价|门票|票价|人均|房价|price|costs?|priced|fare|fee")
_CEILING_CUE: Final = re.compile(
    r"不超过|不高于|最多|至多|低于|少于|不到|以内|以下|之内|under|below|less than|within|at most|max|up to|"
    r"no more than|cheaper than|or less"
)
_FLOOR_CUE: Final = re.compile(r"以上|起步|不低于|至少|at least|more than|over|above|or more|minimum")
_UNITS: Final[tuple[tuple[str, str, str, float], ...]] = (
    # (pattern, slot, unit, factor): the first matching unit after a number decides its slot
    (r"日游|天(?![后前以之])|-?days?(?! ago| later| before| after)", "duration_days", "day", 1.0),
    (r"个?(?:星期|礼拜)|周(?![一二三四五六日天末])|-?weeks?", "duration_days", "day", 7.0),
    (r"晚|夜|-?nights?", "nights", "night", 1.0),
    (r"个?小时|-?hours?", "duration_hours", "hour", 1.0),
    (r"公斤|千克|kg|kilos?|kilograms?", "weight", "kg", 1.0),
    (r"斤", "weight", "kg", 0.5),
    (r"克|grams?", "weight", "kg", 0.001),
    (r"lbs?|pounds?(?! sterling)", "weight", "kg", 0.4536),
    (r"个?人|位|people|persons?|adults?|guests?|travell?ers?", "party_size", "person", 1.0),
    (r"句话?|sentences?", "count", "sentence", 1.0),
    (r"段|paragraphs?", "count", "paragraph", 1.0),
    (r"字|words?", "length", "word", 1.0),
    (r"款|种|个|条|本|台|部|家|首|篇|项|件|道|套|名|份|处|座", "count", "item", 1.0),
    (
        r"(?:[a-z][a-z-]* ){0,2}?(?:bullet points?|items?|options?|ideas?|examples?|tips?|points?|reasons?|ways?|"
        r"books?|products?|laptops?|phones?|recommendations?|suggestions?|names?|places?|restaurants?|hotels?|"
        r"questions?|steps?|attractions?|dishes|titles?|slogans?|lines?|movies?|films?|songs?|recipes?)\b",
        "count",
        "item",
        1.0,
    ),
)
_UNIT_RES: Final = tuple((re.compile(p), s, u, f) for p, s, u, f in _UNITS)

_MONTH_NAMES: Final = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTHS: Final = {m: i + 1 for i, m in enumerate(_MONTH_NAMES)}
_MONTH_RE: Final = r"(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_DATE_PATTERNS: Final = (
    (re.compile(r"(?<!\d)(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?!\d)"), "ymd"),
    (re.compile(r"(?:(\d{4})年)?(\d{1,2})月(\d{1,2})[日号]"), "ymd"),
    (re.compile(rf"\b{_MONTH_RE} (\d{{1,2}})(?:st|nd|rd|th)?\b(?:,? (\d{{4}}))?"), "mdy"),
    (re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)? (?:of )?{_MONTH_RE}(?:,? (\d{{4}}))?"), "dmy"),
)
_WEEKDAYS: Final = re.compile(
    r"\b(monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b|(?:星期|周|礼拜)([一二三四五六日天1-7])"
)
_EN_WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAY_VALUE: Final = {**{d: i + 1 for i, d in enumerate("一二三四五六")}, "日": 7, "天": 7}
_CLOCK: Final = re.compile(
    r"(?<![\d:.])(?P<h12>\d{1,2})(?::(?P<m12>\d{2}))?\s?(?P<ampm>am|pm|a\.m\.|p\.m\.)"
    r"|(?<![\d:.])(?P<h24>\d{1,2}):(?P<m24>\d{2})(?![\d:])"
    # 3点 alone is as often "3 points" (给我3点建议) as 3 o'clock: a time needs a period or a suffix
    r"|(?P<period>上午|早上|中午|下午|晚上|凌晨|今晚|明早|今天|明天|后天)?(?<!\d)(?P<hzh>\d{1,2})点(?P<tail>半|钟|整|\d{1,2}分?)?"
)


@dataclass(frozen=True)
class NumericConstraint:
    """A number the user pinned: ``budget <= 8000 CNY``, ``duration_days = 3 day``."""

    slot: str
    value: float
    unit: str
    op: Op = "="

    def key(self) -> tuple[str, float]:
        value = self.value % 10000 if self.slot == "date" and self.value >= 10000 else self.value
        return (self.op, round(value, 4))


def _clause_before(text: str, start: int, width: int = 14) -> str:
    window = text[max(0, start - width) : start]
    return re.split(r"[,;!?\n]|\.(?!\d)", window)[-1]


def _money(text: str, taken: list[tuple[int, int]]) -> list[NumericConstraint]:
    found: list[NumericConstraint] = []
    for m in _MONEY.finditer(text):
        before, after = _clause_before(text, m.start()), text[m.end() : m.end() + 6]
        currency = _CURRENCY_BEFORE.get((m.group("pre") or "").strip()) or _CURRENCY_AFTER.get(m.group("post") or "")
        budget = bool(_BUDGET_CUE.search(before))
        cued = budget or bool(_PRICE_CUE.search(before))
        if currency is None and not (cued and not _unit_after(text, m.end())):
            continue
        taken.append(m.span())
        slot = "budget" if budget or _CEILING_CUE.search(before + after) else "price"
        unit = currency or ("CNY" if re.search(rf"[{CJK}]", before + after) else "")
        lo, hi = float(m.group("lo")), m.group("hi")
        if hi is not None:
            found += [NumericConstraint(slot, lo, unit, ">="), NumericConstraint(slot, float(hi), unit, "<=")]
            continue
        op: Op = "<=" if slot == "budget" else "="
        if _FLOOR_CUE.search(before + after[:4]):
            op = ">="
        elif _CEILING_CUE.search(before + after[:4]):
            op = "<="
        found.append(NumericConstraint(slot, lo, unit, op))
    return found


def _unit_after(text: str, end: int) -> tuple[str, str, float, str] | None:
    """Slot, unit, factor and the unit's own text, for the unit that follows a number."""
    rest = text[end : end + 30].lstrip()
    for pattern, slot, unit, factor in _UNIT_RES:
        match = pattern.match(rest)
        if match:
            return slot, unit, factor, match.group()
    return None


_CJK_MEASURES: Final = frozenset("款种个条本台部家首篇项件道套名份处座")
_RELATIVE_DAY: Final = re.compile(r"\s?(?:天|days?)?\s?(?:多|几|左右)?\s?(?:后|前|以后|之后|以前|ago|later)")
_COUNT_CUE: Final = re.compile(
    r"推荐|列出|列举|给我|来|找|写|介绍|提供|选|挑|整理|总结|生成|想要|需要|要|说出|举|"
    r"list|give me|suggest|recommend|top|write|name|provide|pick|choose|show me|find|in|with|into|generate"
)


def _quantities(text: str, taken: list[tuple[int, int]]) -> list[NumericConstraint]:
    found: list[NumericConstraint] = []
    for m in re.finditer(rf"(?<![a-z\d.:/-]){_NUM}(?![\d.:/])", text):
        if any(a <= m.start() < b for a, b in taken) or text[max(0, m.start() - 1) : m.start()] == "第":
            continue
        unit = _unit_after(text, m.end())
        if unit is None:
            continue
        slot, unit_name, factor, unit_text = unit
        before = _clause_before(text, m.start(), 10)
        if slot == "count" and unit_text[:1] in _CJK_MEASURES and not _COUNT_CUE.search(before):
            continue  # "3个" needs a request verb to be a count; "3 tips" says so itself
        if slot == "duration_days" and _RELATIVE_DAY.match(text, m.end()):
            continue  # 3天后 / 3 days later: a date offset, not a stay
        op: Op = "<=" if _CEILING_CUE.search(before + text[m.end() : m.end() + 8]) and slot == "weight" else "="
        found.append(NumericConstraint(slot, round(float(m.group()) * factor, 4), unit_name, op))
    return found


def extract_dates(text: str) -> tuple[NumericConstraint, ...]:
    """Calendar dates of a normalised text; value YYYYMMDD, or MMDD when the year is not given."""
    found: list[NumericConstraint] = []
    for pattern, order in _DATE_PATTERNS:
        for m in pattern.finditer(text):
            groups = m.groups()
            if order == "ymd":
                year, month, day = groups[0], int(groups[1]), int(groups[2])
            elif order == "mdy":
                month, day, year = _MONTHS[groups[0][:3]], int(groups[1]), groups[2]
            else:
                day, month, year = int(groups[0]), _MONTHS[groups[1][:3]], groups[2]
            if 1 <= month <= 12 and 1 <= day <= 31:
                value = (int(year) * 10000 if year else 0) + month * 100 + day
                found.append(NumericConstraint("date", float(value), "ymd" if year else "md"))
    return tuple(dict.fromkeys(found))


def _is_clock(m: re.Match[str]) -> bool:
    return not m.group("hzh") or bool(m.group("period") or m.group("tail"))


def _times(text: str) -> list[NumericConstraint]:
    found: list[NumericConstraint] = []
    for m in _WEEKDAYS.finditer(text):
        name, zh = m.group(1), m.group(2)
        value = _EN_WEEKDAYS.index(name) + 1 if name else _WEEKDAY_VALUE.get(zh) or int(zh)
        found.append(NumericConstraint("weekday", float(value), "weekday"))
    for m in _CLOCK.finditer(text):
        if m.group("h12"):
            hour, minute, pm = int(m.group("h12")), int(m.group("m12") or 0), m.group("ampm").startswith("p")
        elif m.group("h24"):
            hour, minute, pm = int(m.group("h24")), int(m.group("m24")), False
        elif _is_clock(m):
            hour, pm = int(m.group("hzh")), m.group("period") in ("下午", "晚上", "今晚")
            tail = m.group("tail") or ""
            minute = 30 if tail == "半" else int(tail.rstrip("分")) if tail[:1].isdigit() else 0
        else:
            continue
        if pm and hour < 12:
            hour += 12
        if hour <= 24 and minute < 60:
            found.append(NumericConstraint("time", float(hour * 100 + minute), "hhmm"))
    return found


def extract_numbers(text: str) -> tuple[NumericConstraint, ...]:
    """Numeric constraints of a normalised text, in order of appearance within each kind."""
    text = _EN_NUMBER_WORD.sub(lambda m: _EN_NUMBERS[m.group(1)], text)
    dates = extract_dates(text)
    blanked = text
    for pattern, _ in _DATE_PATTERNS:
        blanked = pattern.sub(lambda m: " " * len(m.group()), blanked)
    times = _times(blanked)
    blanked = _CLOCK.sub(lambda m: " " * len(m.group()) if _is_clock(m) else m.group(), blanked)
    taken: list[tuple[int, int]] = []
    money = _money(blanked, taken)
    return (*money, *_quantities(blanked, taken), *dates, *times)
