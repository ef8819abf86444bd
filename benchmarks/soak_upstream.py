"""The upstream the soak run talks to: an OpenAI-compatible aiohttp app on loopback with realistic
delays (first byte after 50-500 ms, 20 ms per streamed chunk) and the faults a real engine shows,
picked by a marker in the last user message: ``[fault:500]``, ``[fault:429]``, ``[fault:timeout]``,
``[fault:reset]`` (connection dropped mid-stream), ``[fault:badsse]``, ``[fault:nonjson]``,
``[fault:slowloris]`` (bytes trickle in slower than any timeout allows).

Every answer names the tenant key it was asked with (``[for:<key>]``), so a client that receives
another key's answer has seen a cross-tenant hit.

It runs as its own process (``python benchmarks/soak_upstream.py --port P``), as a real engine
would: inside the load generator's event loop it would be starved by the clients it answers, and
its delays would stretch into timeouts that no real upstream shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

FAULTS = ("500", "429", "timeout", "reset", "badsse", "nonjson", "slowloris")
_MARKER = re.compile(r"\[fault:([a-z0-9]+)\]")
# what this upstream meant to take (first byte, and the chunks' pauses of a stream), so a load
# generator can tell the proxy's time from the upstream's on a miss
PLANNED_HEADER = "x-soak-upstream-ms"


@dataclass
class Delays:
    first_byte: tuple[float, float] = (0.05, 0.5)
    per_chunk: float = 0.02
    chunks: int = 8
    hang: float = 30.0  # how long a timeout fault holds the request


@dataclass
class Tally:
    calls: int = 0
    by_fault: dict[str, int] = field(default_factory=dict)


def _last_user(body: dict[str, Any]) -> str:
    users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
    last = users[-1] if users else ""
    return last if isinstance(last, str) else json.dumps(last)


def _key_of(request: web.Request) -> str:
    auth = request.headers.get("authorization", "")
    return auth.removeprefix("Bearer ").strip() or "anonymous"


def _chunk(cid: str, model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    payload = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def _json_answer(
    request: web.Request, fault: str, payload: dict[str, Any], headers: dict[str, str]
) -> web.StreamResponse:
    """A JSON answer, cut after its headers (``reset``) or trickled a byte a second (``slowloris``)."""
    raw = json.dumps(payload).encode()
    response = web.StreamResponse(
        headers={"content-type": "application/json", "content-length": str(len(raw)), **headers}
    )
    await response.prepare(request)
    if fault == "reset":
        await response.write(raw[: len(raw) // 2])
        assert request.transport is not None
        request.transport.abort()
        return response
    step = 1 if fault == "slowloris" else len(raw)
    for at in range(0, len(raw), step):
        await response.write(raw[at : at + step])
        if fault == "slowloris":
            await asyncio.sleep(1.0)
    return response


def soak_upstream(delays: Delays, tally: Tally, rng: random.Random) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tally.calls += 1
        text = _last_user(body)
        found = _MARKER.search(text)
        fault = found.group(1) if found else ""
        tally.by_fault[fault] = tally.by_fault.get(fault, 0) + 1
        first_byte = rng.uniform(*delays.first_byte)
        pauses = delays.chunks * delays.per_chunk if body.get("stream") else 0.0
        planned = {PLANNED_HEADER: f"{(first_byte + pauses) * 1000:.1f}"}
        await asyncio.sleep(first_byte)
        if fault == "500":
            return web.json_response({"error": {"message": "engine failed", "type": "server_error"}}, status=500)
        if fault == "429":
            return web.json_response(
                {"error": {"message": "slow down", "type": "rate_limit"}}, status=429, headers={"retry-after": "7"}
            )
        if fault == "timeout":
            await asyncio.sleep(delays.hang)
        if fault == "nonjson":
            return web.Response(text="<html>gateway</html>", content_type="application/json")
        answer = f"Answer to: {text[:200]} [for:{_key_of(request)}]"
        model, cid = str(body.get("model", "m")), f"chatcmpl-soak{tally.calls}"
        if not body.get("stream"):
            return await _json_answer(
                request,
                fault,
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
                    ],
                    "usage": {
                        "prompt_tokens": len(text) // 4 + 1,
                        "completion_tokens": len(answer) // 4 + 1,
                        "total_tokens": (len(text) + len(answer)) // 4 + 2,
                    },
                },
                planned,
            )
        response = web.StreamResponse(headers={"content-type": "text/event-stream", **planned})
        await response.prepare(request)
        if fault == "badsse":
            await response.write(b"data: {not json at all\n\ndata: [DONE]\n\n")
            return response
        await response.write(_chunk(cid, model, {"role": "assistant", "content": ""}))
        n = delays.chunks
        pieces = [answer[len(answer) * i // n : len(answer) * (i + 1) // n] for i in range(n)]
        for n, piece in enumerate(pieces):
            if fault == "reset" and n == delays.chunks // 2:
                assert request.transport is not None
                request.transport.abort()
                return response
            if fault == "slowloris":
                for byte in _chunk(cid, model, {"content": piece}):
                    await response.write(bytes([byte]))
                    await asyncio.sleep(1.0)
            await response.write(_chunk(cid, model, {"content": piece}))
            await asyncio.sleep(delays.per_chunk)
        await response.write(_chunk(cid, model, {}, "stop"))
        await response.write(b"data: [DONE]\n\n")
        return response

    async def answered(request: web.Request) -> web.StreamResponse:
        try:
            return await chat(request)
        except ConnectionResetError:
            # the proxy dropped the call (a raced request that was a hit): nobody is left to answer
            # (aiohttp's finish_response drops a reply it cannot send without logging an error)
            return web.Response(status=499)

    async def responses(request: web.Request) -> web.StreamResponse:
        """``/v1/responses`` as JSON, after the same first-byte delay, for a proxy's Responses route
        (bench_overhead's responses rows); faults and streams are chat's alone."""
        body = await request.json()
        tally.calls += 1
        given = body.get("input")
        text = given if isinstance(given, str) else json.dumps(given)
        await asyncio.sleep(rng.uniform(*delays.first_byte))
        answer = f"Answer to: {text[:200]} [for:{_key_of(request)}]"
        message = {"type": "message", "id": f"msg_soak{tally.calls}", "role": "assistant", "status": "completed"}
        usage = {"input_tokens": len(text) // 4 + 1, "output_tokens": len(answer) // 4 + 1}
        return web.json_response(
            {
                "id": f"resp_soak{tally.calls}",
                "object": "response",
                "created_at": int(time.time()),
                "status": "completed",
                "model": str(body.get("model", "m")),
                "output": [{**message, "content": [{"type": "output_text", "text": answer, "annotations": []}]}],
                "usage": {**usage, "total_tokens": usage["input_tokens"] + usage["output_tokens"]},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answered)
    app.router.add_post("/v1/responses", responses)
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--hang", type=float, default=Delays.hang, help="how long a timeout fault holds (seconds)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    app = soak_upstream(Delays(hang=args.hang), Tally(), random.Random(args.seed))
    # the clients cut requests on purpose (faults, kill -9): "client went away" lines are noise
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None, handle_signals=True)


if __name__ == "__main__":
    main()
