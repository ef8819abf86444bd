"""When the embedder falls behind, requests are forwarded uncached (``bypass``, reason
``overloaded``) instead of queueing without end: every client still gets its answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.embedding.backends import Matrix, SyncEmbedder
from proxy.http.app import create_app
from proxy.settings import load_settings
from tests.conftest import Upstream

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
    tmp_path: Path, model_home: Path, sync_embedder: SyncEmbedder, upstream: Upstream
) -> None:
    settings = load_settings(
        environ={},
        overrides={
            "upstream": upstream.url,
            "data_dir": tmp_path / "data",
            "model_home": model_home,
            "ready_after": 0.0,
            "embed_max_pending": 1,
            "embed_max_batch": 1,
            "embed_timeout_ms": 5000,
        },
    )
    server = TestServer(create_app(settings, backend=SlowEmbedder(sync_embedder, 0.4)), host="127.0.0.1")
    await server.start_server()
    client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="key-A", max_retries=0, timeout=30)
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
        metrics = (await client._client.get(str(server.make_url("/metrics")))).text
    finally:
        await client.close()
        await server.close()
    statuses = [s for s, _, _ in replies]
    assert all(text.startswith("Answer #") for _, _, text in replies)
    shed = [r for r in replies if r[0] == "bypass"]
    assert shed and all(reason == "overloaded" for _, reason, _ in shed), statuses
    assert len(upstream.script.calls) == 8
    assert set(statuses) <= {"bypass", "miss"}, statuses
    assert "overloaded" in metrics
