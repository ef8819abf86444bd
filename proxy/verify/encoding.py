"""Token ids of a pair as the cross-encoder reads it: ``<s> A </s></s> B </s>`` (XLM-R's pair form)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_SIDE_TOKENS", "pad_batch", "pair_ids"]

# A side past this is cut at its end, where side_text puts the least important context.
MAX_SIDE_TOKENS = 80
BOS, PAD, EOS = 0, 1, 2


def pair_ids(a: Sequence[int], b: Sequence[int], max_side: int = MAX_SIDE_TOKENS) -> list[int]:
    return [BOS, *a[:max_side], EOS, EOS, *b[:max_side], EOS]


def pad_batch(rows: Sequence[Sequence[int]]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Right-padded ids and mask; padding never changes a row's result (masked in attention and pooling)."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), PAD, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask
