"""One chat request through the cache (docs/architecture.md, "One request").

Feedback first (reset, regenerate, correction: the user's own words beat any score), then
sign, look up, decide; serve a hit as JSON or SSE, or forward upstream streaming through,
and write back only a complete, successful, plain-text answer. A request of the Responses API
runs the same way, read as the chat request it is; what differs (the upstream route, how answers
are written and read) is its ``Dialect`` (proxy.http.dialect).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from proxy.core.errors import UpstreamError
from proxy.core.identity import Identity
from proxy.core.lru import LruDict
from proxy.core.model import Reason, Record, Signature, Status
from proxy.core.openai.request import ChatRequest
from proxy.core.policy import IntentPolicy
from proxy.http.attempts import relay_with_retry
from proxy.http.dialect import CHAT, Dialect
from proxy.http.outcome import Ending, Outcome, account, cache_headers
from proxy.http.race import Kind, UpstreamCall
from proxy.http.relay import Relayed
from proxy.observability.metrics import Metrics
from proxy.service.cache import SemanticCache
from proxy.service.feedback import HitJudge
from proxy.service.judging import Judging
from proxy.service.planner import Plan, Planner
from proxy.service.settling import Settling
from proxy.service.writeback import WriteBack, record_vector
from proxy.upstream import coalesce
from proxy.upstream.client import Upstream, cached_tokens_of, forward_headers
from proxy.upstream.hints import Flavour, apply_hints
from proxy.upstream.prewarm import Prewarmer, prewarm_body
from proxy.upstream.readiness import Readiness
from proxy.upstream.routing import routing_session

__all__ = ["ChatService"]


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """How the chat handler talks to its upstream and its client, read from the settings once."""

    flavour: Flavour = "openai"  # the upstream's dialect of prefix-cache hints
    slot_count: int | None = None  # pin a session to one of this many engine slots; None: the engine picks
    debug_headers: bool = False  # a client may ask for the decision's scores in headers
    prewarm_all: bool = False  # prewarm the engine's KV after every hit, not only where the policy says
    race: frozenset[Kind] = frozenset()  # kinds of request whose upstream call goes out while the cache decides
    # an attempt that failed before its first byte reached the client is sent once more (upstream.retry)
    retry: bool = True
    # a half-hit goes where its related record's prefix is cached, when they share this much (upstream.routing)
    route_min_shared_chars: int = 4096


class ChatService:
    def __init__(
        self,
        *,
        cache: SemanticCache,
        planner: Planner,
        write_back: WriteBack,
        settling: Settling,
        upstream: Upstream,
        metrics: Metrics,
        judge: HitJudge,
        options: ChatOptions,
        coalescer: coalesce.Coalescer | None = None,
        prewarmer: Prewarmer | None = None,
        readiness: Readiness | None = None,
        judging: Judging | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``judging``: the model judge of the gray zone, None where judging is off."""
        self.cache, self.planner, self.write_back = cache, planner, write_back
        self.upstream, self.slot_count = upstream, options.slot_count
        self.flavour = options.flavour
        self.metrics, self.judge, self.debug_headers, self.clock = metrics, judge, options.debug_headers, clock
        self.settling = settling  # the bookkeeping after a reply: a write-back, a hit's count
        self.coalescer, self.prewarmer, self.prewarm_all = coalescer, prewarmer, options.prewarm_all
        if coalescer is not None:
            metrics.tally(
                "smartcache_coalesced_requests",
                "Requests that led an upstream call and that followed one already in flight.",
                "role",
                lambda: {"led": coalescer.led, "followed": coalescer.followed},
            )
        if prewarmer is not None:
            metrics.tally(
                "smartcache_prewarms",
                "KV prewarm requests after a hit: sent, dropped with every slot busy, failed.",
                "outcome",
                lambda: {"sent": prewarmer.sent, "dropped": prewarmer.dropped, "failed": prewarmer.failed},
            )
        self.race = race = options.race
        self.races = {"relayed": 0, "cancelled": 0}
        if race:
            metrics.tally(
                "smartcache_raced_upstream_calls",
                "Upstream calls sent while the cache decided: relayed (not a hit) or cancelled (a hit).",
                "outcome",
                lambda: dict(self.races),
            )
        self.responses: LruDict[str, str] = LruDict(100_000)  # response id -> cache id, for thumbs feedback
        self.retry, self.route_min_shared_chars = options.retry, options.route_min_shared_chars
        self.readiness = readiness  # told what each forward found of the upstream (/readyz)
        self.judging = judging
        if judging is not None:
            counts = judging.judge.counts
            metrics.tally(
                "smartcache_judge_calls",
                "Calls to the model judge of the gray zone: said yes, said no, failed, or skipped over its cap.",
                "outcome",
                lambda: {"yes": counts.yes, "no": counts.no, "failed": counts.failed, "skipped": counts.skipped},
            )
            metrics.tally(
                "smartcache_judge_tokens",
                "Tokens the model judge read and wrote, counted apart from the answers'.",
                "kind",
                lambda: {"prompt": counts.prompt_tokens, "completion": counts.completion_tokens},
            )
            metrics.gauge_of(
                "smartcache_judge_qualified",
                "1 for each model that passed the judge's exam and decides, 0 for one failed or being examined.",
                "model",
                lambda: {m: float(state == "passed") for m, state in judging.qualification.standings().items()},
            )
            metrics.tally(
                "smartcache_judge_decisions",
                "Raced gray-zone requests: served on a yes, served by a learned level, refused, forwarded past the"
                " deadline, or forwarded on a yes sampled for audit.",
                "outcome",
                lambda: dict(judging.decided),
            )
            if (levels := judging.levels) is not None:
                metrics.tally(
                    "smartcache_judge_saved",
                    "Gray-zone requests served by a learned level without a judge call, by intent.",
                    "intent",
                    lambda: dict(levels.saved),
                )
                metrics.tally(
                    "smartcache_labels",
                    "Labels kept for learned levels, by what gave them: judge, agreement or feedback.",
                    "source",
                    lambda: dict(levels.added),
                )
                metrics.gauge_of(
                    "smartcache_learned_level",
                    "Per intent, the lowest verifier level in force over the tenants fitted here (absent: none).",
                    "intent",
                    lambda: {i: st.level for i, st in levels.standings().items() if st.level is not None},
                )
                metrics.gauge_of(
                    "smartcache_learned_bound",
                    "Per intent, the highest upper bound of the wrong-answer rate among the levels in force.",
                    "intent",
                    lambda: {i: st.bound for i, st in levels.standings().items() if st.bound is not None},
                )
                metrics.gauge_of(
                    "smartcache_learned_labels",
                    "Per intent, the labels the levels fitted here were read from.",
                    "intent",
                    lambda: {i: float(st.labels) for i, st in levels.standings().items()},
                )

    async def handle(
        self, http: web.Request, req: ChatRequest, who: Identity, dialect: Dialect = CHAT
    ) -> web.StreamResponse:
        """``dialect``: the API the request came by, chat completions unless said."""
        out = Outcome()
        t0 = time.perf_counter()
        try:
            response = await self._route(http, req, who, out, dialect)
        finally:
            elapsed = time.perf_counter() - t0
            if out.settling is None:
                account(self.metrics, out, who, elapsed)
            else:  # the canonical line says what came of the write-back too
                out.settling.add_done_callback(lambda _: account(self.metrics, out, who, elapsed))
        return response

    async def _route(
        self, http: web.Request, req: ChatRequest, who: Identity, out: Outcome, dialect: Dialect
    ) -> web.StreamResponse:
        race: UpstreamCall | None = None

        def start_race() -> None:
            # only once the lookup is to wait for the model: a repeat decides in a few ms unraced
            nonlocal race
            if race is None:
                race = self._send(req, who, http, dialect)

        try:
            plan = await self.planner.plan(
                req,
                who,
                system_version=http.headers.get("x-smartcache-system-version"),
                stages=out.stages,
                before_model=start_race if ("stream" if req.stream else "json") in self.race else None,
                judge=self._judge_ready(req, http),
            )
            if plan.ask is not None and plan.policy is not None and self.judging is not None:
                plan, race = await self._judge(http, req, who, out, plan, race, dialect)
        except BaseException:
            if race is not None:
                await self._drop(race)
            raise
        out.signature, out.decision = plan.signature, plan.decision
        if plan.signature is not None:
            out.intent = plan.signature.tags.intent
        if plan.decision is not None:
            out.score = plan.decision.score
        if plan.status is Status.HIT and plan.decision is not None and plan.decision.record is not None:
            assert plan.signature is not None and plan.policy is not None
            if race is not None:
                await self._drop(race)
            record = plan.decision.record
            if (record.tenant, record.session) != (who.tenant, who.session) and plan.decision.stage != "judge":
                # another conversation's answer (a judged one is kept as an alias already): the
                # session keeps it as a turn of its own, so that asked again later it is found
                self.settling.start(who, self._keep_own(record, req, who, plan))
            return await self._serve(http, req, who, out, record, plan.signature, plan.policy, dialect)
        return await self._forward(http, req, who, out, plan, race, dialect)

    async def _keep_own(self, record: Record, req: ChatRequest, who: Identity, plan: Plan) -> None:
        await self.write_back.alias(record, req, who, plan, own=True)

    def _judge_ready(self, req: ChatRequest, http: web.Request) -> bool:
        """Is a judge that passed its exam standing by for this request's model (and is any intent
        of the policy judged at all)? The first request of a model starts its exam."""
        if self.judging is None or not self.planner.policy_box.policy.judges:
            return False
        return self.judging.ready(req.model, lambda: forward_headers(http.headers))

    async def _judge(
        self,
        http: web.Request,
        req: ChatRequest,
        who: Identity,
        out: Outcome,
        plan: Plan,
        race: UpstreamCall | None,
        dialect: Dialect,
    ) -> tuple[Plan, UpstreamCall | None]:
        """``race``: the forward goes out with the judge, and its bytes wait for the verdict up to
        the intent's deadline; a yes makes the plan a hit (the forward is then cancelled by the
        caller). ``async``: the verdict comes after the forward, and is remembered."""
        assert plan.ask is not None and plan.policy is not None and self.judging is not None
        t = time.perf_counter()
        verdicts = out.verdicts = self.judging.start(req, who, plan, forward_headers(http.headers))
        out.judged = True
        if plan.policy.judge != "race":
            return plan, race
        if race is None:
            race = self._send(req, who, http, dialect)
        decision = await self.judging.decide(plan.ask, verdicts, plan.policy.judge_deadline_ms / 1000)
        out.stages["judge"] = time.perf_counter() - t
        if decision.is_hit:  # served from the cache: no fresh answer to read its verdicts against
            self.judging.answered(verdicts, None)
        status = decision.status
        return replace(plan, status=status, reason=decision.reason, decision=decision), race

    def _send(
        self, req: ChatRequest, who: Identity, http: web.Request, dialect: Dialect, route: str | None = None
    ) -> UpstreamCall:
        """``route``: the session the router keys on (``routing_session``); the caller's own by default."""
        body, headers = self._hinted(dialect.upstream_body(req), req, who, http, route)
        # the client's query string goes on as it came (Azure's api-version), as on passthrough routes
        return UpstreamCall(
            self.upstream, body, headers, stream=req.stream, params=tuple(http.query.items()), path=dialect.path
        )

    async def _drop(self, race: UpstreamCall) -> None:
        self.races["cancelled"] += 1
        await race.cancel()

    async def _serve(
        self,
        http: web.Request,
        req: ChatRequest,
        who: Identity,
        out: Outcome,
        record: Record,
        sig: Signature,
        policy: IntentPolicy,
        dialect: Dialect,
    ) -> web.StreamResponse:
        t = time.perf_counter()
        out.status, out.reason, out.cache_id = Status.HIT, out.decision.reason if out.decision else "", record.cache_id
        out.saved_prompt_tokens, out.saved_completion_tokens = record.prompt_tokens, record.completion_tokens
        out.settling = self.settling.start(who, self.cache.served(record, who, sig))
        if self.judge.served(who, record.cache_id, self.clock()):
            self.metrics.hit_judged("accepted")
        headers = self._headers(http, out)
        headers.update({"x-cache-id": record.cache_id, "age": str(max(0, int(self.clock() - record.created_at)))})
        # started before the reply is written: the engine prefills while the client reads
        out.prewarmed = self._prewarm(http, req, who, record.answer_text, policy)
        finish = "length" if record.cut_at is not None else "stop"
        response = await self._reply(
            req, who, headers, record.answer_text, dialect, cache_id=record.cache_id, finish_reason=finish
        )
        out.stages["serve"] = time.perf_counter() - t
        return response

    def _prewarm(self, http: web.Request, req: ChatRequest, who: Identity, answer: str, policy: IntentPolicy) -> bool:
        if self.prewarmer is None or not (self.prewarm_all or policy.prewarm):
            return False
        body, headers = self._hinted(prewarm_body(req.forward_body, answer), req, who, http)
        return self.prewarmer.submit(body, headers)

    async def _reply(
        self,
        req: ChatRequest,
        who: Identity,
        headers: dict[str, str],
        content: str,
        dialect: Dialect,
        *,
        cache_id: str | None,
        finish_reason: str = "stop",
    ) -> web.Response:
        """An answer we already hold, as JSON or as SSE events, in the client's own API and format."""
        held = dialect.held(req, content, finish_reason)
        if cache_id:
            self.responses.put(held.response_id, cache_id)
        # remembered before the client has it, so its follow-up finds it
        await dialect.answered(who, held.response_id, content, finish_reason, served=True)
        if not held.stream:
            return web.Response(body=held.body, content_type="application/json", headers=headers)
        return web.Response(
            body=held.body, headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )

    def _headers(self, http: web.Request, out: Outcome) -> dict[str, str]:
        return cache_headers(out, debug=self.debug_headers and http.headers.get("x-smartcache-debug") == "1")

    def _hinted(
        self, body: dict[str, Any], req: ChatRequest, who: Identity, http: web.Request, route: str | None = None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        turn = sum(1 for m in req.messages if m.role == "user")
        return apply_hints(
            self.flavour,
            body,
            forward_headers(http.headers),
            session_id=route or who.session,
            tenant_id=who.tenant,
            turn_index=turn,
            slot_count=self.slot_count,
        )

    async def _forward(
        self,
        http: web.Request,
        req: ChatRequest,
        who: Identity,
        out: Outcome,
        plan: Plan,
        race: UpstreamCall | None,
        dialect: Dialect,
    ) -> web.StreamResponse:
        out.status, out.reason = plan.status, plan.reason
        route = routing_session(
            who.session, who.tenant, req, plan.signature, plan.decision, min_shared_chars=self.route_min_shared_chars
        )
        # only answers the cache could hold coalesce; a regenerate, a correction or a no-cache
        # request asks for an answer of its own, and so does an anonymous caller nothing tells
        # apart from another person asking the same at the same time (proxy.service.reach)
        shares = plan.policy is not None and plan.reason not in coalesce.NEVER_COALESCE and not who.indistinct
        table = self.coalescer if shares else None
        if table is None:
            return await self._call_upstream(http, req, who, out, plan, None, dialect, race, route=route)
        key = coalesce.coalesce_key(req, who)
        for _ in range(coalesce.FOLLOW_ATTEMPTS):
            flight = table.follow(key)
            if flight is None:  # no await since follow(): the flight begun here is the only one
                flight = table.begin(key)
                try:
                    # ended by the write-back, so followers get the record's id (_keep)
                    return await self._call_upstream(http, req, who, out, plan, flight, dialect, race, route=route)
                except BaseException:
                    table.end(flight)
                    raise
            if race is not None:  # the leader's call answers this request: ours is one too many
                await self._drop(race)
                race = None
            if (response := await self._follow(http, req, who, out, flight, dialect)) is not None:
                return response
        # leaders keep losing their answers (clients gone, streams cut): stop waiting on them
        return await self._call_upstream(http, req, who, out, plan, None, dialect, route=route)

    async def _follow(
        self,
        http: web.Request,
        req: ChatRequest,
        who: Identity,
        out: Outcome,
        flight: coalesce.Flight,
        dialect: Dialect,
    ) -> web.StreamResponse | None:
        """Wait for the leader; its answer as a hit, its upstream error raised, or None: go yourself."""
        t = time.perf_counter()
        await flight.wait()
        out.stages["upstream"] = out.stages.get("upstream", 0.0) + time.perf_counter() - t
        if flight.error is not None:
            out.reason, out.upstream_status = Reason.COALESCED, flight.error.status
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
            req, who, headers, shared.text, dialect, cache_id=shared.cache_id, finish_reason=shared.finish_reason
        )

    async def _call_upstream(
        self,
        http: web.Request,
        req: ChatRequest,
        who: Identity,
        out: Outcome,
        plan: Plan,
        flight: coalesce.Flight | None,
        dialect: Dialect,
        race: UpstreamCall | None = None,
        *,
        route: str | None = None,
    ) -> web.StreamResponse:
        if race is not None:  # sent while the cache decided (with the caller's own key: no plan yet)
            self.races["relayed"] += 1
        t = time.perf_counter()
        try:
            relayed = await relay_with_retry(
                self.upstream,
                http,
                race or self._send(req, who, http, dialect, route),
                functools.partial(self._send, req, who, http, dialect, route),
                retry=self.retry,
                stream=req.stream,
                strip_usage=dialect.strips_usage(req),
                out=out,
                ours=functools.partial(self._headers, http, out),
                metrics=self.metrics,
                reading=dialect,
                readiness=self.readiness,
            )
        except UpstreamError as exc:
            out.upstream_status = exc.status
            if flight is not None:
                flight.fail(exc)
            raise
        finally:
            out.stages["upstream"] = time.perf_counter() - t
        out.upstream_cached_tokens = cached_tokens_of(relayed.usage)
        # remembered before the client has the whole answer, so its follow-up finds it
        await dialect.answered(who, out.response_id, relayed.text, relayed.finish_reason, served=False)
        keep = self._keep(req, who, out, plan, relayed, flight)
        out.settling = self.settling.start(who, keep, record_vector=record_vector(plan))
        if req.stream:  # its end goes out now that the keeping is registered (relay_stream)
            try:
                await relayed.response.write_eof()
            except ConnectionResetError:
                out.ending = out.ending or Ending.CLIENT_GONE
        return relayed.response

    async def _keep(
        self,
        req: ChatRequest,
        who: Identity,
        out: Outcome,
        plan: Plan,
        relayed: Relayed,
        flight: coalesce.Flight | None,
    ) -> None:
        """After the reply: write the answer back, then hand it to the flight's followers."""
        try:
            await self._write_back(req, who, out, plan, relayed)
            if flight is not None and relayed.text is not None and relayed.finish_reason:
                cache_id = out.cache_id if out.stored else None
                flight.succeed(coalesce.shared_of_usage(relayed.text, relayed.finish_reason, relayed.usage, cache_id))
        finally:
            if flight is not None and self.coalescer is not None:
                self.coalescer.end(flight)

    async def _write_back(self, req: ChatRequest, who: Identity, out: Outcome, plan: Plan, relayed: Relayed) -> None:
        t = time.perf_counter()
        whole = relayed.text if relayed.storable or relayed.cut_at_limit else None
        kept = await self.write_back.keep(req, who, plan, whole, relayed.usage, cut=relayed.cut_at_limit)
        if out.verdicts is not None and self.judging is not None:  # after the record: its labels can wait
            self.judging.answered(out.verdicts, relayed.text if relayed.storable else None)
        if kept.failed:  # the answer is relayed already; it is just not kept
            out.ending = Ending.STORE_UNAVAILABLE
        if (record := kept.record) is None:
            return
        out.stages["store"] = time.perf_counter() - t
        out.stored, out.cache_id = True, record.cache_id
        if out.response_id:
            self.responses.put(out.response_id, record.cache_id)
        self.metrics.write("ready" if record.state == "ready" else "pending")
