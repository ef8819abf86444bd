"""A Responses API request (``POST /v1/responses``) read as the chat request the cache keys on.

The cache reads one request model, chat's (proxy.core.openai.request). A Responses request maps
onto it, so a question asked through one API is the same request through the other wherever
everything that shapes the answer agrees:

- ``instructions`` is the first system message, ``input`` the messages after it: a string is one
  user turn; message items (roles ``user``, ``assistant``, ``system``, ``developer``) carry a
  string or ``input_text`` / ``output_text`` parts;
- ``previous_response_id`` names the conversation the request continues. A response the proxy
  served or relayed is remembered within the tenant as a ``Chain`` (its input messages since the
  first, without instructions, which a continuation does not carry over, and its answer), which
  is the history before ``input``. One the proxy cannot resolve is forwarded untouched and never
  cached (``unknown_previous_response``); a chain the proxy served itself, whose id the upstream
  never saw, is forwarded as its whole input (``upstream_body``);
- the parameters that shape the answer are read under their chat names, so a record's namespace
  digest (proxy.core.openai.params) is the one chat computes:

  ``Responses field -> chat field: effect`` (README.md, "The Responses API", has it for users):

  - `text.format` -> `response_format` (a `json_schema`'s fields under `json_schema`): partition
  - `text.verbosity` -> `verbosity`, `reasoning.effort` -> `reasoning_effort`: partition
  - `max_output_tokens` -> `max_completion_tokens`: the answer's cap, as chat's
  - `temperature`, `top_p`: ignored up to a temperature of 1, bypass above (`high_temperature`)
  - `top_logprobs`, `include: message.output_text.logprobs`: bypass (`logprobs`)
  - `tools` (not empty), tool items (`function_call`, `*_call`, `*_output`, `mcp_*`): bypass (`tools`)
  - `tool_choice`, `parallel_tool_calls`: same names, partition (as chat's without tools)
  - `input_image`, `input_file`, `input_audio` parts: bypass (`non_text_content`)
  - `reasoning` items, `reasoning.summary`, `include: reasoning.encrypted_content`: bypass
    (`reasoning_items`): output the cache does not keep
  - `background: true`: bypass (`background`): answered later, to a poll
  - `conversation`, `prompt`, `item_reference` and items of other kinds: bypass (`stored_context`):
    what the upstream keeps, the proxy cannot read
  - `store: false`: kept nowhere: not written back (as `cache.no_store`), not remembered as a chain
  - other `include` values -> `include`: partition
  - `stream`, `stream_options`, `metadata`, `truncation`, `max_tool_calls`: ignored
  - any other field (`user`, `service_tier`, a vendor's own, ...): same name, as chat reads it
- what the cache cannot judge bypasses it with a reason, as in chat.

Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.core.errors import InvalidRequest
from proxy.core.model import Reason
from proxy.core.openai.request import (
    MAX_CACHEABLE_CHARS,
    ChatRequest,
    Message,
    chat_request,
    check_model,
    optional_bool,
)

INPUT_ROLES = frozenset({"user", "assistant", "system", "developer"})
TEXT_PARTS = frozenset({"input_text", "output_text"})
LOGPROBS_INCLUDE = "message.output_text.logprobs"
REASONING_INCLUDE = "reasoning.encrypted_content"
# read here and put under their chat names, or kept out of the chat body altogether
_READ_HERE = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "stream",
        "store",
        "background",
        "conversation",
        "prompt",
        "text",
        "reasoning",
        "max_output_tokens",
        "include",
        "cache",
        # delivery and bookkeeping with no chat counterpart
        "stream_options",
        "metadata",
        "truncation",
        "max_tool_calls",
    }
)


@dataclass(frozen=True, slots=True)
class Chain:
    """The conversation a response closes: every input message since the first (instructions
    aside) and its answer, last. ``served``: the proxy answered it, so the upstream never saw its id."""

    messages: tuple[Message, ...]
    served: bool = False


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    model: str
    stream: bool
    store: bool
    body: Mapping[str, Any]  # what goes upstream (``cache`` removed)
    instructions: str | None
    messages: tuple[Message, ...]  # the input's messages, in their text parts
    previous_response_id: str | None
    # every input item was a message of text parts: the conversation is known whole, and can be continued
    readable: bool
    bypass_reason: Reason | None  # what the Responses request itself rules out
    chat_body: Mapping[str, Any]  # its parameters under their chat names, ``messages`` aside


def parse_responses_request(body: Mapping[str, Any]) -> ResponsesRequest:
    """Check a Responses body (a bad field is a 400 naming it) and read what the cache needs."""
    model = check_model(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("'instructions' must be a string", param="instructions")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise InvalidRequest("'previous_response_id' must be a non-empty string", param="previous_response_id")
    messages, item_reason, readable = _read_input(body.get("input"))
    text, reasoning = _object(body, "text"), _object(body, "reasoning")
    include = _include(body)
    _check(body)
    stream, store = optional_bool(body, "stream", False), optional_bool(body, "store", True)
    reason = _bypass(body, item_reason, reasoning, include)
    return ResponsesRequest(
        model=model,
        stream=stream,
        store=store,
        body={k: v for k, v in body.items() if k != "cache"},
        instructions=instructions,
        messages=messages,
        previous_response_id=previous,
        readable=readable,
        bypass_reason=reason,
        chat_body=_chat_body(body, text, reasoning, include, stream),
    )


def as_chat(req: ResponsesRequest, earlier: Chain | None, *, cache_control: str | None = None) -> ChatRequest:
    """The chat request ``req`` is read as. ``earlier``: what ``previous_response_id`` resolved
    to, None where there is none or it is unknown (then the request bypasses the cache)."""
    messages = (
        *((Message("system", req.instructions),) if req.instructions else ()),
        *(earlier.messages if earlier is not None else ()),
        *req.messages,
    )
    body = {**req.chat_body, "messages": [{"role": m.role, "content": m.text} for m in messages]}
    chat = chat_request(body, messages, cache_control=cache_control)
    unknown = Reason.UNKNOWN_PREVIOUS_RESPONSE if req.previous_response_id and earlier is None else None
    controls = chat.controls if req.store else replace(chat.controls, no_store=True)
    return replace(
        chat, bypass_reason=req.bypass_reason or unknown or chat.bypass_reason, controls=controls, include_usage=False
    )


def upstream_body(req: ResponsesRequest, earlier: Chain | None) -> dict[str, Any]:
    """The body sent upstream: the client's own, or, continuing a response the proxy served (whose
    id the upstream never saw), its whole conversation as input in place of the id."""
    if earlier is None or not earlier.served:
        return dict(req.body)
    body = {k: v for k, v in req.body.items() if k != "previous_response_id"}
    given = req.body.get("input")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or ())
    body["input"] = [*({"role": m.role, "content": m.text} for m in earlier.messages), *items]
    return body


def continued(req: ResponsesRequest, earlier: Chain | None, answer: str, *, served: bool) -> Chain | None:
    """The chain a response to ``req`` closes with ``answer``; None where its conversation is not
    known whole (items other than text messages, an unknown previous response) or is longer than
    the cache reads (a follow-up of it would bypass as too long, and goes upstream either way)."""
    if not req.readable or (req.previous_response_id and earlier is None):
        return None
    messages = (*(earlier.messages if earlier else ()), *req.messages, Message("assistant", answer))
    if sum(len(m.text) for m in messages) > MAX_CACHEABLE_CHARS:
        return None
    return Chain(messages, served)


# ---- reading the body -------------------------------------------------------------------------


def _read_input(value: Any) -> tuple[tuple[Message, ...], Reason | None, bool]:
    """The input's messages, the first reason an item gives to bypass, and whether every item was
    a message read whole."""
    if value is None:
        return (), None, True
    if isinstance(value, str):
        return (Message("user", value),), None, True
    if not isinstance(value, list):
        raise InvalidRequest("'input' must be a string or an array of input items", param="input")
    messages: list[Message] = []
    reason: Reason | None = None
    readable = True
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{param} must be an object", param=param)
        kind = item.get("type", "message")  # an easy input message names no type
        if not isinstance(kind, str):
            raise InvalidRequest(f"{param}.type must be a string", param=f"{param}.type")
        if kind == "message":
            message = _message(param, item)
            messages.append(message)
            if message.non_text:
                reason, readable = reason or Reason.NON_TEXT_CONTENT, False
        else:
            reason, readable = reason or _item_reason(kind), False
    return tuple(messages), reason, readable


def _message(param: str, item: Mapping[str, Any]) -> Message:
    role = item.get("role")
    if not isinstance(role, str) or role not in INPUT_ROLES:
        raise InvalidRequest(f"{param}.role must be one of {sorted(INPUT_ROLES)}", param=f"{param}.role")
    content = item.get("content")
    if isinstance(content, str):
        return Message(role, content)
    if not isinstance(content, list):
        raise InvalidRequest(f"{param}.content must be a string or an array of content parts", param=f"{param}.content")
    texts: list[str] = []
    non_text = False
    for j, part in enumerate(content):
        where = f"{param}.content[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequest(f"{where} must be an object with a string 'type'", param=where)
        if part["type"] in TEXT_PARTS:
            if not isinstance(part.get("text"), str):
                raise InvalidRequest(f"{where}.text must be a string", param=f"{where}.text")
            texts.append(part["text"])
        elif part["type"] == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])  # an earlier answer that refused: its words are the turn
        else:
            non_text = True  # images, files, audio, and parts of kinds the cache does not know
    return Message(role, "\n".join(texts), non_text=non_text)


def _item_reason(kind: str) -> Reason:
    if kind == "reasoning":
        return Reason.REASONING_ITEMS
    if kind.endswith(("_call", "_output")) or kind.startswith("mcp_"):
        return Reason.TOOLS
    return Reason.STORED_CONTEXT  # item_reference, compaction, and kinds the cache does not know


def _object(body: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"'{name}' must be an object", param=name)
    return value


def _include(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("include")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest("'include' must be an array of strings", param="include")
    return tuple(value)


def _check(body: Mapping[str, Any]) -> None:
    """The fields read under chat names, checked under their own (chat's checks name the rest)."""
    fmt = _object(body, "text").get("format")
    if fmt is not None and (not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str)):
        raise InvalidRequest("'text.format' must be an object with a string 'type'", param="text.format")
    for outer, name in (("text", "verbosity"), ("reasoning", "effort"), ("reasoning", "summary")):
        value = _object(body, outer).get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidRequest(f"'{outer}.{name}' must be a string", param=f"{outer}.{name}")
    cap = body.get("max_output_tokens")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise InvalidRequest(f"'max_output_tokens' must be a positive integer, got {cap!r}", param="max_output_tokens")
    optional_bool(body, "background", False)


