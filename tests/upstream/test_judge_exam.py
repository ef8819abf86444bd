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
    right, near_misses = sum(i.expect for i in EXAM), sum(not i.expect for i in EXAM)
    assert right >= 40 and near_misses >= 70  # enough for a 10 % false yes to show
    assert len({(i.question, i.answer) for i in EXAM}) == len(EXAM)
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
            assert judge.exam_counts.calls < len(EXAM)  # a judge at chance fails within a few questions
            await qualification.close()
        finally:
            await upstream.close()


class _Scripted:
    """A judge that answers the exam from a rule, counting its calls."""

    def __init__(self, says: Any) -> None:
        self.says, self.calls = says, 0

    async def chat_json(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        from proxy.upstream.client import JsonAnswer

        self.calls += 1
        word = "yes" if self.says(body["messages"], headers) else "no"
        return JsonAnswer(200, reply(word), b"", {})


@pytest.mark.parametrize(
    ("says", "passed"),
    [
        (lambda _m, h: h["x-smartcache-expect"] == "yes", True),  # a perfect judge
        (lambda _m, _h: True, False),  # one that says yes to everything
        (lambda _m, _h: False, False),  # one that says no to everything
        (lambda m, _h: len(m[-2]["content"]) % 2 == 0, False),  # one at chance
    ],
)
async def test_the_exam_passes_a_good_judge_and_fails_the_others(says: Any, passed: bool) -> None:
    upstream = _Scripted(says)
    qualification = Qualification(Judge(upstream))  # type: ignore[arg-type]
    qualification.ensure("m", dict)
    for _ in range(400):
        if qualification.standings()["m"] != "pending":
            break
        await asyncio.sleep(0.005)
    assert qualification.ready("m") is passed
    if not passed:
        assert upstream.calls < len(EXAM)
