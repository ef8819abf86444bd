"""SSE: parse and tee an upstream ``chat.completion.chunk`` stream.

Events are forwarded one whole event at a time, as they arrive: the client never waits for
the whole answer. The tee keeps what write-back needs (the text, the finish reason, usage)
and drops the usage chunk that we asked for on the client's behalf when it did not.

What the tee holds is bounded, so a runaway upstream cannot grow the proxy's memory with one
stream: an answer longer than ``max_text_chars`` is relayed but not kept (nor stored), and bytes
that never close an event within ``max_event_bytes`` are relayed as they come, the stream
counted malformed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson


def event_data(event: bytes) -> bytes:
    """An SSE event's data: its ``data:`` lines joined, as a client reads them."""
    return b"\n".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))


@dataclass
class StreamTee:
    # the bytes that end a whole stream, looked for once events are no longer parsed
    END: ClassVar[bytes] = b"data: [DONE]"
    strip_usage: bool = False  # True when we added include_usage and the client did not ask
    text_parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    tool_calls: bool = False
    done: bool = False
    malformed: bool = False
    response_id: str | None = None
    # about a million tokens: far beyond any completion limit, far below a memory problem
    max_text_chars: int = 4 * 1024 * 1024
    max_event_bytes: int = 1024 * 1024
    oversized: bool = False  # the text outgrew max_text_chars: relayed, not kept
    _text_chars: int = 0
    _passthrough: bool = False
    _buffer: bytes = b""

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def whole(self) -> bool:
        """The stream ended with [DONE] and the tee holds all of its plain text."""
        return self.done and not self.tool_calls and not self.malformed and not self.oversized

    @property
    def complete(self) -> bool:
        """Only a whole stream that ended with a normal stop is an answer worth storing."""
        return self.whole and self.finish_reason == "stop"

    @property
    def cut_at_limit(self) -> bool:
        """A whole stream the engine ended at the token limit: storable for the same limit only."""
        return self.whole and self.finish_reason == "length"

    def feed(self, data: bytes) -> bytes:
        """Bytes in, bytes to send to the client out (whole events only, until an event outgrows
        ``max_event_bytes``: from then on the bytes as they come)."""
        if self._passthrough:
            # not parsed any more, but its end still says the upstream finished the stream
            self.done = self.done or self.END in data
            return data
        self._buffer += data.replace(b"\r\n", b"\n")
        out = []
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            if self._take(event):
                out.append(event + b"\n\n")
        if len(self._buffer) > self.max_event_bytes:
            self.malformed, self._passthrough = True, True
            self.done = self.END in self._buffer
            out.append(self._buffer)
            self._buffer = b""
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        if rest.strip() and self._take(rest):
            return rest + b"\n\n"
        return b""

    def _object(self, payload: bytes) -> dict[str, Any] | None:
        """An event's JSON object; none, and the stream marked malformed, for anything else."""
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            self.malformed = True
            return None
        return data

    def _take(self, event: bytes) -> bool:
        """Record what the event says; False when it must not reach the client."""
        payload = event_data(event)
        if not payload:
            return True
        if payload == b"[DONE]":
            self.done = True
            return True
        chunk = self._object(payload)
        if chunk is None:
            return True
        if self.response_id is None and isinstance(chunk.get("id"), str):
            self.response_id = chunk["id"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        for choice in choices:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self._keep(delta["content"])
            if delta.get("tool_calls") or delta.get("function_call"):
                self.tool_calls = True
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return not (self.strip_usage and not choices and chunk.get("usage"))

    def _keep(self, text: str) -> None:
        if self.oversized:
            return
        self._text_chars += len(text)
        if self._text_chars > self.max_text_chars:
            self.oversized = True
            self.text_parts.clear()
            return
        self.text_parts.append(text)


def answer_of_completion(body: Any, *, cut_ok: bool = False) -> tuple[str | None, dict[str, Any]]:
    """The storable answer text of a non-streamed completion (None: do not store) and its usage.
    ``cut_ok``: an answer cut at the request's own token limit (finish_reason "length") is one too."""
    if not isinstance(body, dict):
        return None, {}
    raw_usage = body.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None, usage
    choice = choices[0]
    message = choice.get("message") or {}
    content = message.get("content")
    if (
        choice.get("finish_reason") not in (("stop", "length") if cut_ok else ("stop",))
        or message.get("tool_calls")
        or message.get("function_call")
        or not isinstance(content, str)
        or not content.strip()
    ):
        return None, usage
    return content, usage
