"""A record's tags and key facts: typed values, stored as JSON in the format every version wrote."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from proxy.core.model import KeyFacts, RecordTags
from proxy.core.text.entities import Entities
from proxy.core.text.normalize import NormalText
from proxy.core.text.numbers import NumericConstraint
from tests.factories import make_signature

HANGZHOU = Entities(places=frozenset({"杭州"}), numbers=(NumericConstraint("budget", 8000.0, "CNY", "<="),))
HANGZHOU_JSON = {
    "places": ["杭州"],
    "products": [],
    "people": [],
    "numbers": [["budget", 8000.0, "CNY", "<="]],
    "areas": [],
}
# the tags as Signature.record_tags wrote them before they were typed, key for key
CURRENT = {
    "intent": "travel",
    "entities": HANGZHOU_JSON,
    "change_instruction": False,
    "context_switch": True,
    "question": "杭州3天行程",
    "previous_reply": "好的",
    "turn": 2,
    "question_raw": "杭州三天行程",
    "previous_question": "我想去杭州",
    "previous_reply_head": "好的，",
    "history": "h-1",
}


@pytest.mark.parametrize(
    "stored",
    [CURRENT, {**CURRENT, "cut_at": 16}, {**CURRENT, "history": ""}],
    ids=["current", "cut at a token limit", "first turn"],
)
def test_the_stored_format_reads_and_writes_back_unchanged(stored: dict[str, Any]) -> None:
    assert RecordTags.from_json(stored).to_json() == stored


# Records of older versions lack the keys added since; each reads as what its absence meant
OLD = {
    "intent": "travel",
    "entities": {k: v for k, v in HANGZHOU_JSON.items() if k != "areas"},
    "change_instruction": False,
    "context_switch": False,
    "question": "杭州3天行程",
    "previous_reply": "",
}
OLD_TAGS = RecordTags(intent="travel", entities=HANGZHOU, question=NormalText("杭州3天行程"))


@pytest.mark.parametrize(
    ("stored", "tags"),
    [
        # before turns, the verifier's sides, the history key and cut answers were kept
        (OLD, OLD_TAGS),
        ({**OLD, "turn": 3}, dataclasses.replace(OLD_TAGS, turn=3)),
        ({}, RecordTags()),
    ],
    ids=["first format", "with turns", "nothing kept"],
)
def test_older_formats_read_as_what_their_missing_keys_meant(stored: dict[str, Any], tags: RecordTags) -> None:
    read = RecordTags.from_json(stored)
    assert read == tags
    # no history kept: the record is another conversation's to every request, the first turn's too
    assert read.history is None and read.cut_at is None
    assert RecordTags.from_json(read.to_json()) == read


def test_a_signature_records_what_the_guards_and_the_verifier_compare() -> None:
    sig = make_signature(
        intent="travel",
        entities=HANGZHOU,
        current_text=NormalText("q" * 700),
        previous_reply="好的",
        turn_index=2,
        question_raw="Q",
        previous_question="P",
        previous_reply_head="R",
        history_key="h-1",
    )
    tags = sig.record_tags()
    assert tags == RecordTags(
        intent="travel",
        entities=HANGZHOU,
        question=NormalText("q" * 600),
        previous_reply="好的",
        turn=2,
        question_raw="Q",
        previous_question="P",
        previous_reply_head="R",
        history="h-1",
    )
    assert sig.record_tags(cut_at=16).cut_at == 16


@pytest.mark.parametrize(
    "facts",
    [
        KeyFacts(),
        KeyFacts(
            money=((8000.0, "CNY"),),
            numbers_with_units=((3.0, "day"),),
            dates=(20261205,),
            list_items=5,
            day_sections=3,
            sentences=4,
            paragraphs=2,
            places=frozenset({"杭州", "苏州"}),
            products=frozenset({"iPhone"}),
        ),
    ],
)
def test_key_facts_round_trip(facts: KeyFacts) -> None:
    assert KeyFacts.from_json(facts.to_json()) == facts
