"""The Responses API's ``response`` object: an answer the cache holds written as one (JSON, or the
event sequence a streamed response is), and an upstream's read back for write-back.

A held answer is a completed response with one ``message`` output item of one ``output_text``
part, a fresh ``resp_`` id and zero usage; the request's own settings are echoed as the API
does. Streamed, it is the sequence the SDK's stream helpers accumulate (``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``..., ``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``, ``response.completed``), each an SSE event named by its type,
with no ``[DONE]``. An answer cut at the request's token limit is ``incomplete``
(``max_output_tokens``), as the upstream said it. Pure: no IO.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

# what a response echoes of its request when the request left it out
_ECHOED_DEFAULTS: Mapping[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": None, "summary": None},
    "service_tier": "default",
    "store": True,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
    "user": None,
}


def new_response_id() -> str:
    return "resp_" + uuid.uuid4().hex


def zero_usage() -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }


@dataclass(frozen=True, slots=True)
class HeldResponse:
    """An answer the cache holds, as the response to one request."""

    response_id: str
    model: str
    text: str
    request: Mapping[str, Any]  # the request's body, whose settings the response echoes
    cut: bool = False  # ended at the request's token limit: ``incomplete``
    created_at: int = 0
    item_id: str = ""

    @classmethod
    def of(cls, request: Mapping[str, Any], model: str, text: str, *, cut: bool = False) -> HeldResponse:
        return cls(new_response_id(), model, text, request, cut, int(time.time()), "msg_" + uuid.uuid4().hex)

    @property
    def status(self) -> str:
        return "incomplete" if self.cut else "completed"

    def part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def item(self, *, done: bool) -> dict[str, Any]:
        return {
            "id": self.item_id,
            "type": "message",
            "role": "assistant",
            "status": self.status if done else "in_progress",
            "content": [self.part(self.text)] if done else [],
        }

    def response(self, *, done: bool) -> dict[str, Any]:
        echoed = {k: self.request.get(k, default) for k, default in _ECHOED_DEFAULTS.items()}
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status if done else "in_progress",
            "completed_at": self.created_at if done and not self.cut else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if done and self.cut else None,
            "model": self.model,
            "output": [self.item(done=True)] if done else [],
            "usage": zero_usage() if done else None,
            **echoed,
        }

    def json(self) -> bytes:
        return orjson.dumps(self.response(done=True))

    def events(self, piece_chars: int = 24) -> list[bytes]:
        """The streamed response, one SSE event a step, the text in pieces of ``piece_chars``."""
        out: list[dict[str, Any]] = [
            {"type": "response.created", "response": self.response(done=False)},
            {"type": "response.in_progress", "response": self.response(done=False)},
            {"type": "response.output_item.added", "output_index": 0, "item": self.item(done=False)},
        ]
        at = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        out.append({"type": "response.content_part.added", **at, "part": self.part("")})
        for i in range(0, len(self.text), piece_chars):
            piece = self.text[i : i + piece_chars]
            out.append({"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []})
        out.append({"type": "response.output_text.done", **at, "text": self.text, "logprobs": []})
        out.append({"type": "response.content_part.done", **at, "part": self.part(self.text)})
        out.append({"type": "response.output_item.done", "output_index": 0, "item": self.item(done=True)})
        out.append({"type": f"response.{self.status}", "response": self.response(done=True)})
        return [event(data, sequence) for sequence, data in enumerate(out)]


def event(data: Mapping[str, Any], sequence: int) -> bytes:
    """One Responses SSE event: named by its type, numbered in its stream."""
    body = orjson.dumps({**data, "sequence_number": sequence})
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + body + b"\n\n"


# ---- reading an upstream's response ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadResponse:
    """What write-back and coalesced followers need of a response, in chat's terms."""

    text: str | None  # the plain text answer whatever its ending; None: tool calls, a refusal, no text
    finish_reason: str | None  # "stop" for completed, "length" for cut at max_output_tokens
    usage: dict[str, Any]  # under chat's names (prompt_tokens, completion_tokens, ...)
    response_id: str | None


def finish_of(response: Mapping[str, Any]) -> str | None:
    status = response.get("status")
    if status == "completed":
        return "stop"
    details = response.get("incomplete_details")
    if status == "incomplete" and isinstance(details, dict) and details.get("reason") == "max_output_tokens":
        return "length"
    return None


def chat_usage(usage: Any) -> dict[str, Any]:
    """A response's usage under chat's names, which records and metrics read."""
    if not isinstance(usage, dict):
        return {}
    prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    out: dict[str, Any] = {
        "prompt_tokens": prompt if isinstance(prompt, int) else 0,
        "completion_tokens": completion if isinstance(completion, int) else 0,
    }
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    if isinstance(cached, int):
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def output_text(output: Any) -> str | None:
    """The text of a response's message items; None where it holds anything but text and
    reasoning (a function call, a tool's result, a refusal)."""
    if not isinstance(output, list):
        return None
    texts: list[str] = []
    for item in output:
        if not isinstance(item, dict):
            return None
        if item.get("type") == "reasoning":
            continue  # the model's thinking before its answer: the answer is the message
        if item.get("type") != "message" or not isinstance(item.get("content"), list):
            return None
        for part in item["content"]:
            if not isinstance(part, dict) or part.get("type") != "output_text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
    return "".join(texts) if texts else None


def read_response(body: Any) -> ReadResponse:
    if not isinstance(body, dict):
        return ReadResponse(None, None, {}, None)
    rid = body.get("id")
    return ReadResponse(
        output_text(body.get("output")),
        finish_of(body),
        chat_usage(body.get("usage")),
        rid if isinstance(rid, str) else None,
    )
