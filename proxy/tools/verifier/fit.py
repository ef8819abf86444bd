"""The torch half of training: cached lower states in, a trained ``PairHead`` out."""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from proxy.tools.verifier.model import PairHead
from proxy.tools.verifier.pairs import LabeledPair
from proxy.tools.verifier.states import CachedStates, encode_pairs, lower_states

__all__ = ["encode_and_cache", "logits_of", "train_head"]


def encode_and_cache(image: Any, pairs: Sequence[LabeledPair], args: argparse.Namespace) -> CachedStates:
    return lower_states(image, encode_pairs(image, pairs), args.cut, args.cache, args.threads)


def _batch(states: CachedStates, index: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = [int(states.offsets[i + 1] - states.offsets[i]) for i in index]
    x = np.zeros((len(index), max(lengths), states.states.shape[1]), dtype=np.float32)
    mask = np.zeros((len(index), max(lengths)), dtype=np.float32)
    for j, i in enumerate(index):
        x[j, : lengths[j]] = states.row(i)
        mask[j, : lengths[j]] = 1
    return torch.from_numpy(x), torch.from_numpy(mask)


def _batches(states: CachedStates, pool: Sequence[int], batch: int, rng: random.Random) -> Iterator[list[int]]:
    """Shuffled batches of similar length (sorted within chunks of 50 batches): little padding."""
    order = list(pool)
    rng.shuffle(order)
    length = np.diff(states.offsets)
    groups: list[list[int]] = []
    for start in range(0, len(order), batch * 50):
        chunk = sorted(order[start : start + batch * 50], key=lambda i: int(length[i]))
        groups += [chunk[k : k + batch] for k in range(0, len(chunk), batch)]
    rng.shuffle(groups)
    yield from groups


def train_head(
    image: Any, states: CachedStates, pairs: Sequence[LabeledPair], pool: Sequence[int], args: argparse.Namespace
) -> PairHead:
    """``pool`` lists row indices per epoch (a row listed twice is read twice)."""
    model = PairHead(image, args.cut, args.top_layers)
    if args.init is not None:  # continue from earlier weights (another epoch at a lower rate)
        with np.load(args.init / "top.npz") as npz:
            model.load_state_dict({k: torch.from_numpy(npz[k].astype(np.float32)) for k in npz.files})
    labels = torch.tensor([p.label for p in pairs], dtype=torch.float32)
    params = [
        {"params": model.top.parameters(), "lr": args.lr},
        {"params": model.head.parameters(), "lr": args.lr * 10},
    ]
    optimizer = torch.optim.AdamW(params, weight_decay=0.01)
    steps = args.epochs * -(-len(pool) // args.batch)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / (steps - warmup)))
    )
    rng, step, began = random.Random(f"{args.seed}|batches"), 0, time.monotonic()
    model.train()
    for epoch in range(args.epochs):
        running = 0.0
        for index in _batches(states, pool, args.batch, rng):
            x, mask = _batch(states, index)
            # bfloat16 matmuls (AVX512-BF16) run faster than float32 on CPUs that have them; the
            # weights and the optimizer stay float32, and calibration reads float32 logits
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                logits = model(x, mask)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels[index])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step, running = step + 1, running + loss.item()
            if step % 200 == 0:
                print(
                    f"  epoch {epoch} step {step}/{steps} loss {running / 200:.4f} {time.monotonic() - began:.0f}s",
                    file=sys.stderr,
                )
                running = 0.0
    model.eval()
    return model


@torch.no_grad()
def logits_of(model: PairHead, states: CachedStates, batch: int = 64) -> np.ndarray:
    n = len(states.offsets) - 1
    order = sorted(range(n), key=lambda i: int(states.offsets[i + 1] - states.offsets[i]))
    out = np.zeros(n, dtype=np.float64)
    for start in range(0, n, batch):
        index = order[start : start + batch]
        x, mask = _batch(states, index)
        out[index] = model(x, mask).numpy()
    return out
