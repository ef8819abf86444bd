"""SSE: tee an upstream Responses stream (``response.*`` events) as ``StreamTee`` tees a chat one.

Every event goes to the client as it came; the tee keeps the answer's text (the
``response.output_text.delta`` events), the response's id (``response.created``), its usage and
how it ended (``response.completed``, ``response.incomplete``, ``response.failed``). The stream
is whole once one of those ends it: an upstream's Responses stream has no ``[DONE]``. Output other
than a message's text (a function call, a tool's result, a refusal) makes the answer none to keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from proxy.core.openai.response_object import chat_usage, finish_of
from proxy.core.openai.sse import StreamTee, event_data

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
# output items around a message's text that leave it the answer
_TEXT_ITEMS = frozenset({"message", "reasoning"})


@dataclass
class ResponsesTee(StreamTee):
    END: ClassVar[bytes] = b"response.completed"
    failed: bool = False  # the upstream said the response failed, in-band

    @property
    def whole(self) -> bool:
        return super().whole and not self.failed

    def _take(self, event: bytes) -> bool:
        data = self._object(payload) if (payload := event_data(event)) else None
        if data is not None:
            self._read(data)
        return True

    def _read(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        given = data.get("response")
        response: dict[str, Any] = given if isinstance(given, dict) else {}
        if kind == "response.created" and isinstance(response.get("id"), str):
            self.response_id = response["id"]
        elif kind == "response.output_item.added":
            item = data.get("item")
            if not isinstance(item, dict) or item.get("type") not in _TEXT_ITEMS:
                self.tool_calls = True
        elif kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
            self._keep(data["delta"])
        elif kind == "response.refusal.delta":
            self.tool_calls = True  # a refusal is no answer to keep either
        elif kind in TERMINAL:
            self.done = True
            self.usage = chat_usage(response.get("usage")) or None
            self.finish_reason = finish_of(response)
            self.failed = kind == "response.failed"
        elif kind == "error":
            self.done, self.failed = True, True
