"""When the embedder falls behind, requests are forwarded uncached (``bypass``, reason
``overloaded``) instead of queueing without end: every client still gets its answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from proxy.embedding.backends import Matrix, SyncEmbedder
from tests.conftest import ProxyFactory, Upstream

pytestmark = pytest.mark.model


class SlowEmbedder:
    """The real embedder, made slow: each model call takes at least ``delay`` seconds."""

    def __init__(self, inner: SyncEmbedder, delay: float) -> None:
        self.inner, self.delay = inner, delay
        self.name, self.dim, self.max_tokens = inner.name, inner.dim, inner.max_tokens

    def embed(self, texts: Sequence[str]) -> Matrix:
        time.sleep(self.delay)
        return self.inner.embed(texts)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


async def test_a_slow_embedder_sheds_load_to_bypass_and_every_request_is_answered(
    make_proxy: ProxyFactory, sync_embedder: SyncEmbedder, upstream: Upstream
) -> None:
    proxy = await make_proxy(
        backend=SlowEmbedder(sync_embedder, 0.4), embed_max_pending=1, embed_max_batch=1, embed_timeout_ms=5000
    )
    client = proxy.client()
    try:

        async def ask(i: int) -> tuple[str, str | None, str]:
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": f"Tell me about river number {i} in Europe"}]
            )
            return (
                raw.headers["x-cache-status"],
                raw.headers.get("x-cache-reason"),
                raw.parse().choices[0].message.content or "",
            )

        replies = await asyncio.gather(*(ask(i) for i in range(8)))
        metrics = (await client._client.get(str(proxy.server.make_url("/metrics")))).text
    finally:
        await client.close()
    statuses = [s for s, _, _ in replies]
    assert all(text.startswith("Answer #") for _, _, text in replies)
    shed = [r for r in replies if r[0] == "bypass"]
    assert shed and all(reason == "overloaded" for _, reason, _ in shed), statuses
    assert len(upstream.script.calls) == 8
    # the rest went upstream: a miss, or a half-hit when an earlier one's answer was stored by the
    # time its turn came (the questions differ by a number, in the candidate zone of each other)
    assert set(statuses) <= {"bypass", "miss", "half-hit"}, statuses
    assert "overloaded" in metrics
