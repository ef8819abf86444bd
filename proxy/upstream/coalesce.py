"""Request coalescing: concurrent requests with the identical context share one upstream call.

The first request to reach upstream with a given key *leads* a flight; requests with the same
key that arrive while it is in flight *follow* it and get the leader's answer as a hit once it
completes. The key is the caller's tenant and session, the cache namespace, the model and the
exact conversation (``request_hash``) plus every generation parameter, so a follower receives
exactly what it would have asked for.

What a follower gets when the flight ends:
- an answer (any finish reason: a truncated answer is still the answer to the same request),
  replayed as JSON or SSE whatever the leader's own format was;
- the leader's *upstream* error, raised again: the upstream just failed this very request, and
  sending the same request again at once from every follower would only multiply the load on a
  failing endpoint;
- nothing, when the leader lost its answer for a reason of its own (its client went away mid
  stream, the stream was cut, a bug): then the followers go upstream themselves, coalescing again
  among themselves, so one of them leads the retry.

A flight is removed from the table when its leader finishes, before the followers wake. An
identical request that arrives after that is not concurrent any more: it is planned afresh and
the session's regenerate detection sees it (``ChatService._feedback``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.core.conversation import request_hash
from proxy.core.errors import UpstreamError
from proxy.core.identity import Identity
from proxy.core.openai.request import ChatRequest

# Fields that change how the answer is delivered, not what it is.
_DELIVERY_FIELDS = frozenset({"messages", "stream", "stream_options"})
# Reasons a request must reach upstream on its own: the user asked for a new answer.
NEVER_COALESCE = frozenset({"regenerate", "correction", "no_cache"})
# Flights in a row whose leaders lost their answers before a follower stops waiting and goes alone.
FOLLOW_ATTEMPTS = 3


def coalesce_key(req: ChatRequest, who: Identity) -> str:
    """Same key exactly when two requests would get the same answer from upstream."""
    params = {k: v for k, v in req.forward_body.items() if k not in _DELIVERY_FIELDS}
    material = orjson.dumps(
        [who.tenant, who.session, req.controls.namespace or "", request_hash(req), params],
        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
    )
    return hashlib.sha256(material).hexdigest()


@dataclass(frozen=True, slots=True)
class SharedAnswer:
    """A leader's completed answer, as followers replay it."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cache_id: str | None = None


def shared_of_usage(text: str, finish_reason: str, usage: Mapping[str, Any], cache_id: str | None) -> SharedAnswer:
    return SharedAnswer(
        text, finish_reason, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), cache_id
    )


@dataclass
class Flight:
    """One upstream call in progress, and what came of it."""

    key: str
    answer: SharedAnswer | None = None
    error: UpstreamError | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def succeed(self, answer: SharedAnswer) -> None:
        self.answer = answer

    def fail(self, error: UpstreamError) -> None:
        self.error = error

    async def wait(self) -> None:
        # An Event, not a shared future: a follower whose own client goes away is cancelled
        # alone and cannot cancel the flight for everyone else.
        await self.done.wait()


class Coalescer:
    """The table of flights in progress, owned by one ChatService (one per app)."""

    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}
        self.led = 0
        self.followed = 0

    def __len__(self) -> int:
        return len(self._flights)

    def follow(self, key: str) -> Flight | None:
        """The flight in progress for ``key``, now counting one more follower; None if none."""
        flight = self._flights.get(key)
        if flight is not None:
            self.followed += 1
        return flight

    def begin(self, key: str) -> Flight:
        """Register a flight for ``key`` until :meth:`end`.

        Callers check :meth:`follow` first with no await in between, so there is never more
        than one flight per key.
        """
        if key in self._flights:
            raise RuntimeError("a flight for this key is already in progress; follow it")
        flight = Flight(key)
        self._flights[key] = flight
        self.led += 1
        return flight

    def end(self, flight: Flight) -> None:
        """The flight leaves the table and its followers wake; one that was neither
        ``succeed``-ed nor ``fail``-ed tells them to go upstream themselves."""
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]
        flight.done.set()


def plain_answer(body: Any) -> tuple[str | None, str | None]:
    """Text and finish reason of a one-choice, plain-text completion (any finish reason), else
    (None, None): what a follower can be given even when the answer is not worth storing."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None, None
    message, finish = choices[0].get("message") or {}, choices[0].get("finish_reason")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str) or not isinstance(finish, str) or message.get("tool_calls"):
        return None, None
    return content, finish


def with_finish_reason(events: list[bytes], finish_reason: str) -> list[bytes]:
    """Replay chunks (``completion_chunks``, which always end with "stop") with another finish."""
    if finish_reason == "stop":
        return events
    out = []
    for event in events:
        if event.startswith(b"data: {"):
            chunk = orjson.loads(event[len(b"data: ") :])
            choices = chunk.get("choices") or []
            if choices and choices[0].get("finish_reason") == "stop":
                choices[0]["finish_reason"] = finish_reason
                event = b"data: " + orjson.dumps(chunk) + b"\n\n"
        out.append(event)
    return out
