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
from proxy.upstream.judge_exam_items import ExamItem, exam_items

__all__ = ["EXAM", "ExamItem", "ExamResult", "Qualification", "passes"]

# "contradicted": passed, but its yes was contradicted by the answers the upstream gave instead
# (proxy.service.judging.JudgeAudit); it decides nothing more in this process, whatever its exams say
State = Literal["pending", "passed", "failed", "contradicted"]


EXAM: tuple[ExamItem, ...] = exam_items()
# A judge may err this often on the exam and still decide: a false yes serves a wrong answer, a
# false no only costs a hit. Over the exam's 76 near-misses, a judge saying yes to 2 % of wrong
# answers passes about 13 times in 14, one saying yes to 10 % about once in 20 (binomial tails);
# over its 49 right answers, one missing 5 % passes 99 times in 100.
MAX_FALSE_YES = 3
MAX_FALSE_NO = 6


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
            if false_yes > MAX_FALSE_YES or false_no > MAX_FALSE_NO:
                break  # failed already: a judge at chance costs a few calls, not the whole exam
        result = ExamResult(false_yes, false_no, unanswered)
        standing.result, standing.at = result, self.clock()
        if standing.state != "contradicted":
            standing.state = "passed" if result.passed else "failed"
        structlog.get_logger("smartcache").info(
            "judge.exam",
            model=model,
            passed=result.passed,
            false_yes=false_yes,
            false_no=false_no,
            unanswered=unanswered,
        )

    def distrust(self, model: str, why: str) -> None:
        """``model``'s yes proved wrong too often in service: it decides nothing more."""
        name = self.judge.model or model
        standing = self._models.setdefault(name, _Standing("contradicted", self.clock()))
        standing.state = "contradicted"
        structlog.get_logger("smartcache").warning("judge.contradicted", model=name, why=why)

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
