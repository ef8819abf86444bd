"""Hit latency and miss overhead of the proxy against a scripted upstream on loopback.

Modes side by side in one run, N requests each, sequential (latency, not throughput): direct to
the upstream, then per embedding pack through the proxy as misses (every question new: the
embedding runs) and as hits (every question asked before in its session, lower-cased: the same
normalised text, so its vector comes from the signer's cache). Also each pack's time per
embedding call (the `embed` stage) from the proxy's own metrics.

    .venv/bin/python benchmarks/bench_proxy.py [-n 200] [--model-home DIR] [--packs P ...]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from rich.console import Console
from rich.table import Table

from proxy.http.app import create_app
from proxy.settings import load_settings
from proxy.tools.stats import parse_metrics


def upstream_app() -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        text = "Answer: " + body["messages"][-1]["content"]
        return web.json_response(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def timed(session: aiohttp.ClientSession, url: str, question: str, sid: str) -> tuple[float, str]:
    body = {"model": "m", "messages": [{"role": "user", "content": question}]}
    t0 = time.perf_counter()
    async with session.post(
        url, json=body, headers={"Authorization": "Bearer bench", "x-smartcache-session": sid}
    ) as resp:
        await resp.read()
        status = resp.headers.get("x-cache-status", "-")
    return (time.perf_counter() - t0) * 1000, status


async def run_pack(
    pack: str,
    n: int,
    model_home: Path | None,
    up: TestServer,
    results: dict[str, list[float]],
    statuses: dict[str, set[str]],
) -> float | None:
    """Misses then hits through a fresh proxy embedding with ``pack``; the mean embed-stage time."""
    questions = [f"Question number {i}: what is {i} times {i + 7}?" for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(
            environ={},
            overrides={
                "upstream": str(up.make_url("/v1")),
                "data_dir": Path(tmp),
                "ready_after": 0.0,
                "model_home": model_home,
                "log_level": "warning",
                "embedding_model": pack,
            },
        )
        proxy = TestServer(create_app(settings), host="127.0.0.1")
        await proxy.start_server()
        async with aiohttp.ClientSession() as s:
            via = str(proxy.make_url("/v1/chat/completions"))
            await timed(s, via, "warm-up question", "warm")
            miss = [await timed(s, via, q, f"s{i}") for i, q in enumerate(questions)]
            hit = [await timed(s, via, q.lower(), f"s{i}") for i, q in enumerate(questions)]
            async with s.get(str(proxy.make_url("/metrics"))) as r:
                snap = parse_metrics(await r.text())
        await proxy.close()
    for mode, rows in ((f"miss · {pack}", miss), (f"hit · {pack}", hit)):
        results[mode] = [ms for ms, _ in rows]
        statuses[mode] = {st for _, st in rows}
    embed = snap.stages.get("embed")
    return embed.mean * 1000 if embed is not None else None


async def main(n: int, model_home: Path | None, packs: list[str]) -> None:
    up = TestServer(upstream_app(), host="127.0.0.1")
    await up.start_server()
    results: dict[str, list[float]] = {}
    statuses: dict[str, set[str]] = {}
    async with aiohttp.ClientSession() as s:
        direct = str(up.make_url("/v1/chat/completions"))
        results["direct"] = [(await timed(s, direct, f"Question {i}", f"s{i}"))[0] for i in range(n)]
    embed_ms = {pack: await run_pack(pack, n, model_home, up, results, statuses) for pack in packs}
    await up.close()
    table = Table(title=f"proxy latency, {n} sequential requests per mode (ms)")
    for col in ("mode", "x-cache-status", "p50", "p95", "mean", "p50 over direct"):
        table.add_column(col)
    base = statistics.median(results["direct"])
    for mode, values in results.items():
        q = statistics.quantiles(values, n=20)
        table.add_row(
            mode,
            ",".join(sorted(statuses.get(mode, {"-"}))),
            f"{statistics.median(values):.2f}",
            f"{q[18]:.2f}",
            f"{statistics.fmean(values):.2f}",
            "-" if mode == "direct" else f"{statistics.median(values) - base:+.2f}",
        )
    console = Console(width=120)
    console.print(table)
    for pack, ms in embed_ms.items():
        if ms is not None:
            console.print(f"{pack}: embedding time per embedding call (mean) {ms:.2f} ms")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--model-home", type=Path)
    ap.add_argument("--packs", nargs="+", default=["e5-small-multilingual", "use-multilingual"])
    a = ap.parse_args()
    asyncio.run(main(a.n, a.model_home, a.packs))
