"""One chat-completion request through the cache (docs/architecture.md, "One request").

Feedback first (reset, regenerate, correction: the user's own words beat any score), then
sign, look up, decide; serve a hit as JSON or SSE, or forward upstream streaming through,
and write back only a complete, successful, plain-text answer.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import structlog
from aiohttp import web

from proxy.cache import SemanticCache
from proxy.errors import UpstreamError, UpstreamUnavailable
from proxy.feedback import PENDING, UNSTORED, FeedbackReader, HitJudge, Signal, pending_best
from proxy.identity import Identity
from proxy.microbatch import Overloaded
from proxy.model import Decision, Reason, Record, Signature, Status
from proxy.observability.metrics import Metrics
from proxy.openai.request import ChatRequest, completion_chunks, completion_json, new_completion_id
from proxy.openai.sse import StreamTee, answer_of_completion
from proxy.policy import IntentPolicy, Policy
from proxy.signing.intent import IntentClassifier
from proxy.signing.signer import ContextSigner, LruDict
from proxy.storage.base import StoreUnavailable
from proxy.upstream import coalesce
from proxy.upstream.client import Upstream, cached_tokens_of, chat_headers, forward_headers
from proxy.upstream.hints import FLAVOURS, Flavour, apply_hints
from proxy.upstream.prewarm import Prewarmer, prewarm_body

log = structlog.get_logger("smartcache")


@dataclass
class Outcome:
    """Everything the canonical log line and the metrics need to know about one request."""

    status: Status = Status.MISS
    reason: str = ""
    intent: str = "-"
    score: float | None = None
    cache_id: str | None = None
    upstream_status: int | None = None
    saved_prompt_tokens: int = 0
    saved_completion_tokens: int = 0
    upstream_cached_tokens: int = 0
    stored: bool = False
    prewarmed: bool = False
    stages: dict[str, float] = field(default_factory=dict)
    signature: Signature | None = None
    response_id: str | None = None
    decision: Decision | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with a request. ``policy`` is set exactly when its answer may be stored."""

    status: Status
    reason: str
    signature: Signature | None = None
    policy: IntentPolicy | None = None
    decision: Decision | None = None


@dataclass
class PolicyBox:
    """The policy in force and its classifier; swapped whole on reload."""

    policy: Policy
    classifier: IntentClassifier


@dataclass(frozen=True, slots=True)
class Relayed:
    """What an upstream call produced, as write-back and coalesced followers need it."""

    response: web.StreamResponse
    usage: dict[str, Any]
    text: str | None = None  # None: no answer came back whole (error in-band, cut, client gone)
    finish_reason: str | None = None
    storable: bool = False  # complete, successful, plain text


