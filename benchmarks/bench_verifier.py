"""Pair verification on held-out test splits: embedding cosines vs the GBDT baseline vs the shipped verifier.

    .venv/bin/python benchmarks/bench_verifier.py [--quick] [--json out.json]

Every set is evaluated on its ``test`` split only (the rule in ``proxy/verify/weights/heldout.json``,
recomputed here and checked against its digests): rows the verifier never trained on nor
calibrated with. Per set and model: AUC and recall at precision 99 % / 99.9 %. The GBDT baseline
(LightGBM over ``proxy.tools.verifier.features``) is fitted here on a sample of the train split.
Then the verifier's latency: p50 ms per pair at batch 1 and at batch 16. ``--quick`` subsamples
every set to finish in a few minutes on 2 cores. Needs the ``train`` extra only for the GBDT.
``--top N`` lists the pairs labelled different among the shipped verifier's N highest-scored
of each set: what sets its recall at high precision, to be read (a model error, or a wrong label).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from proxy.tools.verifier.dataset import Splits, build_splits, manifest
from proxy.tools.verifier.features import pair_features
from proxy.tools.verifier.metrics import auc, recall_at_precision
from proxy.tools.verifier.pairs import LabeledPair
from proxy.verify import load_verifier, side_text
from proxy.verify.cross_encoder import DEFAULT_WEIGHTS

SETS: dict[str, Callable[[str], bool]] = {
    "lcqmc": lambda s: s == "lcqmc",
    "bq": lambda s: s == "bq",
    "atec": lambda s: s == "atec",
    "pawsx": lambda s: s == "pawsx",
    "qqp": lambda s: s == "qqp",
    "mined": lambda s: s.startswith("mined_"),
    "bq_train": lambda s: s == "bq_train",
    "afqmc": lambda s: s in ("afqmc", "atec_part1"),
    "oppo": lambda s: s == "oppo",
    "mrpc": lambda s: s == "mrpc",
}
Scorer = Callable[[Sequence[LabeledPair]], np.ndarray]


def _cosines(embedder: Any) -> Scorer:
    def score(pairs: Sequence[LabeledPair]) -> np.ndarray:
        texts = sorted({side_text(s) for p in pairs for s in (p.a, p.b)})
        rows = dict(zip(texts, embedder.embed(texts), strict=True))
        return np.array([float(np.dot(rows[side_text(p.a)], rows[side_text(p.b)])) for p in pairs])

    return score


def _embedders(home: Path, threads: int) -> dict[str, Scorer]:
    from proxy.embedding.packs import install_pack, load_embedder

    out: dict[str, Scorer] = {}
    for label, pack in (("e5 cosine", "e5-small-multilingual"), ("USE cosine", "use-multilingual")):
        try:
            install_pack(pack, home, progress=False)
            out[label] = _cosines(load_embedder(pack, home, threads=threads, auto_install=False))
        except Exception as exc:  # a pack that cannot load is reported, not fatal
            print(f"{label}: not available ({exc})", file=sys.stderr)
    return out


def _gbdt(cosines: dict[str, Scorer], train: Sequence[LabeledPair], seed: int) -> Scorer | None:
    try:
        import lightgbm
    except ImportError:
        print("GBDT: lightgbm not installed (pip install -e '.[train]')", file=sys.stderr)
        return None

    def features(pairs: Sequence[LabeledPair]) -> np.ndarray:
        zero = np.zeros(len(pairs))
        e5 = cosines["e5 cosine"](pairs) if "e5 cosine" in cosines else zero
        use = cosines["USE cosine"](pairs) if "USE cosine" in cosines else zero
        return np.stack([pair_features(side_text(p.a), side_text(p.b), e5[i], use[i]) for i, p in enumerate(pairs)])

    params = {
        "objective": "binary",
        "learning_rate": 0.05,
        "num_leaves": 31,
        "seed": seed,
        "num_threads": 2,
        "verbose": -1,
        "deterministic": True,
    }
    model = lightgbm.train(params, lightgbm.Dataset(features(train), [p.label for p in train]), num_boost_round=300)
    return lambda pairs: np.asarray(model.predict(features(pairs)), dtype=np.float64)


def _verifier_scores(verifier: Any, pairs: Sequence[LabeledPair], chunk: int = 64) -> np.ndarray:
    # in chunks: one batch of thousands of pairs padded to the longest holds gigabytes of attention
    sides = [(x.a, x.b) for x in pairs]
    return np.array([p for start in range(0, len(sides), chunk) for p in verifier.score(sides[start : start + chunk])])


def _top_negatives(rows: Sequence[LabeledPair], scores: np.ndarray, n: int) -> dict[str, Any]:
    """The pairs labelled different among the ``n`` highest-scored, printed for reading: a model
    error, or a label that is wrong."""
    top = [int(i) for i in np.argsort(-scores, kind="stable")[:n]]
    negatives = [(rank, i) for rank, i in enumerate(top) if rows[i].label == 0]
    print(f"  {len(negatives)} labelled different among the top {len(top)}:")
    for rank, i in negatives:
        print(f"    #{rank + 1} p={scores[i]:.3f}  {side_text(rows[i].a)}  ||  {side_text(rows[i].b)}")
    return {"n": len(top), "labelled_different": len(negatives), "ranks": [rank + 1 for rank, _ in negatives]}


def _latency(verifier: Any, pairs: Sequence[LabeledPair], repeats: int) -> dict[str, float]:
    sides = [(p.a, p.b) for p in pairs]
    verifier.score(sides[:16])
    single = []
    for pair in sides[:repeats]:
        t = time.perf_counter()
        verifier.score([pair])
        single.append((time.perf_counter() - t) * 1000)
    batched = []
    for start in range(0, min(len(sides), 16 * max(4, repeats // 8)), 16):
        t = time.perf_counter()
        verifier.score(sides[start : start + 16])
        batched.append((time.perf_counter() - t) * 1000 / 16)
    return {"p50_ms_batch1": statistics.median(single), "p50_ms_per_pair_batch16": statistics.median(batched)}


def _check_manifest(splits: Splits, weights: Path) -> None:
    path = weights / "heldout.json"
    if not path.is_file():
        print(f"warning: {path} missing; the split cannot be checked", file=sys.stderr)
        return
    shipped = json.loads(path.read_text(encoding="utf-8"))["test_sha256"]
    now = manifest(splits, [], [])["test_sha256"]
    changed = sorted(k for k in shipped if shipped[k] != now.get(k))
    if changed:
        raise SystemExit(f"the test split differs from the one the verifier was held out on: {changed}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "data")
    p.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    p.add_argument("--model-home", type=Path, default=Path("/tmp/smartcache-bench-models"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--top-bits",
        type=int,
        nargs="+",
        choices=(8, 32),
        help="serve the trained layers as 8-bit blocks and/or float32, each scored and timed in this run "
        "(default: the width the config names)",
    )
    p.add_argument("--quick", action="store_true", help="at most 500 test pairs per set")
    p.add_argument("--max-pairs", type=int, default=4000, help="test pairs per set (seeded sample)")
    p.add_argument("--gbdt-train", type=int, default=2000, help="train pairs per set for the GBDT baseline")
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--top",
        type=int,
        default=0,
        metavar="N",
        help="also list, per set, the pairs labelled different among the shipped verifier's N highest-scored "
        "(how clean its top end is, and whether those labels are right)",
    )
    p.add_argument(
        "--compare",
        type=Path,
        action="append",
        default=[],
        metavar="WEIGHTS",
        help="another weights directory (earlier weights) scored beside the shipped one; repeatable",
    )
    args = p.parse_args(argv)
    cap, train_cap = (500, 400) if args.quick else (args.max_pairs, args.gbdt_train)
    began = time.monotonic()
    split_seed = (
        json.loads((args.weights / "heldout.json").read_text())["seed"]
        if (args.weights / "heldout.json").is_file()
        else 0
    )
    splits = build_splits(args.data, split_seed)
    _check_manifest(splits, args.weights)
    rng = random.Random(0)
    tests, train = {}, []
    for name, member in SETS.items():
        rows = [r for r in splits.rows["test"] if member(r.source)]
        tests[name] = rng.sample(rows, min(cap, len(rows)))
        rows = [r for r in splits.rows["train"] if member(r.source)]
        train += rng.sample(rows, min(train_cap, len(rows)))
    scorers = _embedders(args.model_home, args.threads)
    gbdt = _gbdt(dict(scorers), train, 0)
    if gbdt is not None:
        scorers["GBDT baseline"] = gbdt
    verifiers = {}
    for bits in args.top_bits or [None]:
        verifier = load_verifier(args.weights, threads=args.threads, top_bits=bits)
        label = f"verifier v{verifier.version} {verifier.config.top_bits}-bit"
        verifiers[label] = verifier
        scorers[label] = functools.partial(_verifier_scores, verifier)
    for other in args.compare:
        earlier = load_verifier(other, threads=args.threads)
        scorers[f"earlier v{earlier.version} {earlier.config.top_bits}-bit"] = functools.partial(
            _verifier_scores, earlier
        )
    results: dict[str, Any] = {"sets": {}, "quick": args.quick}
    print(f"{'set':8s} {'n':>5s} {'pos':>5s}  {'model':34s} {'AUC':>6s} {'R@P99':>6s} {'R@P99.9':>7s}")
    for name, rows in tests.items():
        y = np.array([r.label for r in rows])
        results["sets"][name] = {"n": len(rows), "positives": int(y.sum()), "models": {}}
        for label, scorer in scorers.items():
            s = scorer(rows)
            m = {
                "auc": auc(s, y),
                "r@p99": recall_at_precision(s, y, 0.99),
                "r@p99.9": recall_at_precision(s, y, 0.999),
            }
            results["sets"][name]["models"][label] = m
            row = f"{m['auc']:6.3f} {m['r@p99']:6.3f} {m['r@p99.9']:7.3f}"
            print(f"{name:8s} {len(rows):5d} {int(y.sum()):5d}  {label:34s} {row}")
            if args.top and label == next(iter(verifiers)):
                results["sets"][name]["top"] = _top_negatives(rows, s, args.top)
    results["latency"] = {}
    shapes = {
        "question pairs (LCQMC)": tests["lcqmc"],
        "with context (mined)": [r for r in tests["mined"] if r.a.previous_question or r.b.previous_question],
    }
    for shape, rows in shapes.items():
        if not rows:
            continue
        for label, verifier in verifiers.items():
            lat = _latency(verifier, rows, 40 if args.quick else 100)
            lat["mean_tokens"] = float(np.mean([verifier.token_count((r.a, r.b)) for r in rows[:200]]))
            key = shape if len(verifiers) == 1 else f"{shape}, {label}"
            results["latency"][key] = lat
            print(
                f"{label} latency, {shape}, ~{lat['mean_tokens']:.0f} tokens: p50 {lat['p50_ms_batch1']:.1f} ms "
                f"per pair at batch 1, {lat['p50_ms_per_pair_batch16']:.1f} ms per pair at batch 16"
            )
    results["load_average"] = os.getloadavg()[0]
    print(f"{args.threads} threads; load average {results['load_average']:.1f} on {os.cpu_count()} cores")
    results["wall_s"] = round(time.monotonic() - began)
    print(f"wall {results['wall_s']} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
