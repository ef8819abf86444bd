"""Train the learned never-cache reader (proxy/signing/never_cache_head.py) in about a minute on
two cores: embed the training utterances (proxy.tools.never_cache.data) with the pack's own
embedder, as the signer embeds a turn (normalised), fit a softmax layer, and set its level on a
validation fifth so that at most ``--target-false`` of ordinary questions in either language
are read as never-cache.

    .venv/bin/python -m proxy.tools.never_cache.train --data ../shared/data \
        --model-home /tmp/smartcache-bench-models [--model use-multilingual] [--seed 20261205]

Writes ``never_cache.<model>.npz`` (weights) and ``.json`` (manifest: data counts, seed, level,
validation figures) into proxy/signing/weights/ (or ``--out``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from proxy.core.conversation import Normalizer
from proxy.embedding.packs import load_embedder
from proxy.signing.never_cache_head import WEIGHTS_DIR, softmax
from proxy.tools.never_cache.data import LABELS, Utterance, training_utterances
from proxy.tools.verifier.pairs import text_key

Floats = npt.NDArray[np.float64]


def is_validation(text: str, seed: int) -> bool:
    digest = hashlib.blake2b(f"{seed}:{text_key(text)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 5 == 0


def group_weights(rows: Sequence[Utterance]) -> Floats:
    """Each (language, label) group weighs the same in total: 90 hand-written English medical
    turns count as much as 3,000 Chinese patients' questions."""
    counts = Counter((u.lang, u.label) for u in rows)
    w = np.array([1.0 / counts[(u.lang, u.label)] for u in rows])
    return np.asarray(w * len(rows) / w.sum(), dtype=np.float64)


def fit(x: Floats, y: npt.NDArray[np.int64], w: Floats, *, l2: float, epochs: int, seed: int) -> tuple[Floats, Floats]:
    """Weighted softmax regression by full-batch Adam: (classes, dim) weights and biases."""
    rng = np.random.default_rng(seed)
    k, d = len(LABELS), x.shape[1]
    weights, bias = rng.normal(0, 0.01, (k, d)), np.zeros(k)
    onehot = np.eye(k)[y]
    m = [np.zeros_like(weights), np.zeros_like(bias)]
    v = [np.zeros_like(weights), np.zeros_like(bias)]
    lr, b1, b2 = 0.05, 0.9, 0.999
    for t in range(1, epochs + 1):
        p = softmax(x @ weights.T + bias)
        err = (p - onehot) * w[:, None] / w.sum()
        grads = [err.T @ x + l2 * weights, err.sum(axis=0)]
        for i, (param, g) in enumerate(zip((weights, bias), grads, strict=True)):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            param -= lr * (m[i] / (1 - b1**t)) / (np.sqrt(v[i] / (1 - b2**t)) + 1e-8)
    return weights, bias


def levels(probs: Floats, rows: Sequence[Utterance], target: float, read: Sequence[str]) -> dict[str, float]:
    """Per never-cache class to be read, the lowest level at which no language reads more than its
    share of ``target`` (split evenly between the classes read) of its other rows as that class."""
    share = target / len(read)
    out: dict[str, float] = {}
    for c, label in enumerate(LABELS[1:], start=1):
        if label not in read:
            continue
        level = 0.5
        for lang in sorted({u.lang for u in rows}):
            other = [p for p, u in zip(probs[:, c], rows, strict=True) if u.lang == lang and u.label == "other"]
            if other:
                level = max(level, float(np.quantile(other, 1.0 - share, method="higher")) + 1e-6)
        out[label] = round(min(level, 0.999), 6)
    return out


def read(probs: Floats, at: dict[str, float]) -> npt.NDArray[np.int64]:
    """The class each row reads as: the likeliest never-cache class over its level, else other."""
    over = np.stack([probs[:, c] >= at.get(label, np.inf) for c, label in enumerate(LABELS[1:], start=1)], axis=1)
    masked = np.where(over, probs[:, 1:], -1.0)
    return np.where(over.any(axis=1), masked.argmax(axis=1) + 1, 0).astype(np.int64)


