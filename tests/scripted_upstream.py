"""A scripted OpenAI-compatible upstream: a real aiohttp server on 127.0.0.1 whose behaviour a
test sets per call (answer, error, delay, cut stream), and which records what it received."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Script:
    mode: str = "ok"  # ok | error500 | error400 | error429 | slow | cut | toolcall | length
    delay: float = 0.0
    answers: dict[str, str] = field(default_factory=dict)  # last user text -> answer
    calls: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)  # each chat call's query string, as it came
    # headers every error answer carries (rate limits, request id), as a real API's do
    error_headers: dict[str, str] = field(default_factory=dict)
    counter: int = 0
    # when set, every call waits for it (after ``delay``): a test releases the upstream once what
    # it arranged (followers queued behind one call) is in place, whatever the machine's speed
    hold: asyncio.Event | None = None
    # last user text of each call whose client had gone by the time it was to be answered
    aborted: list[str] = field(default_factory=list)
    # the calls now waiting on ``hold``, so a test can see which of them their clients have left
    waiting: list[web.Request] = field(default_factory=list)

    # judge requests (x-smartcache-judge), answered as the replay harness's oracle does and kept
    # apart from ``calls``: the cached answer is right when it is the one this script gives the new
    # request; a seeded false yes / false no per pair at these rates
    judge_error: float = 0.0
    judge_miss: float = 0.0
    judge_delay: float = 0.0
    judge_calls: list[dict[str, Any]] = field(default_factory=list)
    exam_calls: int = 0

    def judge_says(self, body: dict[str, Any], exam: str | None, expect: str) -> bool:
        msgs = body["messages"]
        if exam is not None:
            same, pair = expect == "yes", json.dumps(msgs, sort_keys=True)
        else:
            users = [m.get("content") for m in msgs if m.get("role") == "user"]
            new, cached = str(users[-2]) if len(users) >= 2 else "", str(msgs[-2].get("content"))
            same = self.answers.get(new, "").strip() == cached.strip() or cached.endswith(f" to: {new}")
            pair = f"{new}|{cached}"
        u = int(hashlib.sha1(f"7|{pair}".encode()).hexdigest()[:8], 16) / 2**32
        return (u >= self.judge_miss) if same else (u < self.judge_error)

    def answer_for(self, body: dict[str, Any]) -> str:
        users = [m["content"] for m in body["messages"] if m.get("role") == "user"]
        last = users[-1] if users else ""
        if isinstance(last, list):
            last = " ".join(p.get("text", "") for p in last)
        self.counter += 1
        return self.answers.get(last, f"Answer #{self.counter} to: {last}")


def _usage(body: dict[str, Any], text: str) -> dict[str, Any]:
    prompt = sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4 + 1
    completion = len(text) // 4 + 1
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def scripted_app(script: Script) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "x-smartcache-judge" in request.headers:
            return await _judge(request, body)
        script.calls.append(body)
        script.headers.append(dict(request.headers))
        script.queries.append(request.rel_url.raw_query_string)
        users = [m["content"] for m in body["messages"] if m.get("role") == "user"]
        try:
            if script.delay:
                await asyncio.sleep(script.delay)
            if script.hold is not None:
                script.waiting.append(request)
                try:
                    await script.hold.wait()
                finally:
                    script.waiting.remove(request)
        except asyncio.CancelledError:  # aiohttp cancels a handler whose client has gone
            script.aborted.append(str(users[-1]) if users else "")
            raise
        if request.transport is None or request.transport.is_closing():
            script.aborted.append(str(users[-1]) if users else "")
            return web.Response(status=499)
        if script.mode == "error500":
            return web.json_response(
                {"error": {"message": "engine exploded", "type": "server_error", "param": None, "code": "boom"}},
                status=500,
                headers=script.error_headers,
            )
        if script.mode == "error429":
            return web.json_response(
                {
                    "error": {
                        "message": "Rate limit reached for requests",
                        "type": "requests",
                        "param": None,
                        "code": "rate_limit_exceeded",
                    }
                },
                status=429,
                headers=script.error_headers,
            )
        if script.mode == "error400":
            return web.json_response(
                {
                    "error": {
                        "message": "context too long",
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": "context_length_exceeded",
                    }
                },
                status=400,
                headers=script.error_headers,
            )
        text = script.answer_for(body)
        finish = "length" if script.mode == "length" else "stop"
        if body.get("stream"):
            return await _stream(request, body, text, finish, cut=script.mode == "cut")
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if script.mode == "toolcall":
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            }
            finish = "tool_calls"
        return web.json_response(
            {
                "id": f"chatcmpl-up{script.counter}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": _usage(body, text),
            }
        )

    async def _judge(request: web.Request, body: dict[str, Any]) -> web.Response:
        exam = request.headers["x-smartcache-judge"] if request.headers["x-smartcache-judge"] == "exam" else None
        if exam is None:
            script.judge_calls.append(body)
        else:
            script.exam_calls += 1
        if script.judge_delay:
            await asyncio.sleep(script.judge_delay)
        word = "yes" if script.judge_says(body, exam, request.headers.get("x-smartcache-expect", "")) else "no"
        return web.json_response(
            {
                "id": "chatcmpl-judge",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": word}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
            }
        )

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(
            {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                "model": body["model"],
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/embeddings", embeddings)
    return app


async def _stream(
    request: web.Request, body: dict[str, Any], text: str, finish: str, *, cut: bool
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    base = {
        "id": "chatcmpl-upstream",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body["model"],
    }

    async def send(obj: dict[str, Any]) -> None:
        await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

    await send(
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    )
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    for i, piece in enumerate(pieces):
        await send({**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
        await asyncio.sleep(0.002)
        if cut and i >= len(pieces) // 2:
            # the engine dies mid-answer: the connection closes with no finish and no [DONE]
            request.transport.close()  # type: ignore[union-attr]
            return resp
    await send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        await send({**base, "choices": [], "usage": _usage(body, text)})
    await resp.write(b"data: [DONE]\n\n")
    return resp
