"""The judge's side of a request: ask it about the candidates a plan names (``Plan.ask``), resume
the decision with its verdicts, remember them, and learn from them (docs/architecture.md, "The
judge" and "Learned levels").

The pair verifier ranks the candidates and drops those below the intent's level
(``SemanticCache.ranked``) here, once the judging has started, not in the lookup: a raced forward
goes out as the ranking starts, so a no costs a miss nothing where the verdict comes before the
forward's first byte. Meanwhile the judge already reads the nearest candidate; its verdict counts
only where the verifier keeps that candidate, so the verifier's time is not added to the judge's
(bench_overhead.py's judged rows). Then the candidates are read one at a time in the verifier's
order, and the first yes ends it: a yes must be the first right one, and a request rarely needs a
second call. A verdict that comes after the deadline is still remembered: a no is not asked again
for that wording, a yes makes the wording an alias of the record, so the next time it is asked it
is an exact repeat and costs no call.

Where the tenant's labels have earned the intent a level (``LearnedLevels``) and the verifier
scores the best candidate at or above it, the candidate is served without asking, except for an
``audit_rate`` sample that is still judged. Every verdict leaves a label once the request's answer
is known: a forwarded answer is compared with each judged candidate's (``core/text/agreement.py``),
which overrules a verdict it plainly contradicts, and a yes it contradicts counts against the judge
(``JudgeAudit``); where a level is in force (the judge's labels already decide requests on their
own), an ``audit_rate`` sample of the judge's yes is forwarded instead of served for that.
Samples are drawn by the wording's hash: the same wording is audited every time or never, so a
replay is repeatable.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from proxy.core.decision.judging import AskJudge, judged
from proxy.core.identity import Identity
from proxy.core.learning import Label, Source, lower_bound, sampled
from proxy.core.lru import LruDict
from proxy.core.model import Candidate, Decision
from proxy.core.openai.request import ChatRequest
from proxy.core.text.agreement import Verdict, agreement
from proxy.core.text.normalize import Cutter
from proxy.service.learning import LearnedLevels, user_of
from proxy.service.planner import Plan
from proxy.service.writeback import WriteBack
from proxy.upstream.judge import Judge
from proxy.upstream.judge_exam import Qualification

__all__ = ["JudgeAudit", "Judging", "Verdicts"]

# A judge stops deciding once its yes is contradicted by the forwarded answer this often, at the
# lower confidence bound. The comparison itself reads some answers to one question as disagreeing
# (bench_agreement's same-question pairs: about one in eight in English), so a sound judge sits
# under this; one saying yes to a third of the wrong answers it reads sits well over it
MAX_CONTRADICTED: Final = 0.2
MIN_CHECKED: Final = 10
SERVED_KEPT: Final = 65_536  # sessions whose last judged or learned hit is remembered for their feedback


@dataclass
class Verdicts:
    """What the judge has said so far about one request's candidates (cache id → yes), and the
    command as the verifier ranked it (its candidates' records and scores), once it has; then what
    the labels need besides: who asked, and the request's own answer once known."""

    tenant: str = ""
    intent: str = ""
    user: str = ""
    model: str = ""
    session: str = ""
    said: dict[str, bool] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    ranked: AskJudge | None = None
    learned: set[str] = field(default_factory=set)  # served by a learned level, not asked
    audited: set[str] = field(default_factory=set)  # a yes forwarded instead, for the comparison
    asked: bool = False  # the judge's task has ended
    fresh: str | None = None  # the forwarded answer
    answered: bool = False  # the request has its answer: served, forwarded, or failed
    labelled: bool = False


@dataclass
class JudgeAudit:
    """The judge's yes checked against the forwarded answer, per model: ``checked`` of them read
    plainly by the comparison, ``contradicted`` of those wrong."""

    checked: int = 0
    contradicted: int = 0

    @property
    def distrusted(self) -> bool:
        return self.checked >= MIN_CHECKED and lower_bound(self.contradicted, self.checked) > MAX_CONTRADICTED


@dataclass(frozen=True, slots=True)
class _Served:
    """A hit served on a verdict (or a level): what a regenerate or correction of it labels."""

    cache_id: str
    score: float
    tenant: str
    intent: str
    user: str
    model: str
    learned: bool


def _retrieved(task: asyncio.Future[bool | None]) -> None:
    """A verdict nobody waited for (the verifier dropped its candidate) is not logged as lost."""
    if not task.cancelled():
        task.exception()


class Judging:
    def __init__(
        self,
        judge: Judge,
        qualification: Qualification,
        write_back: WriteBack,
        levels: LearnedLevels | None = None,
        segmenter: Cutter | None = None,
    ) -> None:
        """``levels``: where labels are kept and levels fitted; None learns nothing."""
        self.judge, self.qualification, self.write_back = judge, qualification, write_back
        self.levels, self.segmenter = levels, segmenter
        self._remembering: set[asyncio.Task[None]] = set()
        self.decided = {"served": 0, "refused": 0, "late": 0, "learned": 0, "audited": 0}
        self.audits: dict[str, JudgeAudit] = {}
        # each session's last hit served on a verdict or a level, until the user's feedback on it
        self._served: LruDict[tuple[str, str], _Served] = LruDict(SERVED_KEPT)

    def ready(self, model: str, headers: Callable[[], Mapping[str, str]]) -> bool:
        """May the judge decide for ``model``? Examines it first (in the background, with the
        credentials ``headers`` gives) if need be."""
        self.qualification.ensure(model, headers)
        return self.qualification.ready(model)

    def start(self, req: ChatRequest, who: Identity, plan: Plan, headers: Mapping[str, str]) -> Verdicts:
        """Rank ``plan.ask``'s candidates and ask about them in a task of its own that outlives the
        request: what the judge says, even late, is remembered."""
        assert plan.ask is not None and plan.policy is not None
        verdicts = Verdicts(who.tenant, plan.policy.name, user_of(who), self.judge.model or req.model, who.session)
        self._track(self._ask(req, who, plan, plan.ask, dict(headers), verdicts))
        return verdicts

    def _track(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._remembering.add(task)
        task.add_done_callback(self._remembering.discard)

    async def decide(self, ask: AskJudge, verdicts: Verdicts, deadline: float | None) -> Decision:
        """The decision resumed with what the judge said within ``deadline`` seconds about ``ask``'s
        candidates, as the verifier ranked them (all of them late where it had not yet)."""
        late = False
        try:
            await asyncio.wait_for(verdicts.done.wait(), deadline)
        except TimeoutError:
            late = True
        asked = ask if verdicts.ranked is None else verdicts.ranked
        decision = judged(
            asked,
            dict(verdicts.said),
            late=late,
            learned=frozenset(verdicts.learned),
            audited=frozenset(verdicts.audited),
        )
        if asked:  # none the verifier kept: the judge was not asked, the decision stands
            self.decided[_outcome(decision, late)] += 1
        if decision.is_hit and decision.record is not None and decision.verified is not None:
            v, cache_id = verdicts, decision.record.cache_id
            served = _Served(cache_id, decision.verified, v.tenant, v.intent, v.user, v.model, cache_id in v.learned)
            self._served.put((v.tenant, v.session), served)
        return decision

    def corrected(self, who: Identity, cache_id: str) -> None:
        """The user regenerated or corrected the hit ``cache_id`` served to this session: where it
        was served on a verdict or a level, a wrong label, and for a verdict, a yes contradicted."""
        served = self._served.pop((who.tenant, who.session))
        if served is None or served.cache_id != cache_id:
            return
        if not served.learned:
            audit = self.audits.setdefault(served.model, JudgeAudit())
            audit.checked += 1
            audit.contradicted += 1
            self._distrust_if_due(served.model, audit)
        if self.levels is not None:
            now = self.write_back.cache.clock()
            label = Label(served.intent, served.score, False, Source.FEEDBACK, served.user, cache_id, now)
            self._track(self.levels.add(served.tenant, [label]))

    def answered(self, verdicts: Verdicts, fresh: str | None) -> None:
        """The request has its answer: ``fresh``, the forwarded one, or None (served from the cache,
        or no answer came). Its labels are kept once the judge's task has ended too."""
        verdicts.fresh, verdicts.answered = fresh, True
        self._settle(verdicts)

    async def _ask(
        self, req: ChatRequest, who: Identity, plan: Plan, ask: AskJudge, headers: dict[str, str], out: Verdicts
    ) -> None:
        assert plan.signature is not None and plan.policy is not None
        messages = req.forward_body.get("messages") or []
        policy, request_hash = plan.policy, plan.signature.request_hash
        refused: set[str] = set()

        def verdict(cand: Candidate) -> Awaitable[bool | None]:
            return self.judge.verdict(messages, cand.record.answer_text, model=req.model, headers=headers)

        level = None
        if self.levels is not None and policy.learns:
            level = await self.levels.level(who.tenant, policy)
        nearest = ask.candidates[0]
        # where a level may serve without asking, no call goes out before the verifier has spoken
        early = None if level is not None else asyncio.ensure_future(verdict(nearest))
        if early is not None:
            early.add_done_callback(_retrieved)
        try:
            ranked = out.ranked = await self.write_back.cache.ranked(ask, plan.signature, policy)
            best = ranked.candidates[0] if ranked else None
            if (
                best is not None
                and level is not None
                and self.levels is not None
                and ranked.probabilities.get(best.record.cache_id, 0.0) >= level.score
                and not sampled(request_hash, policy.audit_rate, "level")
            ):
                out.said[best.record.cache_id] = True
                out.learned.add(best.record.cache_id)
                self.levels.saved[policy.name] += 1
                out.done.set()
                await self.write_back.alias(best.record, req, who, plan)
                return
            for cand in ranked.candidates:
                said = await (early if early is not None and cand is nearest else verdict(cand))
                if said is None:
                    break  # no verdict (the cap, an error): the rest would fare no better
                cache_id = cand.record.cache_id
                out.said[cache_id] = said
                if said:
                    if level is not None and sampled(request_hash, policy.audit_rate, "judge"):
                        out.audited.add(cache_id)  # forwarded, and its answer compared with this one
                        break
                    out.done.set()  # the request goes on; the alias is written meanwhile
                    await self.write_back.alias(cand.record, req, who, plan)
                    break
                refused.add(cand.record.cache_id)
        finally:
            if early is not None and not early.done():  # the verifier did not keep it: no longer wanted
                early.cancel()
            out.done.set()
            if refused:
                await self.write_back.cache.verdicts.refuse(who.tenant, request_hash, refused)
            out.asked = True
            self._settle(out)

    def _settle(self, v: Verdicts) -> None:
        """Once both the judge's task and the request have ended: each verdict as a label, read
        against the forwarded answer where there is one, and the judge's yes audited by it."""
        if v.labelled or not (v.asked and v.answered) or v.ranked is None:
            return
        v.labelled = True
        labels: list[Label] = []
        audit = self.audits.setdefault(v.model, JudgeAudit())
        now = self.write_back.cache.clock()
        scores, records = v.ranked.probabilities, {c.record.cache_id: c.record for c in v.ranked.candidates}
        for cache_id, said in v.said.items():
            if cache_id in v.learned or cache_id not in scores:
                continue  # a level's own serve is no evidence for the level
            cached = records[cache_id].answer_text
            reading = None if v.fresh is None else agreement(v.fresh, cached, segmenter=self.segmenter).verdict
            right, source = said, Source.JUDGE
            if reading is Verdict.DISAGREE:
                right, source = False, (Source.AGREEMENT if said else Source.JUDGE)
            elif reading is Verdict.AGREE and not said:
                right, source = True, Source.AGREEMENT
            if said and reading in (Verdict.AGREE, Verdict.DISAGREE):
                audit.checked += 1
                audit.contradicted += reading is Verdict.DISAGREE
            labels.append(Label(v.intent, scores[cache_id], right, source, v.user, cache_id, now))
        self._distrust_if_due(v.model, audit)
        if labels and self.levels is not None:
            self._track(self.levels.add(v.tenant, labels))

    def _distrust_if_due(self, model: str, audit: JudgeAudit) -> None:
        if audit.distrusted and self.qualification.ready(model):
            self.qualification.distrust(model, f"{audit.contradicted} of {audit.checked} checked yes contradicted")
            if self.levels is not None:
                self.levels.distrust(Source.JUDGE)

    async def landed(self, timeout: float = 10) -> None:
        """Until the verdicts under way are remembered (an alias written, a refusal kept, labels kept)."""
        for _ in range(2):  # a judge's task may hand its labels to a task of their own
            if self._remembering:
                with contextlib.suppress(Exception):
                    await asyncio.wait(list(self._remembering), timeout=timeout)

    async def close(self) -> None:
        """Let the verdicts under way land, then stop."""
        await self.landed()


def _outcome(decision: Decision, late: bool) -> str:
    if decision.is_hit:
        return "learned" if decision.reason == "learned" else "served"
    if decision.reason == "judge_audit":
        return "audited"
    return "late" if late and decision.reason == "judge_late" else "refused"
