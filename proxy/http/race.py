"""The upstream call sent while the cache decides (docs/architecture.md, "Racing the upstream").

Embedding and searching on a CPU take less than an LLM takes to its first token (bench_overhead.py
times both). Sent at once, a miss's answer is already under way when the lookup says miss, so a
miss costs about the relay and not the lookup. A hit cancels the call: closing the connection is
how a client aborts an engine's request (vLLM, SGLang and llama.cpp stop it and free its slot),
so the hit still saves the generation, though not the prefill already done. A paid API may bill
a request it has begun, and llama.cpp's server notices a gone client only on a stream (a
non-streamed request generates to its end: tests/upstream/test_engine.py), which is why what
races is chosen per upstream flavour and kind of request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Literal

import aiohttp

from proxy.http.relay import opened_stream
from proxy.upstream.client import CHAT_PATH, JsonAnswer, Query, Upstream

Kind = Literal["json", "stream"]
BOTH: frozenset[Kind] = frozenset({"json", "stream"})
# what each engine stops when its client goes, so that a cancelled race costs only its prefill
ABORTED_BY_FLAVOUR: dict[str, frozenset[Kind]] = {
    "vllm": BOTH,
    "sglang": BOTH,
    "llamacpp": frozenset({"stream"}),
}


def races(mode: str, flavour: str) -> frozenset[Kind]:
    """The kinds of request that race the upstream; ``auto``: those the flavour aborts when cancelled."""
    if mode == "on":
        return BOTH
    return ABORTED_BY_FLAVOUR.get(flavour, frozenset()) if mode == "auto" else frozenset()


class UpstreamCall:
    """One request's upstream call, running as a task from the moment it is made: before the
    plan is known when racing, once the plan says forward otherwise.

    A streamed call is opened (``relay.opened_stream``: an error status raises as it would on the
    plain path) and left unread, so the bytes wait in the socket until the plan says miss. A
    JSON call is read whole. The caller ends it exactly once: by taking its answer (``json``, or
    ``opened`` for a stream) or by ``cancel``.
    """

    def __init__(
        self,
        upstream: Upstream,
        body: dict[str, Any],
        headers: dict[str, str],
        *,
        stream: bool,
        params: Query = (),
        path: str = CHAT_PATH,
    ) -> None:
        """``path``: the upstream route, chat's unless the request came by another API."""
        self._exits = contextlib.AsyncExitStack()
        self._task: asyncio.Task[Any] = asyncio.ensure_future(
            self._exits.enter_async_context(opened_stream(upstream, body, headers, params=params, path=path))
            if stream
            else upstream.chat_json(body, headers, params=params, path=path)
        )

    async def json(self) -> JsonAnswer:
        """The whole answer; an upstream error raises here, as ``Upstream.chat_json`` would."""
        answer: JsonAnswer = await self._task
        return answer

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[aiohttp.ClientResponse]:
        """The opened stream, its body unread, released when the block ends."""
        try:
            yield await self._task
        finally:
            await self._exits.aclose()

    async def cancel(self) -> None:
        """Abandon the call: a request still being sent is cancelled, an opened stream closed."""
        self._task.cancel()
        # wait() raises neither the task's error nor its cancel, only a cancel of our own
        await asyncio.wait([self._task])
        if not self._task.cancelled():
            self._task.exception()  # whatever it came to no longer matters; retrieved, so not logged
        await self._exits.aclose()
