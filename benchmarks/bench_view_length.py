"""What a view's length costs the embedding model: one call of a view of N tokens and a short
question (what a miss sends), per pack, in alternating rounds; the median over rounds of each
round's median. This is what ``view_tokens`` trades against the context a view holds.

    .venv/bin/python benchmarks/bench_view_length.py [--lengths 16 64 128 256 504] [--packs P ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurement import DEFAULT_MODEL_HOME, envelope, fmt, write_json

from proxy.embedding.backends import SyncEmbedder
from proxy.embedding.packs import load_embedder

QUESTION = "what does it cost?"
FILLER = (
    "user: the hotel near the river has a quiet room and a good breakfast, what are the prices in june\n"
    "assistant: rooms by the river start at ninety euros a night with breakfast included\n"
)


def view_of(backend: SyncEmbedder, tokens: int) -> str:
    """The longest prefix of a repeated conversation that holds at most ``tokens`` tokens."""
    words = (FILLER * (tokens // 8 + 2)).split(" ")
    low, high = 1, len(words)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if backend.count_tokens(" ".join(words[:mid])) <= tokens else (low, mid - 1)
    return " ".join(words[:low])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    backends = {p: load_embedder(p, args.model_home) for p in args.packs}
    views = {p: {n: view_of(b, n) for n in args.lengths} for p, b in backends.items()}
    for p, b in backends.items():  # kernels and allocations of every shape, before timing
        for view in views[p].values():
            b.embed([view, QUESTION])
    rounds: dict[str, dict[int, list[float]]] = {p: {n: [] for n in args.lengths} for p in args.packs}
    for _ in range(args.rounds):
        for p, b in backends.items():
            for n, view in views[p].items():
                times = []
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    b.embed([view, QUESTION])
                    times.append((time.perf_counter() - t0) * 1000)
                rounds[p][n].append(statistics.median(times))
    return {
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "packs": {
            p: {
                str(n): {"tokens": backends[p].count_tokens(views[p][n]), "ms": statistics.median(rounds[p][n])}
                for n in args.lengths
            }
            for p in args.packs
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 rounds x 5 calls")
    ap.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 128, 256, 504])
    ap.add_argument("--packs", nargs="+", default=["e5-small-multilingual", "use-multilingual"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--model-home", type=Path, default=DEFAULT_MODEL_HOME)
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/bench_view_length.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.calls = 3, 5
    res = measure(args)
    t = Table(title=f"one model call: a view of N tokens and a short question (median of {args.rounds} rounds)")
    t.add_column("view tokens", justify="right")
    for p in args.packs:
        t.add_column(f"{p} ms", justify="right")
    for n in args.lengths:
        t.add_row(str(n), *(fmt(res["packs"][p][str(n)]["ms"]) for p in args.packs))
    Console().print(t)
    path = write_json(args.json, "bench_view_length", envelope("bench_view_length", sys.argv, res))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
