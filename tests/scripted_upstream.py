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

    # /v1/responses: each call's body, and the conversation each response it stored closes (its
    # messages in chat's form, instructions aside), so a previous_response_id resolves as OpenAI's does
    responses_calls: list[dict[str, Any]] = field(default_factory=list)
    stored_responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

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

    async def responses(request: web.Request) -> web.StreamResponse:
        return await _responses(request, script)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/responses", responses)
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


# ---- /v1/responses, as an OpenAI-compatible server answers it ---------------------------------


def _input_messages(given: Any) -> list[dict[str, Any]]:
    if given is None:
        return []
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    out = []
    for item in given:
        if item.get("type", "message") != "message":
            continue
        content = item["content"]
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append({"role": item["role"], "content": content})
    return out


def _error(status: int, message: str, kind: str, param: str | None, code: str, headers: dict[str, str]) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


async def _responses(request: web.Request, script: Script) -> web.StreamResponse:
    body = await request.json()
    script.responses_calls.append(body)
    previous = body.get("previous_response_id")
    if previous is not None and previous not in script.stored_responses:
        return _error(
            404,
            f"Previous response with id '{previous}' not found.",
            "invalid_request_error",
            "previous_response_id",
            "previous_response_not_found",
            script.error_headers,
        )
    if script.delay:
        await asyncio.sleep(script.delay)
    if script.hold is not None:
        await script.hold.wait()
    if script.mode == "error500":
        return _error(500, "engine exploded", "server_error", None, "boom", script.error_headers)
    if script.mode == "error429":
        return _error(
            429, "Rate limit reached for requests", "requests", None, "rate_limit_exceeded", script.error_headers
        )
    history = list(script.stored_responses.get(previous, [])) if previous else []
    said = [*history, *_input_messages(body.get("input"))]
    system = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    text = script.answer_for({"messages": [*system, *said]})
    rid = f"resp_up{script.counter}"
    if body.get("store", True):
        script.stored_responses[rid] = [*said, {"role": "assistant", "content": text}]
    item: dict[str, Any] = {
        "type": "message",
        "id": f"msg_up{script.counter}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    if script.mode == "toolcall":
        item = {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "f",
            "arguments": "{}",
            "status": "completed",
        }
    length = script.mode == "length"
    prompt = sum(len(str(m.get("content", ""))) for m in [*system, *said]) // 4 + 1
    response = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if length else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if length else None,
        "error": None,
        "model": body["model"],
        "instructions": body.get("instructions"),
        "previous_response_id": previous,
        "output": [item],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(text) // 4 + 1,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + len(text) // 4 + 1,
        },
    }
    if not body.get("stream"):
        return web.json_response(response)
    return await _response_events(request, response, text, cut=script.mode == "cut")


async def _response_events(
    request: web.Request, response: dict[str, Any], text: str, *, cut: bool
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    sequence = 0

    async def send(kind: str, **data: Any) -> None:
        nonlocal sequence
        payload = {"type": kind, "sequence_number": sequence, **data}
        sequence += 1
        await resp.write(f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode())

    started = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    await send("response.created", response=started)
    await send("response.in_progress", response=started)
    item = response["output"][0]
    if item["type"] != "message":
        await send("response.output_item.added", output_index=0, item=item)
        await send("response.output_item.done", output_index=0, item=item)
        await send("response.completed", response=response)
        return resp
    at = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    await send("response.output_item.added", output_index=0, item={**item, "status": "in_progress", "content": []})
    await send("response.content_part.added", **at, part={"type": "output_text", "text": "", "annotations": []})
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    for i, piece in enumerate(pieces):
        await send("response.output_text.delta", **at, delta=piece, logprobs=[])
        await asyncio.sleep(0.002)
        if cut and i >= len(pieces) // 2:
            request.transport.close()  # type: ignore[union-attr]
            return resp
    await send("response.output_text.done", **at, text=text, logprobs=[])
    await send("response.content_part.done", **at, part=item["content"][0])
    await send("response.output_item.done", output_index=0, item=item)
    await send(f"response.{response['status']}", response=response)
    return resp
