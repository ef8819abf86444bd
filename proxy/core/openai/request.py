"""Parse and validate chat-completion bodies; build completion JSON and stream chunks.

Pure functions over frozen dataclasses: no IO. The body that goes upstream is the
caller's own JSON with only our ``cache`` field removed, so the engine sees the same
bytes-equivalent prompt on every turn and its prefix cache keeps working.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.core.errors import InvalidRequest
from proxy.core.model import Reason
from proxy.core.openai.params import AnswerParams, read_params

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
SYSTEM_ROLES = frozenset({"system", "developer"})
# Reading a conversation (normalising, segmenting, tagging) costs time in its length; past this
# many characters the request is forwarded uncached rather than read, so one huge body cannot
# hold the proxy for seconds (and a repeat of such a request is rare).
MAX_CACHEABLE_CHARS = 32_768
# between a caller's namespace and the digest of the parameters that shape the answer, in the
# namespace a record is kept under; a caller's own namespace may not contain it (control characters)
PARAMS_SEPARATOR = "\x1f"


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    text: str
    non_text: bool = False  # images, audio, files: the cache cannot judge them
    tool_related: bool = False  # tool calls or tool results in the conversation


@dataclass(frozen=True, slots=True)
class CacheControls:
    no_cache: bool = False  # skip lookup, still store
    no_store: bool = False  # do not store the answer
    ttl: int | None = None  # may only shorten the policy's ttl
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: tuple[Message, ...]
    stream: bool
    include_usage: bool
    forward_body: Mapping[str, Any]  # what goes upstream (``cache`` removed)
    controls: CacheControls = field(default_factory=CacheControls)
    bypass_reason: Reason | None = None
    user: str | None = None
    # the digest of the parameters that shape the answer (proxy.core.openai.params); "" for none
    shaping: str = ""

    @property
    def record_namespace(self) -> str:
        """The pool a record is written to and looked up in: the caller's ``cache.namespace`` and
        the parameters that shape the answer, so an answer is served only to a request that asked
        for it in the same form (a JSON-mode request never gets the prose answer). A plain request's
        is its namespace alone, as before the parameters were read."""
        namespace = self.controls.namespace or ""
        return f"{namespace}{PARAMS_SEPARATOR}{self.shaping}" if self.shaping else namespace

    @property
    def system_text(self) -> str:
        return "\n".join(m.text for m in self.messages if m.role in SYSTEM_ROLES)

    @property
    def turns(self) -> tuple[Message, ...]:
        """The conversation without system prompts."""
        return tuple(m for m in self.messages if m.role not in SYSTEM_ROLES)

    @property
    def answer_cap(self) -> int | None:
        """The request's own limit on the answer's tokens (``max_completion_tokens``, else
        ``max_tokens``), if it set one."""
        for name in ("max_completion_tokens", "max_tokens"):
            value = self.forward_body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    @property
    def last_user_text(self) -> str:
        for m in reversed(self.messages):
            if m.role == "user":
                return m.text
        return ""


def parse_chat_request(raw: bytes, *, cache_control: str | None = None) -> ChatRequest:
    body = load_object(raw)
    check_model(body)
    return chat_request(body, _parse_messages(body.get("messages")), cache_control=cache_control)


def chat_request(
    body: Mapping[str, Any], messages: tuple[Message, ...], *, cache_control: str | None = None
) -> ChatRequest:
    """The request of a chat body whose ``messages`` are read already: the chat route's own, or
    the one another API's request is read as (proxy.core.openai.responses)."""
    model = check_model(body)
    stream = optional_bool(body, "stream", False)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    include_usage = bool(stream_options and stream_options.get("include_usage"))
    params = read_params(body)
    controls = merge_controls(_parse_body_controls(body.get("cache")), parse_cache_control(cache_control))
    forward = {k: v for k, v in body.items() if k != "cache"}
    user = body.get("user") if isinstance(body.get("user"), str) else None
    if user is None and isinstance(body.get("safety_identifier"), str):
        user = body["safety_identifier"]
    return ChatRequest(
        model=model,
        messages=messages,
        stream=stream,
        include_usage=include_usage,
        forward_body=forward,
        controls=controls,
        bypass_reason=_bypass_reason(body, messages, params),
        user=user,
        shaping=params.digest,
    )


def check_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("'model' is required and must be a non-empty string", param="model")
    return model


