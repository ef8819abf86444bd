"""A learned reader of never-cache turns: a softmax layer over the turn's own embedding.

The rules (proxy/core/text/never_cache.py) name what they know word by word; people say "My left
eye has been twitching" or "三亚这几天风浪大不大" in words no list holds. The signer embeds every
turn anyway, so one small matrix product over that vector reads what the words mean: other,
realtime or medical. It reads the classes its manifest gives a level: medical, whose words
("twitching", "burning when I pee", "起疙瘩") say what they are; not realtime, which it cannot
tell from the topic (it reads "How many innings are in a baseball game?" as live as "Did the
Celtics win last night?"; the manifest's validation figures), so the rules keep that. It only
adds never-cache turns (a turn the rules name stays named), and
its level is set in training so that ordinary questions are rarely taken for one, because a
false alarm costs a cache hit while a miss may serve someone else's answer.

The weights belong to one embedding pack (their manifest names it): under another pack the
reader is off. Trained by ``python -m proxy.tools.never_cache.train`` (see its docstring for
the data); measured by benchmarks/bench_never_cache.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from proxy.core.text.never_cache import NeverCacheMatch

__all__ = ["WEIGHTS_DIR", "NeverCacheHead", "head_for", "softmax"]

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
RULE = "learned"  # NeverCacheMatch.rule of the reader's matches


@dataclass(frozen=True)
class NeverCacheHead:
    model: str  # the embedding pack the weights were trained under
    classes: tuple[str, ...]  # "other" first, then the never-cache intents
    weights: npt.NDArray[np.float32]  # (classes, dim)
    bias: npt.NDArray[np.float32]  # (classes,)
    thresholds: tuple[float, ...]  # per class: a never-cache class is read at this probability or above

    @classmethod
    def load(cls, stem: Path) -> NeverCacheHead:
        """``stem``.json (manifest) and ``stem``.npz (weights), as the trainer writes them."""
        manifest = json.loads(Path(f"{stem}.json").read_text(encoding="utf-8"))
        with np.load(f"{stem}.npz") as arrays:
            weights = np.ascontiguousarray(arrays["weights"], dtype=np.float32)
            bias = np.asarray(arrays["bias"], dtype=np.float32)
        classes = tuple(manifest["classes"])
        if weights.shape[0] != len(classes) or bias.shape != (len(classes),) or classes[0] != "other":
            raise ValueError(f"{stem}: weights of shape {weights.shape} do not match classes {classes}")
        # a class with no level is trained (it keeps its examples out of the others) but never read
        levels = manifest["thresholds"]
        thresholds = (math.inf, *(float(levels.get(c, math.inf)) for c in classes[1:]))
        return cls(manifest["model"], classes, weights, bias, thresholds)

    @property
    def dim(self) -> int:
        return int(self.weights.shape[1])

    def probabilities(self, vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        return softmax(self.weights @ np.asarray(vector, dtype=np.float32) + self.bias)

    def read(self, vector: npt.NDArray[np.float32]) -> NeverCacheMatch | None:
        """The never-cache intent the turn's vector reads as, or None (other, or unsure)."""
        if vector.shape != (self.dim,):
            return None
        probs = self.probabilities(vector)
        over = [i for i in range(1, len(self.classes)) if probs[i] >= self.thresholds[i]]
        if not over:
            return None
        return NeverCacheMatch(self.classes[max(over, key=lambda i: probs[i])], RULE)


def softmax(logits: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """Probabilities over the last axis (one row of logits, or a matrix of them)."""
    z = np.exp(np.asarray(logits, dtype=np.float64) - np.max(logits, axis=-1, keepdims=True))
    return np.asarray(z / z.sum(axis=-1, keepdims=True), dtype=np.float64)


def head_for(model: str, weights_dir: Path = WEIGHTS_DIR) -> NeverCacheHead | None:
    """The reader trained under embedding pack ``model``, or None where none was."""
    stem = weights_dir / f"never_cache.{model}"
    if not Path(f"{stem}.json").is_file():
        return None
    head = NeverCacheHead.load(stem)
    return head if head.model == model else None
