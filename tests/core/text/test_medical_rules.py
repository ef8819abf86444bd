"""The medical rule table: each named rule fires on what it names, and on nothing ordinary."""

from __future__ import annotations

import pytest

from proxy.core.text.medical_rules import MEDICAL_RULES
from proxy.core.text.never_cache import fold

FIRES = [
    ("en_dose", "How many ibuprofen can I take in a day?"),
    ("en_symptom", "I have had a headache and a fever since Monday."),
    ("en_diagnosis", "My blood test results show high cholesterol."),
    ("zh_dose", "布洛芬一次吃几片"),
    ("zh_symptom", "我这两天一直拉肚子"),
    ("zh_diagnosis", "体检报告说转氨酶偏高"),
]


def _fired(text: str) -> list[str]:
    return [name for name, pattern in MEDICAL_RULES if pattern.search(fold(text))]


@pytest.mark.parametrize(("rule", "text"), FIRES)
def test_each_rule_fires_on_what_it_names(rule: str, text: str) -> None:
    assert rule in _fired(text)


def test_the_table_names_each_rule_once() -> None:
    names = [name for name, _ in MEDICAL_RULES]
    assert len(names) == len(set(names)) and {rule for rule, _ in FIRES} == set(names)


@pytest.mark.parametrize(
    "text", ["How does the immune system work?", "What is the capital of France?", "股票和基金有什么区别", ""]
)
def test_ordinary_questions_fire_no_rule(text: str) -> None:
    assert _fired(text) == []