def report(predicted: npt.NDArray[np.int64], rows: Sequence[Utterance]) -> dict[str, object]:
    out: dict[str, object] = {}
    for group in sorted({(u.lang, u.label) for u in rows}):
        idx = [i for i, u in enumerate(rows) if (u.lang, u.label) == group]
        lang, label = group
        if label == "other":
            out[f"{lang}/other/false_bypass_rate"] = round(float(np.mean(predicted[idx] != 0)), 4)
        else:
            out[f"{lang}/{label}/recall"] = round(float(np.mean(predicted[idx] == LABELS.index(label))), 4)
        out[f"{lang}/{label}/rows"] = len(idx)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--model", default="use-multilingual")
    ap.add_argument("--model-home", type=Path, default=Path.home() / ".smartcache")
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--per-source", type=int, default=3000)
    ap.add_argument("--target-false", type=float, default=0.01)
    # realtime is trained, so its examples stay out of other, but not read: a softmax over a
    # sentence vector reads its topic, not whether the answer moves with the clock
    ap.add_argument("--read", nargs="+", choices=LABELS[1:], default=["medical"])
    ap.add_argument("--l2", type=float, default=1e-4)
    ap.add_argument("--epochs", type=int, default=400)
    ap.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    args = ap.parse_args(argv)
    started = time.monotonic()
    rows = training_utterances(args.data, seed=args.seed, per_source=args.per_source)
    embedder = load_embedder(args.model, args.model_home)
    normalize = Normalizer()
    x = np.concatenate(
        [embedder.embed([normalize(u.text) for u in rows[i : i + 256]]) for i in range(0, len(rows), 256)]
    ).astype(np.float64)
    y = np.array([LABELS.index(u.label) for u in rows], dtype=np.int64)
    val = np.array([is_validation(u.text, args.seed) for u in rows])
    train_rows = [u for u, v in zip(rows, val, strict=True) if not v]
    val_rows = [u for u, v in zip(rows, val, strict=True) if v]
    weights, bias = fit(x[~val], y[~val], group_weights(train_rows), l2=args.l2, epochs=args.epochs, seed=args.seed)
    probs = softmax(x[val] @ weights.T + bias)
    at = levels(probs, val_rows, args.target_false, args.read)
    figures = report(read(probs, at), val_rows)
    # what the classes left unread would have done at the same false-bypass share
    unread = [c for c in LABELS[1:] if c not in args.read]
    if unread:
        would = levels(probs, val_rows, args.target_false, [*args.read, *unread])
        figures["if_all_read"] = {"thresholds": would, **report(read(probs, would), val_rows)}
    # the shipped weights are refitted on every row, at the level the validation fifth chose
    weights, bias = fit(x, y, group_weights(rows), l2=args.l2, epochs=args.epochs, seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"never_cache.{args.model}"
    np.savez_compressed(f"{stem}.npz", weights=weights.astype(np.float32), bias=bias.astype(np.float32))
    digest = hashlib.sha256("\n".join(sorted(f"{u.label}\t{u.text}" for u in rows)).encode()).hexdigest()
    manifest = {
        "model": args.model,
        "classes": list(LABELS),
        "thresholds": at,
        "seed": args.seed,
        "target_false_bypass": args.target_false,
        "command": "python -m proxy.tools.never_cache.train --data ../shared/data --model-home DIR"
        f" --model {args.model} --seed {args.seed} --per-source {args.per_source}"
        f" --target-false {args.target_false} --read {' '.join(args.read)} --l2 {args.l2} --epochs {args.epochs}",
        "rows": dict(sorted(Counter(f"{u.source}/{u.lang}/{u.label}" for u in rows).items())),
        "rows_digest": digest,
        "validation_fifth": figures,
        "kept_out": "benchmarks/data/never_cache_* and every user turn of ../shared/eval's traces",
        "terms": "shared-data sources are research/academic-use sets (see ../shared/data/*/SOURCE.txt)",
    }
    Path(f"{stem}.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"thresholds": at, **figures}, indent=2))
    print(f"wrote {stem}.npz/.json in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
