"""The CPU of the small parts every request pays for besides the model, each measured alone.

- a thread hop: ``asyncio.to_thread`` of a function that does nothing, what a request pays for
  each step it sends to the SQLite connection's thread or the executor;
- a held answer streamed as SSE: an aiohttp server's CPU for one reply of ``--events`` events,
  written an event at a time or as one body (the client in a child process);
- the canonical log line (``chat.request``) through the JSON pipeline and its redaction;
- an answer's key facts (``extract_key_facts``) over the MT-Bench reference answers in
  ../shared/data, English and Chinese (skipped when the data is not there).

Medians over ``--rounds``; CPU is this process's (``time.process_time``).

    .venv/bin/python benchmarks/bench_request_parts.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurement import ROOT, envelope, write_json

NAME = "bench_request_parts"
DATA = ROOT.parent / "shared" / "data"
CLIENT = r"""
import asyncio, sys, aiohttp
async def main():
    async with aiohttp.ClientSession() as s:
        for _ in range(int(sys.argv[2])):
            async with s.get(sys.argv[1]) as r:
                async for _ in r.content:
                    pass
asyncio.run(main())
"""
LINE = {
    "status": "hit",
    "reason": "accept_zone",
    "intent": "travel",
    "score": 0.9312,
    "latency_ms": 5.21,
    "upstream_status": None,
    "saved_prompt_tokens": 120,
    "saved_completion_tokens": 80,
    "tenant": "t-abc123",
    "session": "s-1",
    "cache_id": "sc-1234567890abcdef1234",
    "stages_ms": {"sign": 1.2, "embed": 2.1, "index": 0.3, "decide": 0.2, "serve": 0.1},
    "model": "m",
    "stream": True,
}


def cpu_us(work: Callable[[], object], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        work()
    return (time.process_time() - start) / n * 1e6


async def hop_us(n: int) -> float:
    def nothing() -> None:
        return None

    for _ in range(100):
        await asyncio.to_thread(nothing)
    start = time.process_time()
    for _ in range(n):
        await asyncio.to_thread(nothing)
    return (time.process_time() - start) / n * 1e6


async def sse_us(events: int, replies: int) -> dict[str, float]:
    """Server CPU a reply, event by event and as one body, the client in a child process."""
    chunks = [
        b"data: "
        + json.dumps({"object": "chat.completion.chunk", "choices": [{"delta": {"content": "x" * 24}}]}).encode()
        + b"\n\n"
        for _ in range(events)
    ] + [b"data: [DONE]\n\n"]
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}

    async def by_event(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
        await response.write_eof()
        return response

    async def whole(request: web.Request) -> web.Response:
        return web.Response(body=b"".join(chunks), headers=headers)

    app = web.Application()
    app.router.add_get("/events", by_event)
    app.router.add_get("/whole", whole)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    out = {}
    try:
        for path in ("events", "whole"):
            start = time.process_time()
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CLIENT, f"http://127.0.0.1:{port}/{path}", str(replies)
            )
            await child.wait()
            out[path] = (time.process_time() - start) / replies * 1e6
    finally:
        await runner.cleanup()
    return out


def log_line_us(n: int) -> float:
    import structlog

    from proxy.observability.log import configure_logging

    configure_logging("info", stream=io.StringIO())
    log = structlog.get_logger("smartcache")
    try:
        return cpu_us(lambda: log.info("chat.request", **LINE), n)
    finally:
        structlog.reset_defaults()


def answers() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for lang, folder in (("en", "mt_bench"), ("zh", "mt_bench_zh")):
        path = DATA / folder / "reference_answer_gpt-4.jsonl"
        if path.is_file():
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            out[lang] = [t for r in rows for c in r["choices"] for t in c["turns"] if t.strip()]
    return out


def facts_ms(texts: list[str]) -> float:
    from proxy.core.decision.validate import extract_key_facts

    for text in texts[:5]:
        extract_key_facts(text)
    start = time.process_time()
    for text in texts:
        extract_key_facts(text)
    return (time.process_time() - start) / len(texts) * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--events", type=int, default=11, help="SSE events in a held reply (about 250 characters)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rounds: list[dict[str, float]] = []
    texts = answers()
    for _ in range(args.rounds):
        row = {"thread hop, us": asyncio.run(hop_us(2000))}
        sse = asyncio.run(sse_us(args.events, 500))
        row["held SSE reply, event by event, us"] = sse["events"]
        row["held SSE reply, one body, us"] = sse["whole"]
        row["log line, us"] = log_line_us(2000)
        for lang, found in texts.items():
            row[f"key facts, {lang} answer, ms"] = facts_ms(found)
        rounds.append(row)
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    table = Table(title=f"CPU of a request's parts besides the model, median of {args.rounds} rounds")
    table.add_column("part")
    table.add_column("CPU", justify="right")
    for key, value in medians.items():
        table.add_row(key, f"{value:.2f}")
    Console().print(table)
    if texts:
        sizes = ", ".join(
            f"{lang}: {len(found)} answers, mean {statistics.mean(map(len, found)):.0f} chars"
            for lang, found in texts.items()
        )
        print(f"MT-Bench reference answers ({sizes})")
    else:
        print(f"key facts skipped: no MT-Bench answers under {DATA}")
    results: dict[str, Any] = {"medians": medians, "rounds": rounds, "events": args.events}
    if args.json:
        write_json(args.json, NAME, envelope(NAME, sys.argv[1:] if argv is None else argv, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
