"""Hidden states of the frozen lower layers, computed once per pair and cached under /tmp.

Training only the top layers means the lower ``cut`` layers give the same output every epoch:
running them once (ONNX Runtime, the exact graph the shipped verifier runs) and keeping their
states as float16 makes each epoch cost only the trained layers. Rows are processed sorted by
length so a batch pads little; the cache is one flat ``[tokens, hidden]`` array plus offsets.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from proxy.tools.verifier.pairs import LabeledPair
from proxy.verify.encoding import MAX_SIDE_TOKENS, pad_batch, pair_ids
from proxy.verify.graph import base_tokenizer, lower_graph
from proxy.verify.sides import side_text

__all__ = ["CachedStates", "encode_pairs", "lower_states"]

_BATCH_TOKENS = 2048


@dataclass(frozen=True)
class CachedStates:
    states: npt.NDArray[np.float16]  # [total tokens, hidden]
    offsets: npt.NDArray[np.int64]  # row i is states[offsets[i]:offsets[i + 1]]

    def row(self, i: int) -> npt.NDArray[np.float16]:
        return self.states[self.offsets[i] : self.offsets[i + 1]]


def encode_pairs(image: Any, pairs: Sequence[LabeledPair]) -> list[list[int]]:
    tokenizer = base_tokenizer(image)
    texts = [side_text(s) for p in pairs for s in (p.a, p.b)]
    ids = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    return [pair_ids(ids[2 * i], ids[2 * i + 1], MAX_SIDE_TOKENS) for i in range(len(pairs))]


def lower_states(image: Any, rows: Sequence[Sequence[int]], cut: int, cache: Path, threads: int) -> CachedStates:
    key = hashlib.sha256(repr((cut, [list(r) for r in rows])).encode()).hexdigest()[:16]
    path = cache / f"states-{cut}-{key}.npz"
    if path.is_file():
        with np.load(path) as npz:
            return CachedStates(npz["states"], npz["offsets"])
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(
        lower_graph(image, cut).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    states = np.zeros((int(offsets[-1]), image.shape["hidden"]), dtype=np.float16)
    order, start, done, began = np.argsort(lengths, kind="stable"), 0, 0, time.monotonic()
    while start < len(order):
        width = int(lengths[order[start]])
        end = start + 1
        while end < len(order) and (end - start + 1) * int(lengths[order[end]]) <= _BATCH_TOKENS:
            end += 1
        batch = order[start:end]
        ids, mask = pad_batch([rows[i] for i in batch])
        (hidden,) = session.run(["hidden"], {"input_ids": ids, "attention_mask": mask})
        for j, i in enumerate(batch):
            states[offsets[i] : offsets[i + 1]] = hidden[j, : lengths[i]]
        done += len(batch)
        start = end
        if done % 2000 < len(batch):
            print(f"  lower states {done}/{len(rows)} (width {width}) {time.monotonic() - began:.0f}s", file=sys.stderr)
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, states=states, offsets=offsets)
    return CachedStates(states, offsets)
