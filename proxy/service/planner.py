"""The plan of one chat request: bypass, hit, half-hit or miss, with no transport.

Feedback first (reset, regenerate, correction: the user's own words beat any score), then sign,
look up and decide. The HTTP handler, offline replay, calibration and warm-up all plan through
here, so what they measure is what serving does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from proxy.core.decision.judging import AskJudge
from proxy.core.identity import Identity
from proxy.core.model import Decision, Reason, Signature, Status
from proxy.core.openai.request import ChatRequest
from proxy.core.policy import IntentPolicy, Policy
from proxy.core.text.acknowledgement import is_acknowledgement
from proxy.microbatch import Overloaded
from proxy.service.cache import SemanticCache, decisive_floor
from proxy.service.feedback import UNSTORED, FeedbackReader, pending_would_serve
from proxy.service.settling import Settling
from proxy.signing.intent import IntentClassifier
from proxy.signing.signer import ContextSigner
from proxy.storage.base import StoreUnavailable


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with a request. ``policy`` is set exactly when its answer may be stored."""

    status: Status
    reason: str
    signature: Signature | None = None
    policy: IntentPolicy | None = None
    decision: Decision | None = None
    # the command to resume with the judge's verdicts (proxy.core.decision.judging), where a
    # qualified judge may read what the decision did not serve
    ask: AskJudge | None = None


@dataclass
class PolicyBox:
    """The policy in force and its classifier; swapped whole on reload."""

    policy: Policy
    classifier: IntentClassifier


class Planner:
    def __init__(
        self,
        *,
        cache: SemanticCache,
        signer: ContextSigner,
        policy_box: PolicyBox,
        feedback: FeedbackReader,
        settling: Settling,
    ) -> None:
        self.cache, self.signer, self.policy_box, self.feedback = cache, signer, policy_box, feedback
        self.settling = settling

    async def plan(
        self,
        req: ChatRequest,
        who: Identity,
        *,
        system_version: str | None = None,
        stages: dict[str, float] | None = None,
        before_model: Callable[[], None] | None = None,
        judge: bool = False,
    ) -> Plan:
        """A shared store that is down, or an embedder that is behind, costs the cache, never the
        request: either plans a bypass. ``before_model``: called once signing is about to wait for
        the embedding model (a request whose texts are all known, such as an exact repeat, never
        waits). ``judge``: a qualified judge stands by for this request's model."""
        stages = {} if stages is None else stages
        try:
            return await self._plan(req, who, system_version, stages, before_model, judge)
        except StoreUnavailable:
            return Plan(Status.BYPASS, Reason.STORE_UNAVAILABLE)
        except Overloaded:
            return Plan(Status.BYPASS, Reason.OVERLOADED)

    async def _plan(
        self,
        req: ChatRequest,
        who: Identity,
        system_version: str | None,
        stages: dict[str, float],
        before_model: Callable[[], None] | None,
        judge: bool,
    ) -> Plan:
        if req.bypass_reason:
            return Plan(Status.BYPASS, req.bypass_reason)
        t = time.perf_counter()
        conv = self.signer.read(req)  # the one normalisation of the request's text
        reading = time.perf_counter() - t
        t = time.perf_counter()
        # the feedback reads the session's last answer, which its previous turn may still be writing
        if await self.settling.session(who):
            stages["settle"] = time.perf_counter() - t
        feedback = await self.feedback.read(conv, who)
        if feedback is Reason.SESSION_RESET:
            return Plan(Status.BYPASS, feedback)
        t = time.perf_counter()
        sig = await self.signer.sign(req, conv, system_version=system_version, stages=stages, before_model=before_model)
        # stages are disjoint: sign is normalising and tagging, embed the model calls within it
        stages["sign"] = reading + time.perf_counter() - t - stages.get("embed", 0.0)
        policy = self.policy_box.policy.for_intent(sig.tags.intent)
        if not policy.cache:
            return Plan(Status.BYPASS, Reason.INTENT_DISABLED, sig)
        if feedback is not None:
            # the user asked for an answer of their own: never served, never stored
            return Plan(Status.MISS, feedback, sig, None if feedback in UNSTORED else policy)
        if acknowledges(sig):
            return Plan(Status.BYPASS, Reason.ACKNOWLEDGEMENT, sig)
        switched = sig.tags.context_switch
        if req.controls.no_cache or (switched and not policy.shares_repeats):
            return unlooked(sig, policy)
        t = time.perf_counter()
        # answers given before this request arrived are searched, though their writing may go on:
        # those near enough to change the decision (the session's own were waited for above); in
        # the shared pool any tenant's answer may be written to it
        tenant = None if "global" in policy.pools else who.tenant
        if await self.settling.writes_near(sig.vector, decisive_floor(policy), tenant):
            stages["settle"] = stages.get("settle", 0.0) + time.perf_counter() - t
            t = time.perf_counter()
        # a turn that left its topic is signed without the history it left, so only the record of
        # this very conversation, asked before in another session, may answer it by the scores; the
        # judge, which reads the conversation whole, may read the session's own earlier answers
        found = await self.cache.lookup(sig, req, who, policy, stages, repeats_only=switched, judge=judge)
        stages["index"] = time.perf_counter() - t - stages.get("decide", 0.0) - stages.get("verify", 0.0)
        decision = found.decision
        if switched and decision.status is not Status.HIT:
            standing = Decision(Status.MISS, Reason.TOPIC_SWITCH, score=decision.score)
            ask = replace(found.ask, decision=standing) if found.ask is not None else None
            return Plan(Status.MISS, Reason.TOPIC_SWITCH, sig, policy, None, ask)
        if decision.status is Status.MISS and pending_would_serve(
            found.best_pending, policy, better_than=decision.score
        ):
            return Plan(Status.MISS, Reason.PENDING, sig, policy, decision)
        return Plan(decision.status, decision.reason, sig, policy, decision, found.ask)


def unlooked(sig: Signature, policy: IntentPolicy) -> Plan:
    """The plan of a request answered without a lookup, its answer kept: one that said no-cache, a
    turn that left its topic and may not share a repeat, a past turn warmed in (proxy.tools.warm)."""
    if not policy.cache:
        return Plan(Status.BYPASS, Reason.INTENT_DISABLED, sig)
    if acknowledges(sig):
        return Plan(Status.BYPASS, Reason.ACKNOWLEDGEMENT, sig)
    return Plan(Status.MISS, Reason.TOPIC_SWITCH if sig.tags.context_switch else Reason.NO_CACHE, sig, policy)


def acknowledges(sig: Signature) -> bool:
    """A turn after the first that only acknowledges the reply ("great", "Got it, thanks!", 嗯).
    It asks nothing, so its answer is the conversation's: none is served to it and its own is
    never stored, whatever the vectors made of it (a topic switch, as often as not). A first
    turn's "thanks" is answered the same in any conversation, and is cached as any other."""
    return sig.turn_index > 1 and is_acknowledgement(sig.question_raw)
