"""KV prewarm after a direct hit.

A hit serves an answer the engine never generated in this conversation, so the next turn's
prompt (history + served answer + new question) shares only the history with anything in the
engine's prefix cache, and the engine prefills the served answer again at the user's expense.
After a hit we send the conversation as it now stands (request messages + the served answer)
upstream with ``max_tokens: 1``: the engine prefills it while the user reads, and the next turn
finds the whole prefix cached (measured in tests/e2e/test_halfhit_engine.py).

Prewarming is a bet, never a cost to the hit: requests run in background tasks owned by the
app, at most ``concurrency`` at a time; when all slots are busy a new one is dropped rather than
queued (a stale prewarm is worth nothing), and failures are only counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import structlog

from proxy.core.errors import UpstreamError
from proxy.upstream.client import Upstream

log = structlog.get_logger("smartcache")

# Fields of the client's body that would make the prewarm request costly or different in kind.
_DROPPED_FIELDS = frozenset(
    {
        "stream",
        "stream_options",
        "max_completion_tokens",
        "n",
        "logprobs",
        "top_logprobs",
        "response_format",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
    }
)


def prewarm_body(forward_body: Mapping[str, Any], answer: str) -> dict[str, Any]:
    """The forwarded body with the served answer appended as the assistant's turn, asking for
    one greedy token. The request's own messages are the very objects the client sent, so the
    prompt the engine sees is byte-identical to the next turn's prefix."""
    body = {k: v for k, v in forward_body.items() if k not in _DROPPED_FIELDS}
    body["messages"] = [*forward_body.get("messages", []), {"role": "assistant", "content": answer}]
    body["max_tokens"] = 1
    body["temperature"] = 0
    return body


class Prewarmer:
    """Background prewarm requests with a bounded number in flight; the app closes it on shutdown."""

    def __init__(self, upstream: Upstream, *, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError(f"prewarm_concurrency must be >= 1, got {concurrency}")
        self.upstream = upstream
        self.concurrency = concurrency
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = self.dropped = self.failed = 0

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def submit(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
        """Start a prewarm now, or drop it when ``concurrency`` are in flight. Never waits."""
        if len(self._tasks) >= self.concurrency:
            self.dropped += 1
            log.debug("prewarm.dropped", in_flight=len(self._tasks))
            return False
        task = asyncio.get_running_loop().create_task(self._send(dict(body), dict(headers)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _send(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        try:
            answer = await self.upstream.chat_json(body, headers)
        except UpstreamError as exc:
            self.failed += 1
            log.debug("prewarm.failed", error=type(exc).__name__)
            return
        self.sent += 1
        usage = answer.body.get("usage") if isinstance(answer.body, dict) else None
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        log.debug("prewarm.sent", prompt_tokens=prompt)

    async def drain(self) -> None:
        """Wait for the prewarms in flight (tests, benchmarks)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Cancel what is still in flight: at shutdown a prewarm has nobody left to serve."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
