"""Six domains of multi-turn chat, end to end: no cache vs an exact-prefix cache vs SmartCache,
the comparison of the design article's table (section 5.1), on traffic with a stated repetition mix.

Traffic. Sessions of customer support / after-sales, travel, shopping, code, chit-chat and general
knowledge, half in English and half in Chinese, are drawn with a seeded RNG
(benchmarks/domains_traffic.py) from the hand-written pools of benchmarks/data/domains_pool.yaml
(question groups written the ways different users put them, near misses that share their words but
ask something else, follow-ups that only mean something after the previous answer; no row of
../shared/data or ../shared/eval). A tenant has 40 sessions of one domain (the quick run one tenant
a domain, the full run five), one user a session. Each session is 2-7 requests; what each request
is, by construction:

- new: a question the tenant has not asked before;
- follow-up: "make it shorter", "举个例子": its answer depends on the conversation;
- near miss: an earlier question's very wording with another entity or number, or a contrast
  (negation, another attribute); it deserves an answer of its own;
- re-asked in other words: later in the same session, an earlier question in another wording;
- edited and re-sent: the last question re-sent with a slight edit (politeness, punctuation, case)
  in its place, on the same history;
- another user, other words: a session opening with a question another user of the tenant opened
  with, in other words;
- another user, same words: a conversation another user of the tenant sent byte for byte (a
  session opening with the same question; or the same wording picked again, whatever was planned);
- asked again by chance: a new, follow-up or near-miss request whose answer the tenant already had.

The last five are the requests close to an earlier one: about a fifth of the traffic, as in the
article's trace statistics (23 %); the run prints the realised mix (``--plan-only`` prints it
without running anything).

Judging. Every request carries the id of the answer it deserves (its conversation's user turns
name it). The upstream is a scripted aiohttp oracle that answers with that answer and a tag of its
id, as the replay harness's oracle does, so each served hit is judged exactly: a hit whose tag is
not the request's is a false hit. Saved tokens: the prompt and completion tokens a hit kept from
the upstream (estimated: a CJK character or a word or a punctuation mark is one token, plus 4 a
message). The oracle's latency is fixed by a model stated in the output (by default 60 ms + 0.25 ms
a prompt token + 20 ms a completion token: a 7-8B model on one GPU under load, prefilling every
turn anew); ``--engine`` puts the local llama.cpp engine (proxy/upstream/engine.py) behind the
oracle instead, which then only tags the engine's answers (slow on 2 cores: use few sessions).

Timing. Users think 1.6-3.2 s between turns, and a request that repeats an earlier answer waits
until that answer is 1.6 s old. SmartCache runs with a feedback window (``ready_after``) of 1 s
instead of its default 60 s, so answers become reusable within the compressed think time; the
sweeper then promotes every 0.25 s. The oracle stands for an engine that aborts a request its
client drops (vLLM, SGLang, llama.cpp), which ``race_upstream: auto`` races for those flavours, so
SmartCache races it (``race_upstream: on``): a request goes upstream while the cache decides, and a
hit cancels it. Everything else is the shipped default: policies/default.yaml,
the default embedding pack, the verifier as the proxy loads it (``debug_headers`` on, for the
per-intent breakdown). The exact-prefix cache is a dict in this process keyed by the whole request
body (model and every message, byte for byte), answered without a network hop: its hit latency is
a floor. The three systems run at the same time, each against an oracle of its own, so machine load
weighs on all three alike (``--sequential`` runs them one after another).

    .venv/bin/python benchmarks/bench_domains.py --quick          # 40 sessions a domain, about 1.5 min
    .venv/bin/python benchmarks/bench_domains.py                  # 200 sessions a domain
    .venv/bin/python benchmarks/bench_domains.py --sessions 5 --engine
    .venv/bin/python benchmarks/bench_domains.py --plan-only      # the mix and a few sessions, no run
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from domains_traffic import (
    DOMAINS,
    KINDS,
    LANGS,
    SYSTEM_PROMPT,
    Plan,
    Pos,
    Session,
    build_plan,
    load_pool,
    mix,
    prompt_key,
    prompt_tokens,
    tokens,
)
from measurement import DEFAULT_MODEL_HOME, ROOT, envelope, percentile, write_json
from soak import ProxyProcess

SYSTEMS = ("no_cache", "exact_prefix", "smartcache")
SYSTEM_NAMES = {"no_cache": "no cache", "exact_prefix": "exact prefix", "smartcache": "SmartCache"}
MODEL = "bench-oracle"
READY_AFTER_S = 1.0  # SmartCache's feedback window in this run (default 60 s)
THINK_S = (1.6, 3.2)  # a user's pause between receiving an answer and sending the next turn
REPEAT_GAP_S = 1.6  # a repeat is sent once the answer it repeats is this old (window + sweeps)
_TAG = re.compile(r"\s*〔ref:([a-z]+:[a-z]+)〕")  # answer : tenant


@dataclass(frozen=True)
class LatencyModel:
    fixed_ms: float = 60.0
    prefill_ms: float = 0.25  # a prompt token
    decode_ms: float = 20.0  # a completion token

    def seconds(self, prompt: int, completion: int) -> float:
        return (self.fixed_ms + self.prefill_ms * prompt + self.decode_ms * completion) / 1000

    def __str__(self) -> str:
        return (
            f"{self.fixed_ms:g} ms + {self.prefill_ms:g} ms a prompt token + {self.decode_ms:g} ms a completion token"
        )


# --- the oracle upstream -----------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeModel:
    """The oracle judge's quality: a seeded false yes (``error``) on a wrong answer and false no
    (``miss``) on a right one, per pair, and its latency; figures taken with it simulate a judge of
    that quality."""

    error: float = 0.02
    miss: float = 0.05
    ms: float = 20.0
    seed: int = 7

    def says(self, same: bool, pair: str) -> bool:
        u = int(hashlib.sha1(f"{self.seed}|{pair}".encode()).hexdigest()[:8], 16) / 2**32
        return (u >= self.miss) if same else (u < self.error)

    def __str__(self) -> str:
        return f"oracle judge: {self.error:.0%} false yes, {self.miss:.0%} false no, {self.ms:g} ms"


@dataclass
class OracleTally:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    unknown: int = 0  # conversations the plan does not know (should stay 0)
    judge_calls: int = 0  # judge requests (x-smartcache-judge: 1), apart from the calls above
    judge_yes: int = 0
    judge_wrong: int = 0
    exam_calls: int = 0


class Oracle:
    """An OpenAI-compatible upstream that answers each conversation with the answer the plan says
    it deserves, tagged with that answer's id, after the latency model's delay; with ``engine``,
    the engine's answer, tagged the same way."""

    def __init__(
        self, plan: Plan, latency: LatencyModel, engine: str | None, max_tokens: int, judge: JudgeModel | None = None
    ) -> None:
        self.plan, self.latency, self.engine, self.max_tokens = plan, latency, engine, max_tokens
        self.judge = judge or JudgeModel()
        self.tally = OracleTally()
        self.http: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.cleanup_ctx.append(self._client)
        return app

    async def _client(self, _app: web.Application) -> AsyncIterator[None]:
        if self.engine is not None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        yield
        if self.http is not None:
            await self.http.close()

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        if "x-smartcache-judge" in request.headers:
            return await self._judge(request, body)
        messages = body["messages"]
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        answer_id = self.plan.oracle.get(prompt_key(system, [m["content"] for m in messages if m["role"] == "user"]))
        prompt = prompt_tokens(messages)
        tenant = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if answer_id is None:
            self.tally.unknown += 1
            text, tag = "I don't know this conversation.", "〔ref:unknown:unknown〕"
        else:
            text, tag = self.plan.answers[answer_id], f"〔ref:{self.plan.tag(answer_id, tenant)}〕"
        if self.http is not None and self.engine is not None:
            text, prompt = await self._engine_answer(messages)
        completion = tokens(text)
        self.tally.calls += 1
        self.tally.prompt_tokens += prompt
        self.tally.completion_tokens += completion
        if self.http is None:
            await asyncio.sleep(self.latency.seconds(prompt, completion))
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        choice = {"index": 0, "message": {"role": "assistant", "content": f"{text} {tag}"}, "finish_reason": "stop"}
        return web.json_response(
            {
                "id": f"chatcmpl-{self.tally.calls}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", MODEL),
                "choices": [choice],
                "usage": usage,
            }
        )

    async def _judge(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        """The judge protocol as the replay harness's oracle answers it: yes when the cached answer
        (the assistant turn before the judge question) is the one the new request deserves, with a
        seeded false yes / false no per pair; the exam from its expect header, with the same errors."""
        messages = body["messages"]
        if request.headers["x-smartcache-judge"].strip().lower() == "exam":
            self.tally.exam_calls += 1
            same, pair = request.headers.get("x-smartcache-expect", "") == "yes", json.dumps(messages, sort_keys=True)
        else:
            self.tally.judge_calls += 1
            system = next((m["content"] for m in messages if m["role"] == "system"), "")
            users = [m["content"] for m in messages if m["role"] == "user"][:-1]
            answer_id = self.plan.oracle.get(prompt_key(system, users))
            tenant = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            cached = _TAG.search(str(messages[-2].get("content") or "")) if len(messages) >= 2 else None
            same = answer_id is not None and cached is not None and cached.group(1) == self.plan.tag(answer_id, tenant)
            pair = f"{prompt_key(system, users)}|{cached.group(1) if cached else ''}"
        yes = self.judge.says(same, pair)
        if request.headers["x-smartcache-judge"].strip().lower() != "exam":
            self.tally.judge_yes += yes
            self.tally.judge_wrong += yes != same
        await asyncio.sleep(self.judge.ms / 1000)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "yes" if yes else "no"},
            "finish_reason": "stop",
        }
        usage = {"prompt_tokens": prompt_tokens(messages), "completion_tokens": 1}
        return web.json_response(
            {"id": "chatcmpl-judge", "object": "chat.completion", "created": int(time.time()),
             "model": body.get("model", MODEL), "choices": [choice], "usage": usage}
        )  # fmt: skip

    async def _engine_answer(self, messages: list[dict[str, str]]) -> tuple[str, int]:
        assert self.http is not None and self.engine is not None
        plain = [{"role": m["role"], "content": _TAG.sub("", m["content"])} for m in messages]
        body = {"model": "local", "messages": plain, "temperature": 0, "max_tokens": self.max_tokens}
        async with self.http.post(self.engine + "/chat/completions", json=body) as resp:
            data = await resp.json(content_type=None)
        usage = data.get("usage") or {}
        return (data["choices"][0]["message"]["content"] or "").strip(), int(usage.get("prompt_tokens") or 0)


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` on a free loopback port; yields its /v1 base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


# --- the systems -------------------------------------------------------------------------------


class BenchProxy(ProxyProcess):
    """``smartcache serve`` as soak.ProxyProcess starts it, with this run's feedback window."""

    def __init__(self, upstream: str, data_dir: Path, env: dict[str, str], ready_after: float) -> None:
        super().__init__(upstream, data_dir, env)
        self.ready_after = ready_after

    async def start(self, timeout: float = 300) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "proxy", "serve", "--upstream", self.upstream, "--port", str(self.port)]
        cmd += ["--data-dir", str(self.data_dir), "--ready-after", f"{self.ready_after:g}"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"proxy exited with {self.proc.returncode}; see {self.log}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(self.url + "/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.3)
        raise RuntimeError(f"proxy did not become healthy in {timeout} s; see {self.log}")


@dataclass(frozen=True)
class Reply:
    text: str
    hit: bool
    status: str = ""
    reason: str = ""
    intent: str = ""
    score: float | None = None  # the best candidate's, where the proxy's decision read one


class Asker:
    """One system's way to a reply: straight to its oracle, through the exact-prefix dict, or
    through the proxy."""

    def __init__(self, system: str, http: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
        self.system, self.http, self.url, self.max_tokens = system, http, url, max_tokens
        self.exact: dict[str, str] = {}

    async def ask(self, s: Session, messages: list[dict[str, str]]) -> Reply:
        body = {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": self.max_tokens}
        key = json.dumps(body, ensure_ascii=False, sort_keys=True)
        if self.system == "exact_prefix" and key in self.exact:
            return Reply(self.exact[key], True, "hit")
        headers = {
            "Authorization": f"Bearer {s.tenant}",
            "x-smartcache-session": s.sid,
            "x-smartcache-user": f"user-{s.sid}",
            "x-smartcache-debug": "1",
        }
        async with self.http.post(self.url, json=body, headers=headers) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"{self.system}: {resp.status} {str(data)[:300]}")
            h = resp.headers
            status, reason, intent = (
                h.get(k, "") for k in ("x-cache-status", "x-smartcache-reason", "x-smartcache-intent")
            )
            score = float(h["x-smartcache-score"]) if "x-smartcache-score" in h else None
        text = data["choices"][0]["message"]["content"] or ""
        if self.system == "exact_prefix":
            self.exact[key] = text
        return Reply(text, status == "hit", status, reason, intent, score)


@dataclass(frozen=True)
class Outcome:
    pos: Pos
    latency_s: float
    reply: Reply
    prompt_tokens: int


async def drive(asker: Asker, plan: Plan, concurrency: int) -> list[Outcome]:
    """Every session, ``concurrency`` users at a time, each thinking between turns; a repeat waits
    until the answer it repeats is REPEAT_GAP_S old."""
    done_at: dict[Pos, float] = {}
    answered: dict[Pos, asyncio.Event] = collections.defaultdict(asyncio.Event)
    outcomes: list[Outcome] = []
    queue = iter(plan.order())

    async def session(si: int) -> None:
        s, think = plan.sessions[si], random.Random(f"think/{si}")
        history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM_PROMPT}]
        before_last = history
        for j, r in enumerate(s.requests):
            if j:
                await asyncio.sleep(think.uniform(*THINK_S))
            for prior in plan.after.get((si, j), ()):
                await answered[prior].wait()
                await asyncio.sleep(max(0.0, done_at[prior] + REPEAT_GAP_S - time.monotonic()))
            base = before_last if r.replaces_last else history
            messages = [*base, {"role": "user", "content": r.text}]
            t0 = time.perf_counter()
            reply = await asker.ask(s, messages)
            outcomes.append(Outcome((si, j), time.perf_counter() - t0, reply, prompt_tokens(messages)))
            done_at[si, j] = time.monotonic()
            answered[si, j].set()
            before_last, history = base, [*messages, {"role": "assistant", "content": reply.text}]

    async def user() -> None:
        for si in queue:
            await session(si)

    await asyncio.gather(*(user() for _ in range(concurrency)))
    return outcomes


# --- the run -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def smartcache_proxy(upstream: str, args: argparse.Namespace) -> AsyncIterator[str]:
    env = {
        **os.environ,
        "SMARTCACHE_LOG_LEVEL": "warning",
        "SMARTCACHE_MODEL_HOME": str(args.model_home),
        "SMARTCACHE_DEBUG_HEADERS": "true",
        "SMARTCACHE_UPSTREAM_TIMEOUT": "600",
        # the oracle stands for an engine that aborts a dropped request (see the module's Timing)
        "SMARTCACHE_RACE_UPSTREAM": "on",
        **({"SMARTCACHE_POLICY": str(args.policy)} if args.policy else {}),
    }
    work = Path(tempfile.mkdtemp(prefix="smartcache-domains-"))
    proxy = BenchProxy(upstream, work / "d", env, args.ready_after)
    try:
        await proxy.start()
        yield proxy.url + "/v1/chat/completions"
    finally:
        proxy.stop()
        shutil.rmtree(work, ignore_errors=True)


async def run_system(system: str, plan: Plan, args: argparse.Namespace, engine: str | None) -> dict[str, Any]:
    oracle = Oracle(
        plan, args.latency, engine, args.max_tokens, JudgeModel(args.judge_error, args.judge_miss, args.judge_ms)
    )
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        serving(oracle.app()) as upstream,
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900)) as http,
        contextlib.AsyncExitStack() as stack,
    ):
        url = upstream + "/chat/completions"
        if system == "smartcache":
            url = await stack.enter_async_context(smartcache_proxy(upstream, args))
        t0 = time.perf_counter()
        outcomes = await drive(Asker(system, http, url, args.max_tokens), plan, args.concurrency)
        wall = time.perf_counter() - t0
    print(f"{SYSTEM_NAMES[system]}: {len(outcomes)} requests in {wall:.0f} s", file=sys.stderr)
    return {"outcomes": outcomes, "upstream": vars(oracle.tally), "wall_s": wall}


def served_code(reply: Reply) -> str | None:
    m = _TAG.search(reply.text)
    return m.group(1) if m else None


def summarize(plan: Plan, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    ms = [o.latency_s * 1000 for o in outcomes]
    hits = [o for o in outcomes if o.reply.hit]
    wrong = [o for o in outcomes if served_code(o.reply) != plan.deserved(o.pos)]
    return {
        "requests": len(outcomes),
        "hits": len(hits),
        "hit_rate": len(hits) / max(1, len(outcomes)),
        "false_hits": sum(o.reply.hit for o in wrong),
        "wrong_on_misses": sum(not o.reply.hit for o in wrong),
        "saved_tokens": sum(o.prompt_tokens + tokens(_TAG.sub("", o.reply.text)) for o in hits),
        "mean_ms": sum(ms) / len(ms) if ms else float("nan"),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
    }


def collate(plan: Plan, runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    systems: dict[str, Any] = {}
    for system, run in runs.items():
        outcomes: list[Outcome] = run["outcomes"]

        def where(pred: Any, outs: list[Outcome] = outcomes) -> dict[str, Any]:
            return summarize(plan, [o for o in outs if pred(o.pos)])

        false = [o for o in outcomes if o.reply.hit and served_code(o.reply) != plan.deserved(o.pos)]
        systems[system] = {
            "all": summarize(plan, outcomes),
            "by_domain": {d: where(lambda p, d=d: plan.sessions[p[0]].domain == d) for d in DOMAINS},
            "by_lang": {g: where(lambda p, g=g: plan.sessions[p[0]].lang == g) for g in LANGS},
            "by_kind": {k: where(lambda p, k=k: plan.kinds[p] == k) for k in KINDS},
            "upstream": run["upstream"],
            "wall_s": run["wall_s"],
            "false_hit_examples": [false_hit(plan, o) for o in false[:30]],
        }
        if system == "smartcache":
            systems[system]["statuses"] = dict(collections.Counter(o.reply.status for o in outcomes))
            missed = [o for o in outcomes if KINDS[plan.kinds[o.pos]][1] and not o.reply.hit]
            systems[system]["why_repeats_missed"] = dict(
                collections.Counter(f"{o.reply.intent or '-'}: {o.reply.reason or o.reply.status}" for o in missed)
            )
    return systems


def write_trace(path: Path, plan: Plan, runs: Mapping[str, Mapping[str, Any]]) -> None:
    """Every request of every system, one JSON line each, in the order they were answered."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for system, run in runs.items():
            for o in run["outcomes"]:
                s, r = plan.sessions[o.pos[0]], plan.sessions[o.pos[0]].requests[o.pos[1]]
                row = {
                    "system": system,
                    "session": s.sid,
                    "turn": o.pos[1],
                    "kind": plan.kinds[o.pos],
                    "text": r.text,
                    "deserved": r.answer_id,
                    "right": served_code(o.reply) == plan.deserved(o.pos),
                    "hit": o.reply.hit,
                    "status": o.reply.status,
                    "reason": o.reply.reason,
                    "intent": o.reply.intent,
                    "score": o.reply.score,
                    "ms": round(o.latency_s * 1000, 1),
                }
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


def false_hit(plan: Plan, o: Outcome) -> dict[str, Any]:
    """What a false hit was asked and what it was served, for reading."""
    s = plan.sessions[o.pos[0]]
    by_code = {code: answer_id for answer_id, code in plan.codes.items()}
    by_tenant = {code: tenant for tenant, code in plan.tenants.items()}
    answer, _, tenant = (served_code(o.reply) or ":").partition(":")
    return {
        "session": s.sid,
        "turn": o.pos[1],
        "kind": plan.kinds[o.pos],
        "asked": s.requests[o.pos[1]].text,
        "deserved": s.requests[o.pos[1]].answer_id,
        "served": by_code.get(answer, answer),
        "served_tenant": by_tenant.get(tenant, tenant) if by_tenant.get(tenant) != s.tenant else "same",
        "reason": o.reply.reason,
        "intent": o.reply.intent,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    plan = build_plan(load_pool(), args.sessions, args.seed)
    total = sum(len(s.requests) for s in plan.sessions)
    print(f"{len(plan.sessions)} sessions, {total} requests a system", file=sys.stderr)

    async def all_systems(engine: str | None) -> dict[str, Any]:
        if args.sequential:
            return {system: await run_system(system, plan, args, engine) for system in SYSTEMS}
        runs = await asyncio.gather(*(run_system(system, plan, args, engine) for system in SYSTEMS))
        return dict(zip(SYSTEMS, runs, strict=True))

    async def main() -> dict[str, Any]:
        if not args.engine:
            return await all_systems(None)
        from proxy.upstream.engine import LocalEngine

        async with LocalEngine(parallel=2, ctx_size=4096) as engine:
            return await all_systems(engine.base_url)

    runs = asyncio.run(main())
    if args.trace is not None:
        write_trace(args.trace, plan, runs)
    return {
        "sessions": len(plan.sessions),
        "sessions_per_domain": args.sessions,
        "requests_per_system": total,
        "domains": list(DOMAINS),
        "mix": mix(plan),
        "upstream": "llama.cpp engine (SmolLM2-135M), tagged by the oracle" if args.engine else "scripted oracle",
        "latency_model": None if args.engine else str(args.latency),
        "judge_model": str(JudgeModel(args.judge_error, args.judge_miss, args.judge_ms)),
        "ready_after_s": args.ready_after,
        "think_s": list(THINK_S),
        "repeat_gap_s": REPEAT_GAP_S,
        "concurrency": args.concurrency,
        "seed": args.seed,
        "systems": collate(plan, runs),
    }


# --- the report --------------------------------------------------------------------------------


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def print_report(res: Mapping[str, Any]) -> None:
    systems, total = res["systems"], res["requests_per_system"]
    print(
        f"\n{res['sessions']} sessions ({res['sessions_per_domain']} a domain: {', '.join(res['domains'])}; "
        f"en and zh), {total} requests a system\n"
    )
    print("| system | requests | hit rate | false hits | saved tokens | mean ms | p95 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for system in SYSTEMS:
        a = systems[system]["all"]
        print(
            f"| {SYSTEM_NAMES[system]} | {a['requests']} | {pct(a['hit_rate'])} | {a['false_hits']} | "
            f"{a['saved_tokens']:,} | {a['mean_ms']:.0f} | {a['p95_ms']:.0f} |"
        )
    m = res["mix"]
    close = sum(n for k, n in m.items() if KINDS[k][1])
    parts = ", ".join(f"{KINDS[k][0]} {pct(m[k] / total)}" for k in KINDS if KINDS[k][1])
    others = ", ".join(f"{KINDS[k][0]} {pct(m[k] / total)}" for k in KINDS if not KINDS[k][1])
    print(f"\nRepetition mix: {pct(close / total)} of requests close to an earlier one ({parts}); {others}.")
    print(
        f"Upstream: {res['upstream']}"
        + (f", {res['latency_model']}" if res["latency_model"] else "")
        + f". SmartCache feedback window (ready_after) {res['ready_after_s']:g} s (default 60 s), racing the upstream; "
        f"think time {res['think_s'][0]:g}-{res['think_s'][1]:g} s; {res['concurrency']} users at a time a system."
    )
    up = systems["smartcache"]["upstream"]
    print(
        f"SmartCache's judge ({res.get('judge_model', 'oracle judge')}; figures simulate a judge of that quality): "
        f"{up.get('judge_calls', 0)} calls ({up.get('judge_calls', 0) / max(total, 1):.2f} a request), "
        f"said yes {up.get('judge_yes', 0)}, wrong {up.get('judge_wrong', 0)}; exam calls {up.get('exam_calls', 0)}."
    )
    print("Article §5.1 (its own traces): exact prefix 8.2 % hits, SmartCache 26.7 %; P50 1.85 / 1.74 / 0.91 s.")
    print("\n| request kind | requests | exact-prefix hits | SmartCache hits | SmartCache false hits |")
    print("|---|---:|---:|---:|---:|")
    for k in KINDS:
        e, s = systems["exact_prefix"]["by_kind"][k], systems["smartcache"]["by_kind"][k]
        print(f"| {KINDS[k][0]} | {e['requests']} | {e['hits']} | {s['hits']} | {s['false_hits']} |")
    print(
        "\n| domain | requests | exact-prefix hit rate | SmartCache hit rate | SmartCache false hits | "
        "SmartCache mean ms | no-cache mean ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for d in DOMAINS:
        n, e, s = (systems[x]["by_domain"][d] for x in SYSTEMS)
        print(
            f"| {d} | {s['requests']} | {pct(e['hit_rate'])} | {pct(s['hit_rate'])} | {s['false_hits']} | "
            f"{s['mean_ms']:.0f} | {n['mean_ms']:.0f} |"
        )
    for ex in systems["smartcache"]["false_hit_examples"][:5]:
        print(f"SmartCache false hit ({ex['kind']}): {ex['asked']!r} deserved {ex['deserved']}, served {ex['served']}")
    why = sorted(systems["smartcache"]["why_repeats_missed"].items(), key=lambda kv: -kv[1])[:6]
    print("\nSmartCache on repeats it did not serve (intent: reason): " + "; ".join(f"{k} {v}" for k, v in why))
    for system in SYSTEMS:
        a = systems[system]["all"]
        if a["wrong_on_misses"] or systems[system]["upstream"]["unknown"]:
            print(
                f"WARNING {system}: {a['wrong_on_misses']} misses answered with another request's answer, "
                f"{systems[system]['upstream']['unknown']} conversations unknown to the oracle"
            )


def print_plan(plan: Plan, samples: int = 6) -> None:
    m, total = mix(plan), sum(len(s.requests) for s in plan.sessions)
    print(f"{len(plan.sessions)} sessions, {total} requests, {len(plan.tenants)} tenants")
    for k, n in m.items():
        print(f"  {KINDS[k][0]:<26} {n:>6}  {100 * n / total:5.1f} %")
    print(f"  close to an earlier one    {100 * sum(n for k, n in m.items() if KINDS[k][1]) / total:13.1f} %")
    for si in plan.order()[:samples]:
        s = plan.sessions[si]
        print(f"\n{s.sid} ({s.tenant}, {s.lang})")
        for j, r in enumerate(s.requests):
            print(f"  [{plan.kinds[si, j]}] {r.text}   -> {r.answer_id}")


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="40 sessions a domain (else --sessions, default 200)")
    ap.add_argument("--sessions", type=int, default=200, help="sessions a domain")
    ap.add_argument("--concurrency", type=int, default=0, help="users at a time, each system (default: by size)")
    ap.add_argument("--sequential", action="store_true", help="the three systems one after another")
    ap.add_argument("--ready-after", type=float, default=READY_AFTER_S, help="SmartCache's feedback window, s")
    ap.add_argument("--policy", type=Path, help="a policy file for SmartCache (default: the shipped one)")
    ap.add_argument("--judge-error", type=float, default=JudgeModel.error, help="the oracle judge's false-yes rate")
    ap.add_argument("--judge-miss", type=float, default=JudgeModel.miss, help="the oracle judge's false-no rate")
    ap.add_argument("--judge-ms", type=float, default=JudgeModel.ms, help="the oracle judge's latency")
    ap.add_argument("--fixed-ms", type=float, default=LatencyModel.fixed_ms)
    ap.add_argument("--prefill-ms", type=float, default=LatencyModel.prefill_ms, help="a prompt token")
    ap.add_argument("--decode-ms", type=float, default=LatencyModel.decode_ms, help="a completion token")
    ap.add_argument("--engine", action="store_true", help="the local llama.cpp engine behind the oracle")
    ap.add_argument("--max-tokens", type=int, default=256, help="answer cap (the engine's)")
    ap.add_argument("--model-home", type=Path, default=DEFAULT_MODEL_HOME)
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/bench_domains.json")
    ap.add_argument("--trace", type=Path, help="write every request's outcome here (JSON lines)")
    ap.add_argument("--plan-only", action="store_true", help="print the traffic's mix and sample sessions, run nothing")
    args = ap.parse_args(argv)
    if args.quick:
        args.sessions = 40
    if args.plan_only:
        print_plan(build_plan(load_pool(), args.sessions, args.seed))
        return 0
    args.concurrency = args.concurrency or max(8, min(128, args.sessions * len(DOMAINS) // 5))
    args.latency = LatencyModel(args.fixed_ms, args.prefill_ms, args.decode_ms)
    if args.ready_after + 0.5 > min(THINK_S[0], REPEAT_GAP_S):
        ap.error(f"--ready-after must leave 0.5 s of the {min(THINK_S[0], REPEAT_GAP_S):g} s think time")
    # the engine runs in a process group of its own: a SIGTERM to this one must unwind through
    # LocalEngine's exit to stop it
    signal.signal(signal.SIGTERM, _interrupted)
    res = measure(args)
    print_report(res)
    path = write_json(args.json, "bench_domains", envelope("bench_domains", sys.argv, res))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
