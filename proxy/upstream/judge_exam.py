"""The judge's qualifying exam: before a model decides anything, it answers questions whose verdict
is known, in both languages, near-misses included (reset against delete, A to B against B to A, one
number changed). A model that fails is never asked to decide; the embedded SmolLM2 judges pairs at
chance and fails (tests/upstream/test_judge_exam.py).

Each model is examined on its first request (with that request's credentials, which the upstream
authenticates) and again every ``interval`` seconds, so a model swapped behind the same name is
caught. Exam requests carry ``x-smartcache-judge: exam`` and ``x-smartcache-expect: yes|no``: a model
ignores headers; the replay harness's oracle answers from them with its error model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import structlog

from proxy.upstream.judge import Judge

__all__ = ["EXAM", "ExamItem", "ExamResult", "Qualification", "passes"]

State = Literal["pending", "passed", "failed"]


@dataclass(frozen=True, slots=True)
class ExamItem:
    question: str
    answer: str
    expect: bool


def _pairs() -> tuple[ExamItem, ...]:
    yes = [
        (
            "How do I reset my password?",
            "Open Settings > Account > Reset password, then follow the link we e-mail you.",
        ),
        (
            "I forgot my password, how can I get a new one?",
            "Open Settings > Account > Reset password, then follow the link we e-mail you.",
        ),
        ("What is the capital of France?", "The capital of France is Paris."),
        ("Which city is France's capital?", "The capital of France is Paris."),
        ("How many days are there in a leap year?", "A leap year has 366 days."),
        ("Translate 'good morning' into French.", "Bonjour."),
        ("怎么修改绑定的手机号？", "在“设置 > 账号安全 > 手机号”里点“更换”，按提示验证新号码即可。"),
        ("绑定的手机号要怎么换？", "在“设置 > 账号安全 > 手机号”里点“更换”，按提示验证新号码即可。"),
        ("北京到上海的高铁大概要多久？", "北京到上海的高铁最快约4小时18分，一般在4.5到6小时之间。"),
        ("一年有几个季度？", "一年有四个季度。"),
        ("退货运费谁承担？", "质量问题的退货运费由商家承担，非质量问题由买家承担。"),
        (
            "Can you recommend a cheap Italian restaurant in the city centre?",
            "Pizza Hut City Centre is a cheap Italian place in the centre.",
        ),
    ]
    no = [
        (
            "How do I delete my account?",
            "Open Settings > Account > Reset password, then follow the link we e-mail you.",
        ),
        ("How many days are there in a normal year?", "A leap year has 366 days."),
        ("What is the capital of Germany?", "The capital of France is Paris."),
        ("Translate 'good night' into French.", "Bonjour."),
        (
            "How long is the train from Shanghai to Beijing, and what does a first-class ticket cost?",
            "Beijing to Shanghai by high-speed train takes about 4.5 hours.",
        ),
        ("怎么注销账号？", "在“设置 > 账号安全 > 手机号”里点“更换”，按提示验证新号码即可。"),
        ("上海到北京的机票多少钱？", "北京到上海的高铁最快约4小时18分，一般在4.5到6小时之间。"),
        ("一年有几个月？", "一年有四个季度。"),
        ("换货运费谁承担？要几天到？", "质量问题的退货运费由商家承担，非质量问题由买家承担。"),
        (
            "Can you recommend an expensive Chinese restaurant in the north of the city?",
            "Pizza Hut City Centre is a cheap Italian place in the centre.",
        ),
        ("What is 15% of 80?", "15% of 60 is 9."),
        ("预算8000元，推荐一台笔记本电脑", "预算5000元的话，推荐联想小新Pro 14。"),
    ]
    return tuple(ExamItem(q, a, True) for q, a in yes) + tuple(ExamItem(q, a, False) for q, a in no)


EXAM: tuple[ExamItem, ...] = _pairs()
# a judge may err this often on the exam and still decide: a false yes serves a wrong answer, a
# false no only costs a hit
MAX_FALSE_YES = 1
MAX_FALSE_NO = 2


@dataclass(frozen=True, slots=True)
class ExamResult:
    false_yes: int
    false_no: int
    unanswered: int  # errors, timeouts

    @property
    def passed(self) -> bool:
        return passes(self)


def passes(result: ExamResult) -> bool:
    return result.unanswered == 0 and result.false_yes <= MAX_FALSE_YES and result.false_no <= MAX_FALSE_NO


@dataclass
class _Standing:
    state: State
    at: float
    result: ExamResult | None = None
    task: asyncio.Task[None] | None = None


class Qualification:
    """Which models have passed the exam. ``ready(model)`` is what the request path reads; the exam
    itself runs in the background, so no request ever waits for it."""

    def __init__(
        self,
        judge: Judge,
        *,
        interval: float = 3600.0,
        retry: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.judge, self.interval, self.retry, self.clock = judge, interval, retry, clock
        self._models: dict[str, _Standing] = {}

    def ready(self, model: str) -> bool:
        standing = self._models.get(self.judge.model or model)
        return standing is not None and standing.state == "passed"

    def ensure(self, model: str, headers: Callable[[], Mapping[str, str]]) -> None:
        """Examine ``model`` now if it never was, or its last exam is stale (``interval``; a failed
        one that could not be answered, ``retry``)."""
        name = self.judge.model or model
        standing = self._models.get(name)
        now = self.clock()
        if standing is not None:
            if standing.task is not None and not standing.task.done():
                return
            unanswered = standing.result is not None and standing.result.unanswered > 0
            if now - standing.at < (self.retry if unanswered else self.interval):
                return
        new = _Standing("pending" if standing is None else standing.state, now)
        new.task = asyncio.ensure_future(self._examine(name, dict(headers()), new))
        self._models[name] = new

    async def _examine(self, model: str, headers: dict[str, str], standing: _Standing) -> None:
        false_yes = false_no = unanswered = 0
        for item in EXAM:
            said = await self.judge.verdict(
                [{"role": "user", "content": item.question}],
                item.answer,
                model=model,
                headers=headers,
                expect=item.expect,
            )
            if said is None:
                unanswered += 1
            elif said and not item.expect:
                false_yes += 1
            elif not said and item.expect:
                false_no += 1
        result = ExamResult(false_yes, false_no, unanswered)
        standing.result, standing.at = result, self.clock()
        standing.state = "passed" if result.passed else "failed"
        structlog.get_logger("smartcache").info(
            "judge.exam",
            model=model,
            passed=result.passed,
            false_yes=false_yes,
            false_no=false_no,
            unanswered=unanswered,
        )

    def standings(self) -> dict[str, str]:
        """Each examined model's state, for ``/readyz``, ``/metrics`` and ``stats``."""
        return {model: s.state for model, s in self._models.items()}

    def results(self) -> dict[str, ExamResult | None]:
        return {model: s.result for model, s in self._models.items()}

    async def close(self) -> None:
        tasks = [s.task for s in self._models.values() if s.task is not None and not s.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
