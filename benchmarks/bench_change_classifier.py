"""Rules vs a small learned change classifier: is it worth shipping?

Features: the e5 embedding of the current turn, the embedding of the candidate context (its
last user turn), their element-wise product, and the rule signals (negation / addition /
modification / conflict flags). Model: multinomial logistic regression (numpy, L2), trained on
the cases the rules were written with (own + data sets), evaluated on the held-out cases that
never shaped the rules, against the rules on the same cases. Gold intents for both.

    .venv/bin/python benchmarks/bench_change_classifier.py [--model-home DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_change import (
    OWN_CASES,
    ROOT,
    Case,
    crosswoz_cases,
    held_out_cases,
    kvret_cases,
    mt_bench_cases,
    predict,
)

from proxy.core.decision.change import ChangeKind
from proxy.core.text.normalize import normalize_text
from proxy.core.text.phrases import change_signals
from proxy.embedding.packs import load_embedder

LABELS = [ChangeKind.NO_CHANGE, ChangeKind.MODIFIES_CONTEXT, ChangeKind.NEW_TOPIC]
SIGNALS = ("negation", "addition", "modification", "topic")


def features(cases: list[Case], embed) -> np.ndarray:  # type: ignore[no-untyped-def]
    turns = embed([normalize_text(c.turn) for c in cases])
    contexts = embed([normalize_text(c.context[-1] if c.context else "") for c in cases])
    flags = np.array(
        [[any(s.startswith(k) for s in change_signals(normalize_text(c.turn))) for k in SIGNALS] for c in cases],
        dtype=np.float32,
    )
    same_intent = np.array([[c.intents[0] == c.intents[1]] for c in cases], dtype=np.float32)
    return np.hstack([turns, contexts, turns * contexts, flags, same_intent, np.ones((len(cases), 1))])


def train(x: np.ndarray, y: np.ndarray, *, l2: float = 1e-2, steps: int = 2000, lr: float = 0.5) -> np.ndarray:
    w = np.zeros((x.shape[1], len(LABELS)))
    onehot = np.eye(len(LABELS))[y]
    for _ in range(steps):
        logits = x @ w
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        w -= lr * (x.T @ (p - onehot) / len(x) + l2 * w)
    return w


def scores(gold: list[ChangeKind], got: list[ChangeKind]) -> str:
    acc = np.mean([g == p for g, p in zip(gold, got, strict=True)])
    changed = [(g is not ChangeKind.NO_CHANGE, p is not ChangeKind.NO_CHANGE) for g, p in zip(gold, got, strict=True)]
    tp = sum(g and p for g, p in changed)
    prec = tp / max(1, sum(p for _, p in changed))
    rec = tp / max(1, sum(g for g, _ in changed))
    return f"accuracy {acc:.3f}  change precision {prec:.3f}  change recall {rec:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--model-home", type=Path, default=ROOT / ".smartcache")
    a = ap.parse_args()
    tuned = list(OWN_CASES) + crosswoz_cases(a.data) + kvret_cases(a.data) + mt_bench_cases(a.data)
    held = held_out_cases(a.data)
    model = load_embedder("e5-small-multilingual", a.model_home)
    w = train(features(tuned, model.embed), np.array([LABELS.index(c.label) for c in tuned]))
    learned = [LABELS[i] for i in np.argmax(features(held, model.embed) @ w, axis=1)]
    rules = [predict(c, c.intents) for c in held]
    gold = [c.label for c in held]
    print(f"train {len(tuned)} cases (rules were written with these), test {len(held)} held-out cases")
    print(f"rules       {scores(gold, rules)}")
    print(f"classifier  {scores(gold, learned)}")


if __name__ == "__main__":
    main()