class ChatService:
    def __init__(
        self,
        *,
        cache: SemanticCache,
        signer: ContextSigner,
        policy_box: PolicyBox,
        upstream: Upstream,
        flavour: str,
        slot_count: int | None,
        metrics: Metrics,
        judge: HitJudge,
        debug_headers: bool,
        regenerate_window: float = 600.0,
        coalescer: coalesce.Coalescer | None = None,
        prewarmer: Prewarmer | None = None,
        prewarm_all: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache, self.signer, self.policy_box = cache, signer, policy_box
        if flavour not in FLAVOURS:
            raise ValueError(f"unknown upstream flavour {flavour!r}; expected one of {', '.join(FLAVOURS)}")
        self.upstream, self.flavour, self.slot_count = upstream, cast(Flavour, flavour), slot_count
        self.metrics, self.judge, self.debug_headers, self.clock = metrics, judge, debug_headers, clock
        self.regenerate_window = regenerate_window
        self.feedback = FeedbackReader(
            cache=cache, judge=judge, metrics=metrics, regenerate_window=regenerate_window, clock=clock
        )
        self.coalescer, self.prewarmer, self.prewarm_all = coalescer, prewarmer, prewarm_all
        self.responses: LruDict[str, str] = LruDict(100_000)  # response id -> cache id, for thumbs feedback

    async def handle(self, http: web.Request, req: ChatRequest, who: Identity) -> web.StreamResponse:
        out = Outcome()
        t0 = time.perf_counter()
        try:
            response = await self._route(http, req, who, out)
        finally:
            elapsed = time.perf_counter() - t0
            self._account(out, who, elapsed)
        return response

    async def plan(
        self,
        req: ChatRequest,
        who: Identity,
        *,
        system_version: str | None = None,
        stages: dict[str, float] | None = None,
    ) -> Plan:
        """Everything up to the choice of hit, half-hit, miss or bypass; no upstream IO.
        The HTTP handler and offline replay both go through here."""
        stages = {} if stages is None else stages
        if req.bypass_reason:
            return Plan(Status.BYPASS, req.bypass_reason)
        feedback = await self.feedback.read(req, who)
        if feedback is Signal.RESET:
            return Plan(Status.BYPASS, feedback.value)
        t = time.perf_counter()
        try:
            sig = await self.signer.sign(req, system_version=system_version, stages=stages)
        except Overloaded:
            return Plan(Status.BYPASS, Reason.OVERLOADED)
        # stages are disjoint: sign is normalising and tagging, embed the model calls within it
        stages["sign"] = time.perf_counter() - t - stages.get("embed", 0.0)
        policy = self.policy_box.policy.for_intent(sig.tags.intent)
        if not policy.cache:
            return Plan(Status.BYPASS, Reason.INTENT_DISABLED, sig)
        if feedback is not None:
            # the user asked for an answer of their own: never served, never stored
            return Plan(Status.MISS, feedback.value, sig, None if feedback.value in UNSTORED else policy)
        skip = (Reason.TOPIC_SWITCH if sig.tags.context_switch else None) or (
            Reason.NO_CACHE if req.controls.no_cache else None
        )
        if skip:
            return Plan(Status.MISS, skip, sig, policy)
        t = time.perf_counter()
        decision = await self.cache.lookup(sig, req, who, policy, stages)
        stages["index"] = time.perf_counter() - t - stages.get("decide", 0.0) - stages.get("verify", 0.0)
        if decision.status is Status.MISS and await pending_best(
            self.cache, sig, req, who, policy, better_than=decision.score
        ):
            return Plan(Status.MISS, PENDING, sig, policy, decision)
        return Plan(decision.status, decision.reason, sig, policy, decision)

    async def _route(self, http: web.Request, req: ChatRequest, who: Identity, out: Outcome) -> web.StreamResponse:
        try:
            plan = await self.plan(
                req, who, system_version=http.headers.get("x-smartcache-system-version"), stages=out.stages
            )
        except StoreUnavailable:  # a shared store that is down costs the cache, never the request
            plan = Plan(Status.BYPASS, "store_unavailable")
        out.signature, out.decision = plan.signature, plan.decision
        if plan.signature is not None:
            out.intent = plan.signature.tags.intent
        if plan.decision is not None:
            out.score = plan.decision.score
        if plan.status is Status.HIT and plan.decision is not None and plan.decision.record is not None:
            assert plan.signature is not None and plan.policy is not None
            return await self._serve(http, req, who, out, plan.decision.record, plan.signature, plan.policy)
        return await self._forward(http, req, who, out, plan)

    async def _serve(
        self,
        http: web.Request,
        req: ChatRequest,
        who: Identity,
        out: Outcome,
        record: Record,
        sig: Signature,
        policy: IntentPolicy,
    ) -> web.StreamResponse:
        t = time.perf_counter()
        out.status, out.reason, out.cache_id = Status.HIT, out.decision.reason if out.decision else "", record.cache_id
        out.saved_prompt_tokens, out.saved_completion_tokens = record.prompt_tokens, record.completion_tokens
        await self.cache.served(record, who, sig)
        if self.judge.served(who, record.cache_id, self.clock()):
            self.metrics.hit_judged("accepted")
        headers = self._headers(http, out)
        headers.update({"x-cache-id": record.cache_id, "age": str(max(0, int(self.clock() - record.created_at)))})
        # started before the reply is written: the engine prefills while the client reads
        out.prewarmed = self._prewarm(http, req, who, record.answer_text, policy)
        response = await self._reply(http, req, headers, record.answer_text, cache_id=record.cache_id)
        out.stages["serve"] = time.perf_counter() - t
        return response

    def _prewarm(self, http: web.Request, req: ChatRequest, who: Identity, answer: str, policy: IntentPolicy) -> bool:
        if self.prewarmer is None or not (self.prewarm_all or policy.prewarm):
            return False
        body, headers = self._hinted(prewarm_body(req.forward_body, answer), req, who, http)
        return self.prewarmer.submit(body, headers)

    async def _reply(
        self,
        http: web.Request,
        req: ChatRequest,
        headers: dict[str, str],
        content: str,
        *,
        cache_id: str | None,
        finish_reason: str = "stop",
    ) -> web.StreamResponse:
        """An answer we already hold, as JSON or as SSE chunks, in the client's own format."""
        cid = new_completion_id()
        if cache_id:
            self.responses.put(cid, cache_id)
        if not req.stream:
            body = completion_json(completion_id=cid, model=req.model, content=content)
            body["choices"][0]["finish_reason"] = finish_reason
            return web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)
        response = web.StreamResponse(
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(http)
        events = completion_chunks(completion_id=cid, model=req.model, content=content, include_usage=req.include_usage)
        for event in coalesce.with_finish_reason(events, finish_reason):
            await response.write(event)
        await response.write_eof()
        return response

    def _headers(self, http: web.Request, out: Outcome) -> dict[str, str]:
        headers = {"x-cache-status": out.status.value}
        if out.status is not Status.HIT and (public := _public_reason(out.reason)):
            headers["x-cache-reason"] = public
        if out.status is Status.HIT and out.score is not None:
            headers["x-cache-similarity"] = f"{out.score:.4f}"
        if self.debug_headers and http.headers.get("x-smartcache-debug") == "1":
            headers["x-smartcache-reason"] = out.reason
            headers["x-smartcache-intent"] = out.intent
            if out.score is not None:
                headers["x-smartcache-score"] = f"{out.score:.4f}"
            if out.signature is not None:
                headers["x-smartcache-tags"] = json.dumps(out.signature.tags.to_json())  # ASCII-escaped
            headers["x-smartcache-timings"] = ",".join(f"{k}={v * 1000:.1f}ms" for k, v in out.stages.items())
            if out.decision is not None:
                headers["x-smartcache-stage"] = out.decision.stage
                if out.decision.verified is not None:
                    headers["x-smartcache-verified"] = f"{out.decision.verified:.4f}"
        return headers

    def _hinted(
        self, body: dict[str, Any], req: ChatRequest, who: Identity, http: web.Request
    ) -> tuple[dict[str, Any], dict[str, str]]:
        turn = sum(1 for m in req.messages if m.role == "user")
        return apply_hints(
            self.flavour,
            body,
            forward_headers(http.headers),
            session_id=who.session,
            tenant_id=who.tenant,
            turn_index=turn,
            slot_count=self.slot_count,
        )

    def _upstream_request(
        self, req: ChatRequest, who: Identity, http: web.Request
    ) -> tuple[dict[str, Any], dict[str, str], bool]:
        body = dict(req.forward_body)
        strip_usage = False
        if req.stream and not req.include_usage:
            # ask for usage so token accounting works, and strip the extra chunk on the way back
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            strip_usage = True
        body, headers = self._hinted(body, req, who, http)
        return body, headers, strip_usage

    async def _forward(
        self, http: web.Request, req: ChatRequest, who: Identity, out: Outcome, plan: Plan
    ) -> web.StreamResponse:
        out.status, out.reason = plan.status, plan.reason
        store = (plan.signature, plan.policy) if plan.policy is not None and plan.signature is not None else None
        # only answers the cache could hold coalesce; a regenerate, a correction or a no-cache
        # request asks for an answer of its own
        table = self.coalescer if store is not None and plan.reason not in coalesce.NEVER_COALESCE else None
        if table is None:
            return await self._call_upstream(http, req, who, out, store, None)
        key = coalesce.coalesce_key(req, who)
        for _ in range(coalesce.FOLLOW_ATTEMPTS):
            flight = table.follow(key)
            if flight is None:  # no await since follow(): the flight led below is the only one
                with table.lead(key) as flight:
                    return await self._call_upstream(http, req, who, out, store, flight)
            if (response := await self._follow(http, req, out, flight)) is not None:
                return response
        # leaders keep losing their answers (clients gone, streams cut): stop waiting on them
        return await self._call_upstream(http, req, who, out, store, None)

    async def _follow(
        self, http: web.Request, req: ChatRequest, out: Outcome, flight: coalesce.Flight
    ) -> web.StreamResponse | None:
        """Wait for the leader; its answer as a hit, its upstream error raised, or None: go yourself."""
        t = time.perf_counter()
        await flight.wait()
        out.stages["upstream"] = out.stages.get("upstream", 0.0) + time.perf_counter() - t
        if flight.error is not None:
            out.reason, out.upstream_status = f"{out.reason}:coalesced", flight.error.status
            raise flight.error
        shared = flight.answer
        if shared is None:
            return None
        out.status, out.reason, out.cache_id = Status.HIT, Reason.COALESCED, shared.cache_id
        out.saved_prompt_tokens, out.saved_completion_tokens = shared.prompt_tokens, shared.completion_tokens
        headers = {**self._headers(http, out), "x-cache-similarity": "1.0000", "age": "0"}
        if shared.cache_id:
            headers["x-cache-id"] = shared.cache_id
        return await self._reply(
            http, req, headers, shared.text, cache_id=shared.cache_id, finish_reason=shared.finish_reason
        )

    async def _call_upstream(
        self,
        http: web.Request,
        req: ChatRequest,
        who: Identity,
        out: Outcome,
        store: tuple[Signature, IntentPolicy] | None,
        flight: coalesce.Flight | None,
    ) -> web.StreamResponse:
        body, headers, strip_usage = self._upstream_request(req, who, http)
        t = time.perf_counter()
        try:
            if req.stream:
                relayed = await self._forward_stream(http, body, headers, strip_usage, out)
            else:
                relayed = await self._forward_json(http, body, headers, out)
        except UpstreamError as exc:
            self.metrics.upstream_error(type(exc).__name__)
            out.upstream_status = exc.status
            if flight is not None:
                flight.fail(exc)
            raise
        finally:
            out.stages["upstream"] = time.perf_counter() - t
        out.upstream_cached_tokens = cached_tokens_of(relayed.usage)
        await self._write_back(req, who, out, store, relayed.text if relayed.storable else None, relayed.usage)
        if flight is not None and relayed.text is not None and relayed.finish_reason:
            cache_id = out.cache_id if out.stored else None
            flight.succeed(coalesce.shared_of_usage(relayed.text, relayed.finish_reason, relayed.usage, cache_id))
        return relayed.response

    async def _forward_json(
        self, http: web.Request, body: dict[str, Any], headers: dict[str, str], out: Outcome
    ) -> Relayed:
        answer = await self.upstream.chat_json(body, headers)
        out.upstream_status = answer.status
        storable, usage = answer_of_completion(answer.body)
        if isinstance(answer.body, dict) and isinstance(answer.body.get("id"), str):
            out.response_id = answer.body["id"]
        response = web.Response(
            body=answer.raw,
            status=answer.status,
            content_type="application/json",
            headers={**answer.headers, **self._headers(http, out)},
        )
        text, finish = coalesce.plain_answer(answer.body)
        return Relayed(response, usage, text, finish, storable is not None)

    async def _forward_stream(
        self, http: web.Request, body: dict[str, Any], headers: dict[str, str], strip_usage: bool, out: Outcome
    ) -> Relayed:
        tee = StreamTee(strip_usage=strip_usage)
        async with self.upstream.open_stream(
            "POST", "chat/completions", headers=headers, content=orjson.dumps(body)
        ) as resp:
            if resp.status_code >= 400:
                raise await self.upstream.read_error(resp)
            out.upstream_status = resp.status_code
            response = web.StreamResponse(
                status=resp.status_code,
                headers={
                    **chat_headers(resp.headers),
                    **self._headers(http, out),
                    "Content-Type": resp.headers.get("content-type", "text/event-stream"),
                    "Cache-Control": "no-cache",
                },
            )
            await response.prepare(http)
            try:
                async for chunk in self.upstream.iter_bytes(resp):
                    if data := tee.feed(chunk):
                        await response.write(data)
                if rest := tee.flush():
                    await response.write(rest)
                if not tee.done:
                    raise UpstreamUnavailable("upstream stream ended before [DONE]")
                await response.write_eof()
            except UpstreamError as exc:
                # the status line is gone already: say so in-band, as OpenAI does, and store nothing
                self.metrics.upstream_error(type(exc).__name__)
                out.reason += ":upstream_cut"
                await _end_with_error(response, exc)
                return Relayed(response, tee.usage or {})
            except ConnectionResetError:
                out.reason += ":client_gone"
                return Relayed(response, tee.usage or {})
        out.response_id = tee.response_id
        whole = tee.done and not tee.tool_calls and not tee.malformed
        return Relayed(
            response,
            tee.usage or {},
            tee.text if whole else None,
            tee.finish_reason,
            tee.complete and bool(tee.text.strip()),
        )

    async def _write_back(
        self,
        req: ChatRequest,
        who: Identity,
        out: Outcome,
        store: tuple[Signature, IntentPolicy] | None,
        answer: str | None,
        usage: dict[str, Any],
    ) -> None:
        if store is None or answer is None or req.controls.no_store:
            # still the session's last answer, so a regenerate or correction of it is known
            sig = store[0] if store is not None else out.signature if out.reason in UNSTORED else None
            if sig is not None:
                await self.cache.note_unstored(who, sig)
            return
        sig, policy = store
        t = time.perf_counter()
        try:
            record = await self.cache.write(
                request=req,
                who=who,
                sig=sig,
                policy=policy,
                policy_version=self.policy_box.policy.version,
                answer=answer,
                usage=usage,
            )
        except StoreUnavailable:  # the answer is relayed already; it is just not kept
            out.reason += ":store_unavailable"
            return
        out.stages["store"] = time.perf_counter() - t
        out.stored, out.cache_id = True, record.cache_id
        if out.response_id:
            self.responses.put(out.response_id, record.cache_id)
        self.metrics.write("ready" if record.state == "ready" else "pending")

    def _account(self, out: Outcome, who: Identity, elapsed: float) -> None:
        status = out.status.value.replace("-", "_")
        self.metrics.observe_request(status, out.intent, out.reason.split(":")[0] or "-", elapsed)  # type: ignore[arg-type]
        for stage, seconds in out.stages.items():
            self.metrics.observe_stage(stage, seconds)  # type: ignore[arg-type]
        if out.decision is not None:
            self.metrics.decided(out.decision.stage, out.decision.reason)
        if out.saved_prompt_tokens or out.saved_completion_tokens:
            self.metrics.saved_tokens(out.saved_prompt_tokens, out.saved_completion_tokens)
        if out.upstream_cached_tokens:
            self.metrics.upstream_cached(out.upstream_cached_tokens)
        log.info(
            "chat.request",
            status=out.status.value,
            reason=out.reason,
            intent=out.intent,
            score=None if out.score is None else round(out.score, 4),
            cache_id=out.cache_id,
            upstream_status=out.upstream_status,
            stored=out.stored,
            latency_ms=round(elapsed * 1000, 2),
            saved_tokens=out.saved_prompt_tokens + out.saved_completion_tokens,
            upstream_cached_tokens=out.upstream_cached_tokens,
            prewarmed=out.prewarmed,
            tenant=who.tenant[:12],
            stages_ms={k: round(v * 1000, 2) for k, v in out.stages.items()},
            # which decision stage decided, what varied within its reason, the verifier's probability
            decided_by=out.decision.stage if out.decision else None,
            detail=out.decision.detail if out.decision else None,
            verified=out.decision.verified if out.decision else None,
        )


# Reasons a client can act on, said in x-cache-reason on every response; the finer decision
# reasons stay behind the debug headers.
_PUBLIC_REASONS = frozenset(
    {
        PENDING,
        "regenerate",
        "correction",
        "session_reset",
        "no_cache",
        "no_store",
        "topic_switch",
        "intent_disabled",
        "overloaded",
    }
)


def _public_reason(reason: str) -> str | None:
    head = reason.split(":", 1)[0]
    return head if head in _PUBLIC_REASONS else None


async def _end_with_error(response: web.StreamResponse, exc: UpstreamError) -> None:
    with contextlib.suppress(ConnectionResetError):
        await response.write(b"data: " + orjson.dumps(exc.to_body()) + b"\n\n")
        await response.write_eof()
