"""The judge's side of a request: ask it about the candidates a plan names (``Plan.ask``), resume
the decision with its verdicts, and remember them (docs/architecture.md, "The judge").

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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from proxy.core.decision.judging import AskJudge, judged
from proxy.core.identity import Identity
from proxy.core.model import Candidate, Decision
from proxy.core.openai.request import ChatRequest
from proxy.service.planner import Plan
from proxy.service.writeback import WriteBack
from proxy.upstream.judge import Judge
from proxy.upstream.judge_exam import Qualification

__all__ = ["Judging", "Verdicts"]


@dataclass
class Verdicts:
    """What the judge has said so far about one request's candidates (cache id → yes), and the
    command as the verifier ranked it, once it has."""

    said: dict[str, bool] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    ranked: AskJudge | None = None


def _retrieved(task: asyncio.Future[bool | None]) -> None:
    """A verdict nobody waited for (the verifier dropped its candidate) is not logged as lost."""
    if not task.cancelled():
        task.exception()


class Judging:
    def __init__(self, judge: Judge, qualification: Qualification, write_back: WriteBack) -> None:
        self.judge, self.qualification, self.write_back = judge, qualification, write_back
        self._remembering: set[asyncio.Task[None]] = set()
        self.decided = {"served": 0, "refused": 0, "late": 0}

    def ready(self, model: str, headers: Callable[[], Mapping[str, str]]) -> bool:
        """May the judge decide for ``model``? Examines it first (in the background, with the
        credentials ``headers`` gives) if need be."""
        self.qualification.ensure(model, headers)
        return self.qualification.ready(model)

    def start(self, req: ChatRequest, who: Identity, plan: Plan, headers: Mapping[str, str]) -> Verdicts:
        """Rank ``plan.ask``'s candidates and ask about them in a task of its own that outlives the
        request: what the judge says, even late, is remembered."""
        assert plan.ask is not None
        verdicts = Verdicts()
        task = asyncio.ensure_future(self._ask(req, who, plan, plan.ask, dict(headers), verdicts))
        self._remembering.add(task)
        task.add_done_callback(self._remembering.discard)
        return verdicts

    async def decide(self, ask: AskJudge, verdicts: Verdicts, deadline: float | None) -> Decision:
        """The decision resumed with what the judge said within ``deadline`` seconds about ``ask``'s
        candidates, as the verifier ranked them (all of them late where it had not yet)."""
        late = False
        try:
            await asyncio.wait_for(verdicts.done.wait(), deadline)
        except TimeoutError:
            late = True
        asked = ask if verdicts.ranked is None else verdicts.ranked
        decision = judged(asked, dict(verdicts.said), late=late)
        if asked:  # none the verifier kept: the judge was not asked, the decision stands
            key = "served" if decision.is_hit else "late" if late and decision.reason == "judge_late" else "refused"
            self.decided[key] += 1
        return decision

    async def _ask(
        self, req: ChatRequest, who: Identity, plan: Plan, ask: AskJudge, headers: dict[str, str], out: Verdicts
    ) -> None:
        messages = req.forward_body.get("messages") or []
        refused: set[str] = set()

        def verdict(cand: Candidate) -> Awaitable[bool | None]:
            return self.judge.verdict(messages, cand.record.answer_text, model=req.model, headers=headers)

        nearest = ask.candidates[0]
        early = asyncio.ensure_future(verdict(nearest))
        early.add_done_callback(_retrieved)
        try:
            assert plan.signature is not None and plan.policy is not None
            ranked = out.ranked = await self.write_back.cache.ranked(ask, plan.signature, plan.policy)
            for cand in ranked.candidates:
                said = await (early if cand is nearest else verdict(cand))
                if said is None:
                    break  # no verdict (the cap, an error): the rest would fare no better
                out.said[cand.record.cache_id] = said
                if said:
                    out.done.set()  # the request goes on; the alias is written meanwhile
                    await self.write_back.alias(cand.record, req, who, plan)
                    break
                refused.add(cand.record.cache_id)
        finally:
            if not early.done():  # the verifier did not keep it: its call is no longer wanted
                early.cancel()
            out.done.set()
            if refused and plan.signature is not None:
                await self.write_back.cache.verdicts.refuse(who.tenant, plan.signature.request_hash, refused)

    async def landed(self, timeout: float = 10) -> None:
        """Until the verdicts under way are remembered (an alias written, a refusal kept)."""
        if self._remembering:
            with contextlib.suppress(Exception):
                await asyncio.wait(list(self._remembering), timeout=timeout)

    async def close(self) -> None:
        """Let the verdicts under way land, then stop."""
        await self.landed()
