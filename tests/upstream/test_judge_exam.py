"""The judge's exam against real judges: the embedded SmolLM2-135M, which judges pairs at chance
and must never decide anything, and the protocol's reading of what a judge replies."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.upstream.client import Upstream
from proxy.upstream.engine import LocalEngine
from proxy.upstream.judge import JUDGE_QUESTION, Judge, judge_body, read_verdict
from proxy.upstream.judge_exam import EXAM, MAX_FALSE_NO, MAX_FALSE_YES, ExamResult, Qualification


def reply(content: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": content}}]}


@pytest.mark.parametrize(
    ("content", "yes"),
    [
        ("yes", True),
        ("Yes.", True),
        (" YES", True),
        ("是", True),
        ("no", False),
        ("No, it is not.", False),
        ("Maybe", False),  # neither yes nor no counts as no
        ("", False),
        (None, False),
        ("The answer is yes", False),  # the first word decides: a rambling judge decides nothing
    ],
)
def test_the_first_word_of_the_reply_is_the_verdict(content: Any, yes: bool) -> None:
    assert read_verdict(reply(content)) is yes


def test_malformed_replies_are_a_no() -> None:
    assert read_verdict({}) is False
    assert read_verdict({"choices": []}) is False


def test_the_judge_protocol_appends_the_cached_answer_and_the_question() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    body = judge_body(messages, "A", "m", logprobs=True)
    assert body["messages"] == [
        *messages,
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": JUDGE_QUESTION},
    ]
    assert (body["max_tokens"], body["temperature"], body["logprobs"], body["stream"]) == (2, 0, True, False)


def test_the_exam_is_bilingual_balanced_and_strict() -> None:
    assert sum(i.expect for i in EXAM) == sum(not i.expect for i in EXAM) >= 12
    assert any("\u4e00" <= i.question[0] <= "\u9fff" for i in EXAM)
    assert ExamResult(MAX_FALSE_YES, MAX_FALSE_NO, 0).passed
    assert not ExamResult(MAX_FALSE_YES + 1, 0, 0).passed
    assert not ExamResult(0, MAX_FALSE_NO + 1, 0).passed
    assert not ExamResult(0, 0, 1).passed  # an exam it could not answer is not passed


@pytest.mark.engine
@pytest.mark.timeout(600)
async def test_the_embedded_engine_fails_the_exam() -> None:
    async with LocalEngine(parallel=2) as engine:
        upstream = Upstream(engine.base_url, timeout=60.0, connect_timeout=10.0)
        try:
            judge = Judge(upstream, timeout=60.0)
            qualification = Qualification(judge)
            qualification.ensure("smollm2", dict)
            for _ in range(1200):
                if qualification.standings()["smollm2"] != "pending":
                    break
                await asyncio.sleep(0.25)
            result = qualification.results()["smollm2"]
            print(f"\n[judge] SmolLM2-135M on the exam: {result}")
            assert qualification.standings()["smollm2"] == "failed"
            assert not qualification.ready("smollm2")
            assert result is not None and result.unanswered == 0  # it answered, and judged badly
            await qualification.close()
        finally:
            await upstream.close()
