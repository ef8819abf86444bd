"""The upstream client's own cost: httpx against aiohttp, each as the proxy configures it.

A scripted OpenAI-compatible server runs in a child process on loopback (a JSON completion, and a
stream of ``--events`` SSE chunks), so the CPU measured here is the client's alone. Both clients
keep one pooled connection per call in flight and read each body to the end, as the relay does:
JSON calls read the whole body, streams read chunks as they arrive. Rounds alternate the two
clients; the table gives medians over rounds of wall and CPU milliseconds per call.

    .venv/bin/python benchmarks/bench_upstream_client.py [--calls 400] [--rounds 5] [--events 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurement import envelope, fmt, median_of, write_json

NAME = "bench_upstream_client"

SERVER = r"""
import json, sys, time
from aiohttp import web

EVENTS = int(sys.argv[2])
COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()), "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "word " * 40}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 20, "completion_tokens": 40, "total_tokens": 60},
}).encode()
CHUNK = b"data: " + json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "m",
    "choices": [{"index": 0, "delta": {"content": "word "}, "finish_reason": None}],
}).encode() + b"\n\n"

async def chat(request):
    body = await request.json()
    if not body.get("stream"):
        return web.Response(body=COMPLETION, content_type="application/json")
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(EVENTS):
        await resp.write(CHUNK)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp

app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""

BODY = {"model": "m", "messages": [{"role": "user", "content": "What is a fjord?"}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_listening(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"scripted upstream did not listen on {port}")


Call = Callable[[bool], Awaitable[int]]


def httpx_client(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    client = httpx.AsyncClient(timeout=30, trust_env=False, limits=httpx.Limits(max_connections=512))

    async def call(stream: bool) -> int:
        read = 0
        async with client.stream("POST", url, json={**BODY, "stream": stream}) as resp:
            async for chunk in resp.aiter_raw():
                read += len(chunk)
        return read

    return call, client.aclose


def aiohttp_client(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    connector = aiohttp.TCPConnector(limit=512, limit_per_host=0, keepalive_timeout=15)
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_read=30),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
    )

    async def call(stream: bool) -> int:
        read = 0
        async with session.post(url, json={**BODY, "stream": stream}) as resp:
            async for chunk in resp.content.iter_any():
                read += len(chunk)
        return read

    return call, session.close


async def one_round(call: Call, calls: int, stream: bool, concurrency: int) -> dict[str, float]:
    """Wall and CPU ms per call over ``calls`` calls, ``concurrency`` of them in flight."""
    queue = iter(range(calls))

    async def worker() -> None:
        for _ in queue:
            if await call(stream) <= 0:
                raise RuntimeError("empty body")

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"wall_ms": wall * 1000 / calls, "cpu_ms": cpu * 1000 / calls}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), str(args.events)], env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        await wait_listening(port)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        clients = {"httpx": httpx_client(url), "aiohttp": aiohttp_client(url)}
        for call, _ in clients.values():  # connections open and code paths warm before any round
            for stream in (False, True):
                await one_round(call, 20, stream, args.concurrency)
        rows: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for kind in ("json", "stream"):
                for name, (call, _) in clients.items():
                    rows.setdefault(f"{name}/{kind}", []).append(
                        await one_round(call, args.calls, kind == "stream", args.concurrency)
                    )
        for _, close in clients.values():
            await close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    return {
        key: {"wall_ms": median_of(r, "wall_ms"), "cpu_ms": median_of(r, "cpu_ms"), "rounds": r}
        for key, r in rows.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=400, help="calls per client per round and kind")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--events", type=int, default=30, help="SSE chunks in a streamed answer")
    ap.add_argument("--concurrency", type=int, default=1, help="calls in flight at once")
    ap.add_argument("--quick", action="store_true", help="fewer calls (run_all --quick)")
    ap.add_argument("--json", type=Path, default=None, help="where to write results (default benchmarks/results/)")
    args = ap.parse_args(argv)
    if args.quick:
        args.calls = min(args.calls, 150)
    results = asyncio.run(run(args))
    print(f"upstream client, {args.calls} calls x {args.rounds} rounds, {args.concurrency} in flight, medians")
    print(f"{'kind':<8} {'client':<8} {'wall ms/call':>13} {'CPU ms/call':>12} {'CPU vs aiohttp':>15}")
    for kind in ("json", "stream"):
        base = results[f"aiohttp/{kind}"]["cpu_ms"]
        for name in ("httpx", "aiohttp"):
            row = results[f"{name}/{kind}"]
            ratio = row["cpu_ms"] / base if base else float("nan")
            print(f"{kind:<8} {name:<8} {fmt(row['wall_ms'], 3):>13} {fmt(row['cpu_ms'], 3):>12} {fmt(ratio, 2):>14}x")
    out = write_json(args.json, NAME, envelope(NAME, sys.argv, {"args": vars(args) | {"json": None}, **results}))
    print(f"json: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
