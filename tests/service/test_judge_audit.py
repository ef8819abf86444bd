"""The judge audited (proxy.service.judging): each verdict becomes a label read against the
forwarded answer, and a judge whose yes that answer contradicts too often stops deciding."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from proxy.core.decision.judging import AskJudge
from proxy.core.learning import Label, Source
from proxy.core.model import Candidate, Decision, Reason, Status
from proxy.service.judging import MIN_CHECKED, JudgeAudit, Judging, Verdicts
from proxy.upstream.client import Upstream
from proxy.upstream.judge import Judge
from proxy.upstream.judge_exam import Qualification
from tests.factories import make_record

CACHED = "Your order A1001 ships on Monday."
AGREEING = "Order A1001 ships on Monday."
CONTRADICTING = "Your order B2002 ships on Friday."


class Levels:
    """What the judging hands the learned levels: labels kept, a source distrusted."""

    def __init__(self) -> None:
        self.kept: list[Label] = []
        self.distrusted: set[Source] = set()

    async def add(self, tenant: str, labels: list[Label]) -> None:
        self.kept.extend(labels)

    def distrust(self, source: Source) -> None:
        self.distrusted.add(source)


def judging() -> tuple[Judging, Levels]:
    judge = Judge(Upstream("http://127.0.0.1:9", timeout=1, connect_timeout=1), model="m")
    qualification = Qualification(judge)
    qualification.ensure = lambda *a: None  # type: ignore[method-assign]  # no exam: passed below
    qualification._models["m"] = SimpleNamespace(state="passed", task=None)  # type: ignore[assignment]
    write_back: Any = SimpleNamespace(cache=SimpleNamespace(clock=lambda: 1000.0))
    levels = Levels()
    return Judging(judge, qualification, write_back, levels), levels  # type: ignore[arg-type]


def verdicts(said: bool, score: float = 0.9) -> Verdicts:
    """One candidate, ``sc-1`` holding ``CACHED``, ranked by the verifier at ``score`` and judged."""
    record = make_record(cache_id="sc-1", answer_text=CACHED)
    decision = Decision(Status.HALF_HIT, Reason.CANDIDATE_ZONE, record, 0.9)
    v = Verdicts("t-1", "general", "u-1", "m")
    v.ranked = AskJudge((Candidate(record, 0.9, 0.9),), decision, {"sc-1": score})
    v.said, v.asked = {"sc-1": said}, True
    return v


async def test_a_verdict_becomes_a_label_read_against_the_forwarded_answer() -> None:
    j, levels = judging()
    j.answered(verdicts(True), None)  # served on the yes: the judge's word is the label
    j.answered(verdicts(False), AGREEING)  # a no the forwarded answer agrees with: right after all
    j.answered(verdicts(True), CONTRADICTING)  # a yes the forwarded answer contradicts: wrong
    j.answered(verdicts(False), "Something else entirely, with nothing to compare.")
    await j.landed()
    assert [(lb.right, lb.source) for lb in levels.kept] == [
        (True, Source.JUDGE),
        (True, Source.AGREEMENT),
        (False, Source.AGREEMENT),
        (False, Source.JUDGE),
    ]
    assert all(lb.score == 0.9 and lb.user == "u-1" and lb.intent == "general" for lb in levels.kept)
    assert j.audits["m"] == JudgeAudit(checked=1, contradicted=1)


async def test_a_level_served_answer_is_no_label() -> None:
    j, levels = judging()
    v = verdicts(True)
    v.learned.add("sc-1")
    j.answered(v, None)
    await j.landed()
    assert levels.kept == []


async def test_labels_wait_for_both_the_judge_and_the_answer() -> None:
    j, levels = judging()
    v = verdicts(False)
    v.asked = False
    j.answered(v, AGREEING)
    assert not v.labelled
    v.asked = True
    j._settle(v)
    j._settle(v)  # once only
    await j.landed()
    assert len(levels.kept) == 1


async def test_a_judge_whose_yes_is_contradicted_stops_deciding() -> None:
    j, levels = judging()
    assert j.qualification.ready("m")
    for _ in range(MIN_CHECKED - 1):
        j.answered(verdicts(True), CONTRADICTING)
    assert j.qualification.ready("m")  # too few checked to say
    j.answered(verdicts(True), CONTRADICTING)
    assert not j.qualification.ready("m")
    assert j.qualification.standings() == {"m": "contradicted"}
    assert levels.distrusted == {Source.JUDGE}
    await j.landed()


async def test_a_judge_mostly_confirmed_keeps_deciding() -> None:
    j, _ = judging()
    for i in range(100):
        j.answered(verdicts(True), CONTRADICTING if i % 25 == 0 else AGREEING)  # 4 % contradicted
    assert j.audits["m"] == JudgeAudit(checked=100, contradicted=4)
    assert j.qualification.ready("m")
    await j.landed()
