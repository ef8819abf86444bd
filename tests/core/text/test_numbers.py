"""proxy/core/text/numbers.py: the numeric constraints a text pins (money, quantities with units, dates,
weekdays, clock times), and the numbers that are none."""

from __future__ import annotations

import pytest

from proxy.core.text.normalize import normalize_text
from proxy.core.text.numbers import extract_numbers


def numbers(text: str) -> set[tuple[str, str, float, str]]:
    return {(n.slot, n.op, n.value, n.unit) for n in extract_numbers(normalize_text(text))}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("想买个轻薄本，预算八千以内", {("budget", "<=", 8000, "CNY")}, id="zh-budget-ceiling"),
        pytest.param("预算提高到一万", {("budget", "<=", 10000, "CNY")}, id="zh-budget-raised"),
        pytest.param("预算8k", {("budget", "<=", 8000, "CNY")}, id="k-budget"),
        pytest.param("a laptop under $1200", {("budget", "<=", 1200, "USD")}, id="en-under-dollars"),
        pytest.param("my budget is 900 dollars", {("budget", "<=", 900, "USD")}, id="en-budget-dollars"),
        pytest.param(
            "人均消费在100-150元的餐馆",
            {("price", ">=", 100, "CNY"), ("price", "<=", 150, "CNY")},
            id="zh-price-range",
        ),
        pytest.param("在杭州玩三天", {("duration_days", "=", 3, "day")}, id="zh-days"),
        pytest.param("plan 3 days in Rome", {("duration_days", "=", 3, "day")}, id="en-days"),
        pytest.param("a five-day trip", {("duration_days", "=", 5, "day")}, id="en-number-word-days"),
        pytest.param("a 2-week trip", {("duration_days", "=", 14, "day")}, id="weeks-to-days"),
        pytest.param("summarise it in 5 sentences", {("count", "=", 5, "sentence")}, id="en-sentences"),
        pytest.param("推荐三款降噪耳机", {("count", "=", 3, "item")}, id="zh-count"),
        pytest.param("give me four ideas for dinner", {("count", "=", 4, "item")}, id="en-count"),
        pytest.param("我们三个人住两晚", {("party_size", "=", 3, "person"), ("nights", "=", 2, "night")}, id="party"),
        pytest.param("重量1.5kg以下", {("weight", "<=", 1.5, "kg")}, id="weight-ceiling"),
        pytest.param("6月20日出发", {("date", "=", 620, "md")}, id="zh-date"),
        pytest.param("leave on 2025-06-20", {("date", "=", 20250620, "ymd")}, id="iso-date"),
        pytest.param("leave on June 20", {("date", "=", 620, "md")}, id="en-date"),
        pytest.param("the 20th of June, 2025", {("date", "=", 20250620, "ymd")}, id="en-date-dmy"),
        pytest.param("remind me at 7 pm", {("time", "=", 1900, "hhmm")}, id="clock"),
        pytest.param("下午3点开会", {("time", "=", 1500, "hhmm")}, id="zh-clock"),
        pytest.param("meet at 15:30", {("time", "=", 1530, "hhmm")}, id="24h-clock"),
        pytest.param("给我3点建议", set(), id="zh-points-are-not-a-time"),
        pytest.param("schedule it for Monday", {("weekday", "=", 1, "weekday")}, id="weekday"),
        pytest.param("3天后出发", set(), id="offset-is-not-duration"),
        pytest.param("那就这样吧，谢谢", set(), id="thanks"),
        pytest.param("我们一起去看一下", set(), id="yiqi-is-not-a-number"),
    ],
)
def test_numeric_constraints(text: str, expected: set[tuple[str, str, float, str]]) -> None:
    assert numbers(text) == expected
