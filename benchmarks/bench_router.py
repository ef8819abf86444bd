"""The proxy behind a real router in front of three local llama.cpp engines: how much of each
conversation's history the engines reuse on its follow-ups, by the router's policy.

Three engines (the embedded engine's model, SmolLM2-135M, proxy/upstream/engine.py) behind
``vllm-router`` (the ``router`` extra), the proxy in front of the router, clients sending an API
key and nothing else (the proxy derives each conversation's session). Each mode starts fresh
engines, router and proxy, so no mode inherits another's KV cache:

- ``proxy-key``:   vllm-router ``--policy consistent_hash`` on the proxy's ``x-session-id``;
- ``round-robin``: vllm-router ``--policy round_robin``;
- ``cache-aware``: vllm-router ``--policy cache_aware`` (its own prefix tree of the prompts);
- ``sglang-key``:  sglang-router (SGLang's model gateway, which serves any OpenAI-compatible
  worker) ``--policy manual`` on the proxy's ``x-smg-routing-key`` (flavour ``sglang``);
- ``failover``:    as ``proxy-key``, with the busiest engine killed (SIGKILL) once a third of the
  turns are answered: the client errors (target 0) and the requests the proxy retried;
- ``failover-bare``: the same with the router's own retries off, so only the proxy's retry moves
  a request off the dead engine.

Every conversation opens with notes of its own and adds more on each turn, so its history is the
only prefix worth reusing (the system prompt is one short line). Every request carries
``Cache-Control: no-cache``: each reaches an engine, and the modes differ only in where it goes.
``history reused`` is, over follow-up turns, the prompt tokens the engine reported cached
(``usage.prompt_tokens_details.cached_tokens``) as a share of the tokens the previous turn left
in some engine (its prompt plus its answer); ``cached`` is their share of the follow-ups' whole
prompts. Latency is what the client saw; requests/s is the mode's requests over its wall time;
``busiest engine share`` is the share of all prompt tokens the busiest engine served (a third:
even), which is what a sticky policy trades for its reuse.

    .venv/bin/python benchmarks/bench_router.py [--quick] [--modes ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from rich.console import Console
from rich.table import Table
from structlog.testing import capture_logs

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from measurement import DEFAULT_MODEL_HOME, add_pack_option, envelope, fmt, summary, write_json

from proxy.embedding.backends import SyncEmbedder
from proxy.embedding.packs import load_embedder
from proxy.http.app import create_app
from proxy.settings import load_settings
from proxy.upstream.engine import LocalEngine
from tests.storage.redis_server import free_port
from tests.upstream.router_process import INSTALL_HINT, RESILIENT, VllmRouter, find_binary

_SERVED = re.compile(r"^llamacpp:(prompt_tokens_total|prompt_tokens_cached_total) ([0-9.eE+-]+)$", re.MULTILINE)
NO_CACHE = {"Authorization": "Bearer bench", "Cache-Control": "no-cache"}
WARM_UP = {"messages": [{"role": "user", "content": "Say hi."}]}
SYSTEM = "You are a concise assistant. Answer in one short sentence."
MODES = ("proxy-key", "round-robin", "cache-aware", "sglang-key", "failover", "failover-bare")
# the router's flags in the failover modes: as the README says to start it (its own retries reach a
# live replica once the dead one's breaker opens), and with its retries off, so that what moves a
# request off the dead replica is the proxy's one retry
FAILOVER = {"failover": RESILIENT, "failover-bare": ("--disable-retries", "--cb-failure-threshold", "1")}
POLICY = {"proxy-key": "consistent_hash", "round-robin": "round_robin", "cache-aware": "cache_aware"}
# notes are made of two-syllable words, drawn per conversation: no two conversations share them
SYLLABLES = ("ka", "lo", "mi", "ren", "tos", "vel", "dar", "quin", "bro", "sil", "ment", "ha", "ur", "pe")


@dataclass(frozen=True)
class Conversation:
    id: int
    turns: tuple[str, ...]


def conversations(n: int, turns: int, seed: int) -> list[Conversation]:
    """Each opens with notes of its own and adds more on every turn (40 words a turn)."""
    rng = random.Random(seed)

    def notes() -> str:
        return " ".join(rng.choice(SYLLABLES) + rng.choice(SYLLABLES) for _ in range(40))

    out = []
    for i in range(n):
        first = f"Conversation {i}. Here are my notes: {notes()}. What are they mostly about?"
        rest = [f"More notes, part {t}: {notes()}. What changes now?" for t in range(1, turns)]
        out.append(Conversation(i, (first, *rest)))
    return out


@dataclass
class ModeResult:
    mode: str
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    followups: int = 0
    history_tokens: int = 0  # what the previous turns left in some engine, over follow-ups
    reused_tokens: int = 0  # cached prompt tokens of follow-ups, at most that history
    prompt_tokens: int = 0  # follow-ups' whole prompts
    cached_tokens: int = 0
    retried: int = 0
    wall_s: float = 0.0
    killed_share: float | None = None  # of the prompt tokens served before it, by the engine killed
    busiest_share: float | None = None  # of all prompt tokens, by the engine that served the most

    def row(self) -> dict[str, Any]:
        lat = summary(self.latencies)
        return {
            "client_errors": self.errors,
            "retried": self.retried,
            "history_reused": round(self.reused_tokens / self.history_tokens, 4) if self.history_tokens else None,
            "followup_cached": round(self.cached_tokens / self.prompt_tokens, 4) if self.prompt_tokens else None,
            "p50_ms": round(lat["p50"] * 1000),
            "p95_ms": round(lat["p95"] * 1000),
            "requests_per_s": round(len(self.latencies) / self.wall_s, 2) if self.wall_s else None,
            "busiest_engine_share": self.busiest_share,
            "killed_engine_share": self.killed_share,
        }


@dataclass
class SglangRouter:
    """sglang-router (SGLang's model gateway) on a free port, in front of ``workers``."""

    workers: Sequence[str]
    log: Path
    port: int = field(default_factory=free_port)
    process: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self, timeout: float = 120.0) -> None:
        command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--policy", "manual", "--prometheus-port", str(free_port())]
        command += ["--worker-urls", *self.workers]
        self.process = await asyncio.create_subprocess_exec(
            *command, stdout=self.log.open("ab"), stderr=asyncio.subprocess.STDOUT
        )
        await wait_healthy(f"http://127.0.0.1:{self.port}/health", timeout, "sglang-router")

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()


