"""Async embedding: the blocking model call micro-batched on its own thread (proxy.microbatch).

Requests that arrive while the worker is busy, or within ``max_wait_s`` of each other, share one
model call: under load the batch grows and per-request cost falls. Past ``max_pending`` waiting
requests, or ``timeout_s`` of waiting, ``embed`` raises :class:`~proxy.microbatch.Overloaded`
and the request is forwarded uncached instead of queueing without end.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from proxy.embedding.backends import SyncEmbedder
from proxy.microbatch import BatchedFront, MicroBatcher

# Room for what a tokenizer adds to a text: its special tokens and the pack's query prefix (e5's
# "query: " is 7 bytes). Every tokenizer a pack uses (SentencePiece, WordPiece) cuts pieces of at
# least one byte of its normalised input, and a signed text is NFKC already, so a text has at most
# its UTF-8 bytes plus this room in tokens (tests/embedding/test_packs.py checks every pack
# on texts of many scripts and of the forms NFKC rewrites).
TOKENIZER_ROOM = 16


class BatchingEmbedder(BatchedFront):
    def __init__(
        self,
        backend: SyncEmbedder,
        *,
        max_batch: int = 32,
        max_wait_s: float = 0.002,
        max_pending: int = 256,
        timeout_s: float | None = None,
    ) -> None:
        self.backend = backend
        self.dim = backend.dim
        self._batcher: MicroBatcher[str, np.ndarray] = MicroBatcher(
            self._embed_rows,
            name="embedder",
            max_batch=max_batch,
            max_wait_s=max_wait_s,
            max_pending=max_pending,
            timeout_s=timeout_s,
        )

    async def embed(self, texts: Sequence[str], *, bounded: bool = True) -> np.ndarray:
        """Rows for ``texts``; a request-path call (``bounded``) may raise ``Overloaded``."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = await self._batcher.submit(texts, bounded=bounded)
        return np.asarray(rows, dtype=np.float32)

    def count_tokens(self, text: str) -> int:
        return self.backend.count_tokens(text)

    def fits(self, text: str, tokens: int) -> bool:
        """Whether ``text`` is at most ``tokens`` long to the model. A short one needs no
        tokenisation: a tokenizer's run costs more than this check, most after an idle spell
        (its tables fall out of the CPU's caches), on every miss (bench_overhead.py's stage
        times show it under ``sign``)."""
        return len(text.encode()) + TOKENIZER_ROOM <= tokens or self.backend.count_tokens(text) <= tokens

    def _embed_rows(self, texts: list[str]) -> Sequence[np.ndarray]:
        # an (n, dim) array slices into per-request blocks without copying
        return np.asarray(self.backend.embed(texts), dtype=np.float32)  # type: ignore[return-value]
