"""What differs between the APIs a request may come by: chat completions and Responses.

``ChatService`` runs both through one plan, hit, forward and write-back over the chat request
each is read as; a ``Dialect`` is the rest: the upstream route and the body sent there, how an
answer the cache holds is written, how the upstream's is read as it is relayed, and what is
remembered once it is given (a Responses answer closes a chain a follow-up may continue).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import structlog

from proxy.core.errors import UpstreamError
from proxy.core.identity import Identity
from proxy.core.openai.request import ChatRequest, completion_chunks, completion_json, new_completion_id
from proxy.core.openai.response_object import HeldResponse, read_response
from proxy.core.openai.responses import Chain, ResponsesRequest, continued, upstream_body
from proxy.core.openai.responses_sse import ResponsesTee
from proxy.core.openai.sse import StreamTee, answer_of_completion
from proxy.http.relay import JsonRead, Reading
from proxy.storage.base import StoreUnavailable
from proxy.storage.chains import ResponseChains
from proxy.upstream import coalesce
from proxy.upstream.client import CHAT_PATH

log = structlog.get_logger("smartcache")
RESPONSES_PATH = "responses"


@dataclass(frozen=True, slots=True)
class Held:
    """An answer the cache holds, written for one request: its id, and the body (JSON, or every
    SSE event in one body of known length: written one at a time, each would cost a socket send)."""

    response_id: str
    body: bytes
    stream: bool


class Dialect(Reading, Protocol):
    @property
    def path(self) -> str:
        """The upstream route."""
        ...

    def upstream_body(self, req: ChatRequest) -> dict[str, Any]: ...

    def strips_usage(self, req: ChatRequest) -> bool:
        """The upstream is asked for a stream's usage the client did not ask for, and it is taken
        out on the way back (``StreamTee``)."""
        ...

    def held(self, req: ChatRequest, text: str, finish_reason: str) -> Held: ...

    async def answered(
        self, who: Identity, response_id: str | None, text: str | None, finish_reason: str | None, *, served: bool
    ) -> None:
        """After an answer went out (before a stream's end): remember what a follow-up needs.
        ``served``: the cache answered, the upstream never saw ``response_id``."""
        ...


class ChatDialect:
    path = CHAT_PATH

    def upstream_body(self, req: ChatRequest) -> dict[str, Any]:
        body = dict(req.forward_body)
        if self.strips_usage(req):  # so token accounting works
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return body

    def strips_usage(self, req: ChatRequest) -> bool:
        return req.stream and not req.include_usage

    def held(self, req: ChatRequest, text: str, finish_reason: str) -> Held:
        cid = new_completion_id()
        if not req.stream:
            body = completion_json(completion_id=cid, model=req.model, content=text)
            body["choices"][0]["finish_reason"] = finish_reason
            return Held(cid, orjson.dumps(body), stream=False)
        events = completion_chunks(completion_id=cid, model=req.model, content=text, include_usage=req.include_usage)
        return Held(cid, b"".join(coalesce.with_finish_reason(events, finish_reason)), stream=True)

    def read_json(self, body: Any) -> JsonRead:
        plain, usage = answer_of_completion(body, cut_ok=True)
        text, finish = coalesce.plain_answer(body)
        rid = body.get("id") if isinstance(body, dict) else None
        return JsonRead(text, finish, usage, rid if isinstance(rid, str) else None, plain is not None)

    def tee(self, *, strip_usage: bool) -> StreamTee:
        return StreamTee(strip_usage=strip_usage)

    def error_event(self, exc: UpstreamError) -> bytes:
        return b"data: " + orjson.dumps(exc.to_body()) + b"\n\n"

    async def answered(
        self, who: Identity, response_id: str | None, text: str | None, finish_reason: str | None, *, served: bool
    ) -> None:
        return None  # a chat client sends its whole conversation every turn


CHAT = ChatDialect()


class ResponsesDialect:
    """One Responses request: ``earlier`` is what its ``previous_response_id`` resolved to."""

    path = RESPONSES_PATH

    def __init__(self, request: ResponsesRequest, earlier: Chain | None, chains: ResponseChains) -> None:
        self.request, self.earlier, self.chains = request, earlier, chains

    def upstream_body(self, req: ChatRequest) -> dict[str, Any]:
        return upstream_body(self.request, self.earlier)

    def strips_usage(self, req: ChatRequest) -> bool:
        return False  # a response's usage comes with its last event, asked or not

    def held(self, req: ChatRequest, text: str, finish_reason: str) -> Held:
        held = HeldResponse.of(self.request.body, req.model, text, cut=finish_reason == "length")
        if not req.stream:
            return Held(held.response_id, held.json(), stream=False)
        return Held(held.response_id, b"".join(held.events()), stream=True)

    def read_json(self, body: Any) -> JsonRead:
        read = read_response(body)
        plain = read.text is not None and bool(read.text.strip()) and read.finish_reason in ("stop", "length")
        return JsonRead(read.text, read.finish_reason, read.usage, read.response_id, plain)

    def tee(self, *, strip_usage: bool) -> StreamTee:
        return ResponsesTee()

    def error_event(self, exc: UpstreamError) -> bytes:
        error = exc.to_body().get("error") or {}
        data = {"type": "error", **{k: error.get(k) for k in ("code", "message", "param")}}
        return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"

    async def answered(
        self, who: Identity, response_id: str | None, text: str | None, finish_reason: str | None, *, served: bool
    ) -> None:
        """The chain the answer closes, remembered unless the request said ``store: false`` (as
        the API would not keep it to continue either). A store that fails costs the chain, never
        the answer: its follow-up is forwarded untouched."""
        if not self.request.store or response_id is None or text is None or finish_reason is None:
            return
        chain = continued(self.request, self.earlier, text, served=served)
        if chain is None:
            return
        try:
            await self.chains.put(who.tenant, response_id, chain)
        except StoreUnavailable:
            log.warning("responses.chain_unkept", reason="store_unavailable")