async def wait_healthy(url: str, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{what} not healthy at {url} within {timeout:g} s")


@asynccontextmanager
async def proxy_app(upstream: str, flavour: str, backend: SyncEmbedder, model_home: Path) -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory() as data_dir:
        settings = load_settings(
            environ={},
            overrides={
                "upstream": upstream,
                "upstream_flavour": flavour,
                "data_dir": data_dir,
                "model_home": model_home,
                "upstream_timeout": 300.0,
                "embed_timeout_ms": 60_000.0,  # three engines share the cores: never an overload bypass
            },
        )
        runner = web.AppRunner(create_app(settings, backend=backend), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        finally:
            await runner.cleanup()


@asynccontextmanager
async def stack_for(mode: str, engines: Sequence[LocalEngine], backend: SyncEmbedder, args: Any) -> AsyncIterator[str]:
    """The router for ``mode`` in front of ``engines`` and the proxy in front of it; the proxy's URL."""
    workers = [e.root_url for e in engines]
    log = args.logs / f"{mode}.router.log"
    if mode == "sglang-key":
        sglang = SglangRouter(workers, log)
        await sglang.start()
        try:
            async with proxy_app(sglang.url, "sglang", backend, args.model_home) as url:
                yield url
        finally:
            await sglang.stop()
        return
    flags = FAILOVER.get(mode, RESILIENT)
    router = VllmRouter(workers, policy=POLICY.get(mode, "consistent_hash"), extra=flags, log=log)
    await asyncio.to_thread(router.start, 120.0)
    try:
        async with proxy_app(router.url, "vllm", backend, args.model_home) as url:
            yield url
    finally:
        router.stop()


async def converse(
    client: httpx.AsyncClient, url: str, conv: Conversation, result: ModeResult, gen: dict[str, Any], done: list[int]
) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    left = 0  # tokens the previous turn left in an engine: its prompt and its answer
    for n, text in enumerate(conv.turns):
        messages.append({"role": "user", "content": text})
        started = time.perf_counter()
        try:
            resp = await client.post(
                f"{url}/chat/completions",
                json={"model": "m", "messages": messages, **gen},
                headers=NO_CACHE,
            )
            result.latencies.append(time.perf_counter() - started)
            resp.raise_for_status()
        except httpx.HTTPError:
            result.errors += 1
            return  # a client that got an error stops that conversation
        finally:
            done[0] += 1
        body = resp.json()
        usage = body.get("usage") or {}
        prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
        if n > 0:
            result.followups += 1
            result.history_tokens += left
            result.reused_tokens += min(cached, left)
            result.prompt_tokens += prompt
            result.cached_tokens += cached
        left = prompt + completion
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"] or ""})


async def kill_busiest(
    client: httpx.AsyncClient, engines: Sequence[LocalEngine], done: list[int], at: int, result: ModeResult
) -> None:
    """Once ``at`` requests are answered, SIGKILL the engine that has served the most prompt
    tokens so far (one that holds conversations, whichever the policy gave it): a crash, not a
    shutdown, with no chance to finish what it holds."""
    while done[0] < at:
        await asyncio.sleep(0.05)
    served = [await prompt_tokens_seen(client, e) for e in engines]
    victim = engines[served.index(max(served))]
    if victim.pid is not None:
        os.killpg(victim.pid, signal.SIGKILL)
        result.killed_share = round(max(served) / sum(served), 3) if sum(served) else None


async def prompt_tokens_seen(client: httpx.AsyncClient, engine: LocalEngine) -> float:
    """Prompt tokens the engine computed or took from its cache (its /metrics counters)."""
    text = (await client.get(f"{engine.root_url}/metrics")).text
    return sum(float(m.group(2)) for m in _SERVED.finditer(text))


async def run_mode(mode: str, convs: Sequence[Conversation], backend: SyncEmbedder, args: Any) -> ModeResult:
    result = ModeResult(mode)
    gen = {"max_tokens": args.max_tokens, "temperature": 0}
    async with AsyncExitStack() as stack:
        engines = [
            await stack.enter_async_context(
                LocalEngine(parallel=args.parallel, threads=1, log_path=args.logs / f"{mode}.engine{i}.log")
            )
            for i in range(args.engines)
        ]
        url = await stack.enter_async_context(stack_for(mode, engines, backend, args))
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=300.0, trust_env=False))
        gate = asyncio.Semaphore(args.concurrency)
        done = [0]

        async def one(conv: Conversation) -> None:
            async with gate:
                await converse(client, url, conv, result, gen, done)

        # the first request of a fresh engine pays one-off costs (page faults, allocations), and the
        # first through a fresh proxy its own: paid here, before the clock starts
        for engine in engines:
            await client.post(f"{engine.base_url}/chat/completions", json={**WARM_UP, "max_tokens": 2})
        await client.post(f"{url}/chat/completions", json={**WARM_UP, "model": "m", "max_tokens": 2}, headers=NO_CACHE)
        total = sum(len(c.turns) for c in convs)
        killer = (
            asyncio.ensure_future(kill_busiest(client, engines, done, total // 3, result)) if mode in FAILOVER else None
        )
        with capture_logs() as logs:
            t0 = time.perf_counter()
            await asyncio.gather(*(one(c) for c in convs))
            result.wall_s = time.perf_counter() - t0
        if killer is not None:
            killer.cancel()
        seen = [await prompt_tokens_seen(client, e) for e in engines if e.pid is not None and killer is None]
        if seen and sum(seen):  # how evenly the policy spread the work (not after a kill)
            result.busiest_share = round(max(seen) / sum(seen), 3)
        result.retried = sum(1 for e in logs if e["event"] == "chat.request" and e.get("retried"))
    return result


def print_table(rows: dict[str, dict[str, Any]], console: Console) -> None:
    t = Table(title="the proxy behind a router, three llama.cpp engines")
    cols = ("mode", "client errors", "retried", "history reused", "follow-up cached", "p50 ms", "p95 ms")
    for col in (*cols, "requests/s", "busiest engine", "killed engine"):
        t.add_column(col, justify="right")

    def share(v: float | None) -> str:
        return "-" if v is None else fmt(v * 100, 1) + " %"

    for mode, r in rows.items():
        t.add_row(
            mode,
            str(r["client_errors"]),
            str(r["retried"]),
            share(r["history_reused"]),
            share(r["followup_cached"]),
            fmt(r["p50_ms"], 0),
            fmt(r["p95_ms"], 0),
            fmt(r["requests_per_s"], 2),
            share(r["busiest_engine_share"]),
            share(r["killed_engine_share"]),
        )
    console.print(t)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    convs = conversations(args.conversations, args.turns, args.seed)
    backend = load_embedder(args.pack, args.model_home, auto_install=True)
    rows: dict[str, dict[str, Any]] = {}
    for mode in args.modes:
        started = time.monotonic()
        result = await run_mode(mode, convs, backend, args)
        rows[mode] = result.row()
        print(f"  {mode}: {time.monotonic() - started:.0f} s, {rows[mode]}", flush=True)
    return {
        "conversations": len(convs),
        "turns": args.turns,
        "requests_per_mode": sum(len(c.turns) for c in convs),
        "engines": args.engines,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "modes": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # run_all.py gives a --quick script 6 minutes: six conversations, all in flight at once, fit them
    ap.add_argument("--quick", action="store_true", help="6 conversations of 5 turns in each mode")
    ap.add_argument("--conversations", type=int, default=60)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--engines", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=4, help="slots per engine")
    ap.add_argument("--concurrency", type=int, default=6, help="conversations in flight at once")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    add_pack_option(ap)
    ap.add_argument("--model-home", type=Path, default=DEFAULT_MODEL_HOME)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/bench_router.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.conversations = 6
    if find_binary() is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    if "sglang-key" in args.modes and shutil.which("sglang-router") is None and not _has_sglang():
        print("sglang-router is not installed: its mode is left out (pip install -e '.[router]')", file=sys.stderr)
        args.modes = [m for m in args.modes if m != "sglang-key"]
    with tempfile.TemporaryDirectory() as logs:
        args.logs = Path(logs)
        res = asyncio.run(measure(args))
    print_table(res["modes"], Console(width=140))
    path = write_json(args.json, "bench_router", envelope("bench_router", sys.argv, res))
    print(f"wrote {path}")
    return 0


def _has_sglang() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang_router") is not None


if __name__ == "__main__":
    raise SystemExit(main())