def load_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def _parse_messages(value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'messages' is required and must be a non-empty array", param="messages")
    return tuple(_parse_message(i, m) for i, m in enumerate(value))


def _parse_message(i: int, m: Any) -> Message:
    param = f"messages[{i}]"
    if not isinstance(m, dict):
        raise InvalidRequest(f"{param} must be an object", param=param)
    role = m.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidRequest(f"{param}.role must be one of {sorted(ROLES)}", param=f"{param}.role")
    content = m.get("content")
    tool_related = role in ("tool", "function") or bool(m.get("tool_calls") or m.get("function_call"))
    if content is None:
        if role == "assistant":  # an assistant turn that only called tools
            return Message(role, "", tool_related=tool_related)
        raise InvalidRequest(f"{param}.content is required", param=f"{param}.content")
    if isinstance(content, str):
        return Message(role, content, tool_related=tool_related)
    if isinstance(content, list):
        texts, non_text = _parse_parts(param, content)
        return Message(role, "\n".join(texts), non_text=non_text, tool_related=tool_related)
    raise InvalidRequest(f"{param}.content must be a string or an array of parts", param=f"{param}.content")


def _parse_parts(param: str, parts: list[Any]) -> tuple[list[str], bool]:
    texts: list[str] = []
    non_text = False
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequest(f"{param}.content[{j}] must be an object with a 'type'", param=f"{param}.content")
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise InvalidRequest(f"{param}.content[{j}].text must be a string", param=f"{param}.content")
            texts.append(part["text"])
        else:
            non_text = True
    return texts, non_text


def optional_bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{key}' must be a boolean", param=key)
    return value


def _bypass_reason(body: Mapping[str, Any], messages: Sequence[Message], params: AnswerParams) -> Reason | None:
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise InvalidRequest("'n' must be a positive integer", param="n")
    if n is not None and n > 1:
        return Reason.N_ABOVE_ONE
    if body.get("logprobs") or body.get("top_logprobs"):
        return Reason.LOGPROBS
    if params.bypass is not None:
        return params.bypass
    if any(m.non_text for m in messages):
        return Reason.NON_TEXT_CONTENT
    if body.get("tools") or body.get("functions") or any(m.tool_related for m in messages):
        return Reason.TOOLS
    if not any(m.role == "user" for m in messages):
        return Reason.NO_USER_TURN
    if sum(len(m.text) for m in messages) > MAX_CACHEABLE_CHARS:
        return Reason.TOO_LONG
    return None


def _parse_body_controls(value: Any) -> CacheControls:
    if value is None:
        return CacheControls()
    if not isinstance(value, dict):
        raise InvalidRequest("'cache' must be an object", param="cache")
    unknown = set(value) - {"no_cache", "no_store", "ttl", "namespace"}
    if unknown:
        raise InvalidRequest(f"unknown key(s) in 'cache': {sorted(unknown)}", param="cache")
    for key in ("no_cache", "no_store"):
        if key in value and not isinstance(value[key], bool):
            raise InvalidRequest(f"'cache.{key}' must be a boolean", param=f"cache.{key}")
    ttl = value.get("ttl")
    if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0):
        raise InvalidRequest("'cache.ttl' must be a non-negative integer (seconds)", param="cache.ttl")
    namespace = value.get("namespace")
    if namespace is not None and (
        not isinstance(namespace, str) or len(namespace) > 128 or any(c < " " or c == "\x7f" for c in namespace)
    ):
        raise InvalidRequest(
            "'cache.namespace' must be a string of at most 128 characters, none of them a control character",
            param="cache.namespace",
        )
    return CacheControls(bool(value.get("no_cache")), bool(value.get("no_store")), ttl, namespace)


def parse_cache_control(header: str | None) -> CacheControls:
    """``Cache-Control: no-cache | no-store | max-age=N``; unknown directives are ignored, as HTTP says."""
    if not header:
        return CacheControls()
    no_cache = no_store = False
    ttl: int | None = None
    for directive in header.lower().split(","):
        name, _, arg = directive.strip().partition("=")
        if name == "no-cache":
            no_cache = True
        elif name == "no-store":
            no_store = True
        elif name == "max-age":
            try:
                ttl = max(0, int(arg.strip().strip('"')))
            except ValueError as exc:
                raise InvalidRequest("Cache-Control max-age must be an integer", param="Cache-Control") from exc
    return CacheControls(no_cache, no_store, ttl)


def merge_controls(a: CacheControls, b: CacheControls) -> CacheControls:
    ttls = [t for t in (a.ttl, b.ttl) if t is not None]
    return CacheControls(
        a.no_cache or b.no_cache, a.no_store or b.no_store, min(ttls) if ttls else None, a.namespace or b.namespace
    )


# ---- building responses ---------------------------------------------------------------------


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def usage_block(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_json(*, completion_id: str, model: str, content: str, created: int | None = None) -> dict[str, Any]:
    """A cached answer as ``chat.completion``. A hit spends no prompt or completion tokens."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created or int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": usage_block(0, 0),
        "system_fingerprint": "smartcache",
    }


def completion_chunks(
    *, completion_id: str, model: str, content: str, include_usage: bool, piece_chars: int = 24
) -> list[bytes]:
    """A cached answer as SSE ``chat.completion.chunk`` events, ending with ``[DONE]``."""
    created = int(time.time())
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**base, "choices": choices, **extra}) + b"\n\n"

    out = [event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    for i in range(0, len(content), piece_chars):
        out.append(event([{"index": 0, "delta": {"content": content[i : i + piece_chars]}, "finish_reason": None}]))
    out.append(event([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    if include_usage:
        out.append(event([], usage=usage_block(0, 0)))
    out.append(b"data: [DONE]\n\n")
    return out
