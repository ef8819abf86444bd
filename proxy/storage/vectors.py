"""The vector index seam: what the cache asks of the index that finds a request's nearest records.

``HnswIndex`` (``storage.hnsw``) is the embedded one; the composition (``proxy.service.compose``) picks it
and the cache reads it through ``VectorIndex`` alone, so another index (a shared vector store) is
one module and a line of composition, not an edit of the cache. Its calls block: the cache runs
them in an executor, except the ``*_now`` ones, which do nothing rather than wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from proxy.storage.base import IndexKey
from proxy.storage.mirror import Want

Vector = npt.NDArray[np.float32]
Hits = list[tuple[int, float]]  # (label, cosine), best first


class VectorIndex(Protocol):
    dim: int

    def __len__(self) -> int: ...

    @property
    def deleted_fraction(self) -> float:
        """Of the rows a search still walks, those deleted: past a share, the index is rebuilt."""
        ...

    def labels(self) -> set[int]: ...

    def fresh(self) -> VectorIndex:
        """An empty index of the same settings, for a rebuild from the store to fill."""
        ...

    def add(self, labels: Sequence[int], vectors: Vector, keys: Sequence[IndexKey]) -> None: ...

    def add_now(self, labels: Sequence[int], vectors: Vector, keys: Sequence[IndexKey]) -> bool:
        """``add`` on the caller's thread, or False, having done nothing, when that would block."""
        ...

    def delete(self, labels: Iterable[int]) -> None: ...

    def search_both(self, vector: Vector, labels: Sequence[int], k: int, want: Want | None) -> tuple[Hits, Hits]:
        """Exact cosine over ``labels`` (a session's records), and the k nearest ``want`` admits."""
        ...

    def search_both_now(
        self, vector: Vector, labels: Sequence[int], k: int, want: Want | None, *, max_rows: int
    ) -> tuple[Hits, Hits] | None:
        """``search_both`` on the caller's thread, or None, having done nothing, when that would block
        or scan more than ``max_rows`` rows."""
        ...

    def save(self, path: Path, *, stamp: str) -> None:
        """A snapshot the implementation's own loader reads back at the next start."""
        ...