def _bypass(
    body: Mapping[str, Any], item_reason: Reason | None, reasoning: Mapping[str, Any], include: Sequence[str]
) -> Reason | None:
    if body.get("background"):
        return Reason.BACKGROUND  # answered later, to a poll: nothing to serve now
    if body.get("conversation") is not None or body.get("prompt") is not None:
        return Reason.STORED_CONTEXT
    if item_reason is not None:
        return item_reason
    if body.get("tools"):
        return Reason.TOOLS
    if reasoning.get("summary") is not None or reasoning.get("generate_summary") is not None:
        return Reason.REASONING_ITEMS
    if REASONING_INCLUDE in include:
        return Reason.REASONING_ITEMS
    if LOGPROBS_INCLUDE in include:
        return Reason.LOGPROBS
    return None


def _chat_body(
    body: Mapping[str, Any],
    text: Mapping[str, Any],
    reasoning: Mapping[str, Any],
    include: Sequence[str],
    stream: bool,
) -> dict[str, Any]:
    chat: dict[str, Any] = {"model": body["model"], "stream": stream}
    chat.update((k, v) for k, v in body.items() if k not in _READ_HERE)
    if "cache" in body:  # read by chat's controls, and never sent upstream
        chat["cache"] = body["cache"]
    if (fmt := text.get("format")) is not None:
        chat["response_format"] = _response_format(fmt)
    if (verbosity := text.get("verbosity")) is not None:
        chat["verbosity"] = verbosity
    if (effort := reasoning.get("effort")) is not None:
        chat["reasoning_effort"] = effort
    if (cap := body.get("max_output_tokens")) is not None:
        chat["max_completion_tokens"] = cap
    if rest := sorted(set(include) - {LOGPROBS_INCLUDE, REASONING_INCLUDE}):
        chat["include"] = rest
    return chat


def _response_format(fmt: Mapping[str, Any]) -> dict[str, Any]:
    """``text.format`` as chat's ``response_format``: a JSON schema's fields sit under ``json_schema``."""
    if fmt.get("type") != "json_schema":
        return dict(fmt)
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type" and v is not None}}
