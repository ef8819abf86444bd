"""What the cache and the engine's prefix cache each save on a multi-turn replay.

Replays MT-Bench conversations (../shared/data/mt_bench, read at run time) against the local
llama.cpp engine (SmolLM2-135M, proxy/upstream/engine.py), once per mode, each mode on a fresh engine so
no mode inherits another's KV cache:

- ``direct``:       client -> engine;
- ``proxy-off``:    client -> proxy -> engine, every request with ``cache: {no_cache, no_store}``;
- ``proxy-on``:     client -> proxy -> engine, the cache on;
- ``proxy-prewarm``: as proxy-on, plus KV prewarm after each direct hit (settings ``prewarm``).

Each conversation is: turn 1; for two conversations in three a near-repeat of turn 1 in its
place (lower-cased, end punctuation dropped: a user re-sending the question, which a semantic
cache should answer and an exact-match cache cannot); then turn 2 on top of the answer the client
got. Every engine gets one unrelated warm-up request before its counters are read. Answers are one line
(``stop: ["\\n"]``) so that they finish with "stop" and may be stored.

Prefill and cached tokens come from the engine's own counters (``llamacpp:prompt_tokens_total``
and ``llamacpp:prompt_tokens_cached_total``, /metrics), so prewarm requests count too; latency is
what the client saw per request.

    .venv/bin/python benchmarks/bench_kv.py [--data ../shared/data] [--conversations 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from structlog.testing import capture_logs

from proxy.embedding.backends import SyncEmbedder
from proxy.embedding.packs import load_embedder
from proxy.http import keys
from proxy.http.app import create_app
from proxy.settings import load_settings
from proxy.upstream.engine import LocalEngine

ROOT = Path(__file__).resolve().parent.parent

SYSTEM = "You are a helpful assistant. Answer in one short sentence."
MODES = ("direct", "proxy-off", "proxy-on", "proxy-prewarm")
_METRIC = re.compile(r"^llamacpp:(\w+) ([0-9.eE+-]+)$", re.MULTILINE)


@dataclass(frozen=True)
class Dialogue:
    id: str
    first: str
    second: str
    repeat: bool


def load_dialogues(data: Path, n: int) -> list[Dialogue]:
    """Short MT-Bench conversations, taken round-robin over the categories for variety."""
    rows = [json.loads(line) for line in (data / "mt_bench" / "question.jsonl").read_text().splitlines() if line]
    by_category: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if len(row["turns"][0]) < 300 and len(row["turns"][1]) < 250:
            by_category.setdefault(row["category"], []).append(row)
    picked: list[dict[str, Any]] = []
    while len(picked) < n and any(by_category.values()):
        for rows_of in by_category.values():
            if rows_of and len(picked) < n:
                picked.append(rows_of.pop(0))
    return [Dialogue(f"mt{r['question_id']}", r["turns"][0], r["turns"][1], i % 3 != 2) for i, r in enumerate(picked)]


def near_repeat(text: str) -> str:
    return text.rstrip(" .?!").lower()


@dataclass
class ModeResult:
    mode: str
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    engine: dict[str, float] = field(default_factory=dict)
    saved_tokens: int = 0
    prewarms: int = 0


async def engine_counters(client: httpx.AsyncClient, root: str) -> dict[str, float]:
    text = (await client.get(f"{root}/metrics")).text
    return {m.group(1): float(m.group(2)) for m in _METRIC.finditer(text)}


async def replay(
    client: httpx.AsyncClient,
    base_url: str,
    dialogues: Sequence[Dialogue],
    result: ModeResult,
    *,
    gen: dict[str, Any],
    extra: dict[str, Any],
) -> None:
    async def ask(session: str, messages: list[dict[str, str]]) -> str:
        body = {"model": "m", "messages": messages, **gen, **extra}
        started = time.perf_counter()
        resp = await client.post(
            f"{base_url}/chat/completions",
            json=body,
            headers={"x-smartcache-session": session, "Authorization": "Bearer bench"},
        )
        result.latencies.append(time.perf_counter() - started)
        resp.raise_for_status()
        result.statuses[resp.headers.get("x-cache-status", "direct")] += 1
        return str(resp.json()["choices"][0]["message"]["content"])

    for d in dialogues:
        session = f"{result.mode}-{d.id}"
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": d.first}]
        answer = await ask(session, first)
        if d.repeat:
            first = [first[0], {"role": "user", "content": near_repeat(d.first)}]
            answer = await ask(session, first)
        await ask(session, [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": d.second}])


@asynccontextmanager
async def running_proxy(
    engine: LocalEngine, backend: SyncEmbedder, model_home: Path, *, prewarm: bool
) -> AsyncIterator[tuple[str, web.Application]]:
    with tempfile.TemporaryDirectory() as data_dir:
        settings = load_settings(
            environ={},
            overrides={
                "upstream": engine.base_url,
                "upstream_flavour": "llamacpp",
                "data_dir": data_dir,
                "model_home": model_home,
                "ready_after": 0.0,
                "prewarm": prewarm,
                "upstream_timeout": 300.0,
            },
        )
        app = create_app(settings, backend=backend)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        try:
            yield f"http://{host}:{port}/v1", app
        finally:
            await runner.cleanup()


async def run_mode(
    mode: str, dialogues: Sequence[Dialogue], backend: SyncEmbedder, model_home: Path, gen: dict[str, Any]
) -> ModeResult:
    result = ModeResult(mode)
    async with LocalEngine(parallel=4) as engine, httpx.AsyncClient(timeout=300.0, trust_env=False) as client:
        # the first request of a fresh engine pays one-off costs (page faults, allocations)
        await client.post(
            f"{engine.base_url}/chat/completions",
            json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2},
        )
        before = await engine_counters(client, engine.root_url)
        if mode == "direct":
            await replay(client, engine.base_url, dialogues, result, gen=gen, extra={})
        else:
            extra = {"cache": {"no_cache": True, "no_store": True}} if mode == "proxy-off" else {}
            with capture_logs() as logs:
                async with running_proxy(engine, backend, model_home, prewarm=mode == "proxy-prewarm") as (url, app):
                    await replay(client, url, dialogues, result, gen=gen, extra=extra)
                    chat = app[keys.CHAT]
                    if chat.prewarmer is not None:
                        await chat.prewarmer.drain()
                        result.prewarms = chat.prewarmer.sent
            result.saved_tokens = sum(e.get("saved_tokens", 0) for e in logs if e["event"] == "chat.request")
        after = await engine_counters(client, engine.root_url)
    result.engine = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return result


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(results: Sequence[ModeResult]) -> str:
    head = (
        f"{'mode':<14} {'requests':>8} {'hits':>5} {'upstream':>8} {'prefill':>8} {'cached':>7} "
        f"{'cached%':>7} {'decoded':>7} {'saved':>6} {'prewarm':>7} {'p50 ms':>7} {'p95 ms':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        prefill = int(r.engine.get("prompt_tokens_total", 0))
        cached = int(r.engine.get("prompt_tokens_cached_total", 0))
        share = 100 * cached / (prefill + cached) if prefill + cached else 0.0
        upstream = sum(n for s, n in r.statuses.items() if s != "hit")
        p50, p95 = 1000 * statistics.median(r.latencies), 1000 * percentile(r.latencies, 0.95)
        lines.append(
            f"{r.mode:<14} {len(r.latencies):>8} {r.statuses.get('hit', 0):>5} {upstream:>8} {prefill:>8} "
            f"{cached:>7} {share:>6.1f}% {int(r.engine.get('tokens_predicted_total', 0)):>7} {r.saved_tokens:>6} "
            f"{r.prewarms:>7} {p50:>7.0f} {p95:>7.0f}"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    dialogues = load_dialogues(args.data, args.conversations)
    backend = load_embedder("e5-small-multilingual", args.model_home, auto_install=True)
    gen = {"max_tokens": args.max_tokens, "temperature": 0, "stop": ["\n"]}
    print(
        f"{len(dialogues)} MT-Bench conversations ({sum(d.repeat for d in dialogues)} with a near-repeat), "
        f"max_tokens={args.max_tokens}, modes: {', '.join(args.modes)}",
        flush=True,
    )
    results = []
    for mode in args.modes:
        started = time.monotonic()
        results.append(await run_mode(mode, dialogues, backend, args.model_home, gen))
        print(f"  {mode}: {time.monotonic() - started:.0f}s, statuses {dict(results[-1].statuses)}", flush=True)
    print()
    print(table(results))
    print(
        "\nprefill = prompt tokens the engine computed (prewarms included); cached = prompt tokens it took "
        "from its prefix cache; saved = prompt+completion tokens our hits did not send upstream."
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument(
        "--model-home", type=Path, default=Path(os.environ.get("SMARTCACHE_TEST_MODEL_HOME") or ROOT / ".smartcache")
    )
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
