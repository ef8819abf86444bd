"""One chat-completion request through the cache (DESIGN.md "One request", steps 2-8).

Feedback first (reset, regenerate, correction: the user's own words beat any score), then
sign, look up, decide; serve a hit as JSON or SSE, or forward upstream streaming through,
and write back only a complete, successful, plain-text answer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog
from aiohttp import web

from proxy.cache import SemanticCache
from proxy.decision import Decision, Status
from proxy.errors import UpstreamError, UpstreamUnavailable
from proxy.identity import Identity
from proxy.intent import IntentClassifier
from proxy.metrics import Metrics
from proxy.openai_body import ChatRequest, completion_chunks, completion_json, new_completion_id
from proxy.policy import IntentPolicy, Policy
from proxy.signer import ContextSigner, LruDict, Signature, request_hash
from proxy.store import Record
from proxy.streaming import StreamTee, answer_of_completion
from proxy.tagger import is_correction, is_reset_phrase
from proxy.upstream import Upstream, forward_headers
from proxy.upstream_hints import apply_hints

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
class HitJudge:
    """A served hit is *accepted* when the session goes on without a correction or regenerate
    inside the feedback window, *corrected* otherwise (precision_hit and pollution)."""

    window: float
    open: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)

    def served(self, who: Identity, cache_id: str, now: float) -> None:
        self.open[(who.tenant, who.session)] = (cache_id, now)

    def corrected(self, who: Identity) -> str | None:
        entry = self.open.pop((who.tenant, who.session), None)
        return entry[0] if entry else None

    def expire(self, now: float) -> int:
        done = [k for k, (_, t) in self.open.items() if now - t >= self.window]
        for k in done:
            del self.open[k]
        return len(done)


@dataclass
class PolicyBox:
    """The policy in force and its classifier; swapped whole on reload."""

    policy: Policy
    classifier: IntentClassifier


class ChatService:
    def __init__(self, *, cache: SemanticCache, signer: ContextSigner, policy_box: PolicyBox,
                 upstream: Upstream, flavour: str, slot_count: int | None, metrics: Metrics,
                 judge: HitJudge, debug_headers: bool, regenerate_window: float = 600.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.cache, self.signer, self.policy_box = cache, signer, policy_box
        self.upstream, self.flavour, self.slot_count = upstream, flavour, slot_count
        self.metrics, self.judge, self.debug_headers, self.clock = metrics, judge, debug_headers, clock
        self.regenerate_window = regenerate_window
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

    async def plan(self, req: ChatRequest, who: Identity, *, system_version: str | None = None,
                   stages: dict[str, float] | None = None) -> Plan:
        """Everything up to the choice of hit, half-hit, miss or bypass; no upstream IO.
        The HTTP handler and offline replay both go through here."""
        stages = {} if stages is None else stages
        if req.bypass_reason:
            return Plan(Status.BYPASS, req.bypass_reason)
        feedback = await self._feedback(req, who)
        if feedback == "reset":
            return Plan(Status.BYPASS, "session_reset")
        t = time.perf_counter()
        sig = await self.signer.sign(req, system_version=system_version)
        stages["sign"] = time.perf_counter() - t
        policy = self.policy_box.policy.for_intent(sig.tags.intent)
        if not policy.cache:
            return Plan(Status.BYPASS, f"intent_disabled:{policy.name}", sig)
        skip = feedback or ("topic_switch" if sig.tags.context_switch else None) or (
            "no_cache" if req.controls.no_cache else None)
        if skip:
            return Plan(Status.MISS, skip, sig, policy)
        t = time.perf_counter()
        decision = await self.cache.lookup(sig, req, who, policy)
        stages["index"] = time.perf_counter() - t
        return Plan(decision.status, decision.reason, sig, policy, decision)

    async def _route(self, http: web.Request, req: ChatRequest, who: Identity, out: Outcome) -> web.StreamResponse:
        plan = await self.plan(req, who, system_version=http.headers.get("x-smartcache-system-version"),
                               stages=out.stages)
        out.signature, out.decision = plan.signature, plan.decision
        if plan.signature is not None:
            out.intent = plan.signature.tags.intent
        if plan.decision is not None:
            out.score = plan.decision.score
        if plan.status is Status.HIT and plan.decision is not None and plan.decision.record is not None:
            assert plan.signature is not None
            return await self._serve(http, req, who, out, plan.decision.record, plan.signature)
        store = (plan.signature, plan.policy) if plan.policy is not None and plan.signature is not None else None
        return await self._forward(http, req, who, out, plan.status, plan.reason, store=store)

    async def _feedback(self, req: ChatRequest, who: Identity) -> str | None:
        """The session's own signals about its last answer. Returns why this request skips lookup."""
        text = req.last_user_text
        if is_reset_phrase(text):
            await self.cache.invalidate_session(who.tenant, who.session)
            self.judge.corrected(who)
            return "reset"
        last = await self.cache.store.session_last(who.tenant, who.session)
        if last is None:
            return None
        if last.request_hash == request_hash(req) and self.clock() - last.at <= self.regenerate_window:
            reason = "regenerate"
        elif is_correction(text):
            reason = "correction"
        else:
            return None
        if last.cache_id:
            await self.cache.penalise(last.cache_id)
        if self.judge.corrected(who) is not None:
            self.metrics.hit_judged("corrected")
        return reason

    async def _serve(self, http: web.Request, req: ChatRequest, who: Identity, out: Outcome, record: Record,
                     sig: Signature) -> web.StreamResponse:
        t = time.perf_counter()
        out.status, out.reason, out.cache_id = Status.HIT, out.decision.reason if out.decision else "", record.cache_id
        out.saved_prompt_tokens, out.saved_completion_tokens = record.prompt_tokens, record.completion_tokens
        await self.cache.served(record, who, sig)
        self.judge.served(who, record.cache_id, self.clock())
        headers = self._headers(http, out)
        headers.update({"x-cache-id": record.cache_id, "age": str(max(0, int(self.clock() - record.created_at)))})
        cid = new_completion_id()
        self.responses.put(cid, record.cache_id)
        if not req.stream:
            body = completion_json(completion_id=cid, model=req.model, content=record.answer_text)
            response = web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)
        else:
            response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
            await response.prepare(http)
            for event in completion_chunks(completion_id=cid, model=req.model, content=record.answer_text,
                                           include_usage=req.include_usage):
                await response.write(event)
            await response.write_eof()
        out.stages["serve"] = time.perf_counter() - t
        return response

    def _headers(self, http: web.Request, out: Outcome) -> dict[str, str]:
        headers = {"x-cache-status": out.status.value}
        if out.status is Status.HIT and out.score is not None:
            headers["x-cache-similarity"] = f"{out.score:.4f}"
        if self.debug_headers and http.headers.get("x-smartcache-debug") == "1":
            headers["x-smartcache-reason"] = out.reason
            headers["x-smartcache-intent"] = out.intent
            if out.score is not None:
                headers["x-smartcache-score"] = f"{out.score:.4f}"
            if out.signature is not None:
                headers["x-smartcache-tags"] = orjson.dumps(out.signature.tags.to_json()).decode()
            headers["x-smartcache-timings"] = ",".join(f"{k}={v * 1000:.1f}ms" for k, v in out.stages.items())
        return headers

    def _upstream_request(self, req: ChatRequest, who: Identity, http: web.Request) -> tuple[dict[str, Any],
                                                                                              dict[str, str], bool]:
        body = dict(req.forward_body)
        strip_usage = False
        if req.stream and not req.include_usage:
            # ask for usage so token accounting works, and strip the extra chunk on the way back
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            strip_usage = True
        turn = sum(1 for m in req.messages if m.role == "user")
        body, headers = apply_hints(self.flavour, body, forward_headers(http.headers), session_id=who.session,
                                    tenant_id=who.tenant, turn_index=turn, slot_count=self.slot_count)
        return body, headers, strip_usage

    async def _forward(self, http: web.Request, req: ChatRequest, who: Identity, out: Outcome, status: Status,
                       reason: str, *, store: tuple[Signature, IntentPolicy] | None) -> web.StreamResponse:
        out.status, out.reason = status, reason
        body, headers, strip_usage = self._upstream_request(req, who, http)
        t = time.perf_counter()
        try:
            if req.stream:
                answer, usage, response = await self._forward_stream(http, body, headers, strip_usage, out)
            else:
                answer, usage, response = await self._forward_json(http, body, headers, out)
        except UpstreamError as exc:
            self.metrics.upstream_error(type(exc).__name__)
            out.upstream_status = exc.status
            raise
        finally:
            out.stages["upstream"] = time.perf_counter() - t
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        if isinstance(details, dict):
            out.upstream_cached_tokens = int(details.get("cached_tokens") or 0)
        await self._write_back(req, who, out, store, answer, usage)
        return response

    async def _forward_json(self, http: web.Request, body: dict[str, Any], headers: dict[str, str],
                            out: Outcome) -> tuple[str | None, dict[str, Any], web.StreamResponse]:
        answer = await self.upstream.chat_json(body, headers)
        out.upstream_status = answer.status
        text, usage = answer_of_completion(answer.body)
        if isinstance(answer.body, dict) and isinstance(answer.body.get("id"), str):
            out.response_id = answer.body["id"]
        response = web.Response(body=answer.raw, status=answer.status, content_type="application/json",
                                headers=self._headers(http, out))
        return text, usage, response

    async def _forward_stream(self, http: web.Request, body: dict[str, Any], headers: dict[str, str],
                              strip_usage: bool, out: Outcome) -> tuple[str | None, dict[str, Any],
                                                                        web.StreamResponse]:
        tee = StreamTee(strip_usage=strip_usage)
        async with self.upstream.open_stream("POST", "chat/completions", headers=headers,
                                             content=orjson.dumps(body)) as resp:
            if resp.status_code >= 400:
                raise await self.upstream.read_error(resp)
            out.upstream_status = resp.status_code
            response = web.StreamResponse(status=resp.status_code, headers={
                **self._headers(http, out), "Content-Type": resp.headers.get("content-type", "text/event-stream"),
                "Cache-Control": "no-cache"})
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
                return None, tee.usage or {}, response
            except ConnectionResetError:
                out.reason += ":client_gone"
                return None, tee.usage or {}, response
        out.response_id = tee.response_id
        return (tee.text if tee.complete and tee.text.strip() else None), tee.usage or {}, response

    async def _write_back(self, req: ChatRequest, who: Identity, out: Outcome,
                          store: tuple[Signature, IntentPolicy] | None, answer: str | None,
                          usage: dict[str, Any]) -> None:
        if store is None or answer is None or req.controls.no_store:
            if store is not None:
                await self.cache.note_unstored(who, store[0])
            return
        sig, policy = store
        t = time.perf_counter()
        record = await self.cache.write(request=req, who=who, sig=sig, policy=policy,
                                        policy_version=self.policy_box.policy.version, answer=answer, usage=usage)
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
        if out.saved_prompt_tokens or out.saved_completion_tokens:
            self.metrics.saved_tokens(out.saved_prompt_tokens, out.saved_completion_tokens)
        if out.upstream_cached_tokens:
            self.metrics.upstream_cached(out.upstream_cached_tokens)
        log.info(
            "chat.request", status=out.status.value, reason=out.reason, intent=out.intent,
            score=None if out.score is None else round(out.score, 4), cache_id=out.cache_id,
            upstream_status=out.upstream_status, stored=out.stored, latency_ms=round(elapsed * 1000, 2),
            saved_tokens=out.saved_prompt_tokens + out.saved_completion_tokens,
            upstream_cached_tokens=out.upstream_cached_tokens, tenant=who.tenant[:12],
            stages_ms={k: round(v * 1000, 2) for k, v in out.stages.items()},
        )


async def _end_with_error(response: web.StreamResponse, exc: UpstreamError) -> None:
    with contextlib.suppress(ConnectionResetError):
        await response.write(b"data: " + orjson.dumps(exc.to_body()) + b"\n\n")
        await response.write_eof()
