"""What a conversation's length costs a request: proxy overhead over the direct upstream by the
number of earlier turns, for a conversation the proxy sees for the first time (a restart, or a
client that sends its whole history) and for the next turn of one it has seen.

The proxy runs as its own process in front of soak_upstream.py's app on loopback with a fixed
first-byte latency (bench_overhead.py's ``serving``). Each conversation has its own words, so
no request is a hit; a turn is ~40 words from the user and ~60 from the assistant, longer than
what a view keeps of it (300 and 160 characters). Per length and round: ``-n`` fresh
conversations asked once (``first seen``), then each asked its next turn after the proxy's answer
(``next turn``), and the same requests straight to the upstream. The table shows the median
over rounds of each round's p50 overhead, the statuses, and the proxy's CPU time per request.

    .venv/bin/python benchmarks/bench_long_history.py [--quick] [--turns 1 10 40] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import serving
from measurement import (
    DEFAULT_MODEL_HOME,
    add_pack_option,
    envelope,
    fmt,
    median_of,
    process_cpu_seconds,
    summary,
    write_json,
)

WORDS = [
    "apple",
    "river",
    "mountain",
    "laptop",
    "violin",
    "quantum",
    "garden",
    "bicycle",
    "harbor",
    "pepper",
    "castle",
    "rocket",
    "museum",
    "tiger",
    "jacket",
    "candle",
    "planet",
    "engine",
    "window",
    "forest",
    "lantern",
    "meadow",
    "copper",
    "saddle",
    "island",
    "mirror",
]
HEADERS = {"Authorization": "Bearer sk-bench-long-history"}


def history(rng: random.Random, turns: int, tag: str) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"{tag} {t} " + " ".join(rng.choice(WORDS) for _ in range(40)) + "?"})
        msgs.append({"role": "assistant", "content": " ".join(rng.choice(WORDS) for _ in range(60)) + "."})
    return msgs


async def ask(s: aiohttp.ClientSession, url: str, msgs: list[dict[str, str]], sid: str) -> tuple[float, str, str]:
    """(milliseconds to the whole answer, x-cache-status, the answer)."""
    t0 = time.perf_counter()
    async with s.post(
        url, json={"model": "m", "messages": msgs}, headers={**HEADERS, "x-smartcache-session": sid}
    ) as r:
        body = await r.json()
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}: {body}")
        status = r.headers.get("x-cache-status", "-")
    return (time.perf_counter() - t0) * 1000, status, str(body["choices"][0]["message"]["content"])


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    rounds: dict[int, list[dict[str, float]]] = {n: [] for n in args.turns}
    statuses: dict[int, collections.Counter[str]] = {n: collections.Counter() for n in args.turns}
    async with serving(args.upstream_ms, args.pack, args.model_home) as target, aiohttp.ClientSession() as s:
        for i in range(3):  # the graph's kernels, the tokenizer, the sockets
            await ask(s, target.proxy, history(rng, 2, f"warm{i}"), f"warm-{i}")
        for r in range(args.rounds):
            for n in args.turns[r % len(args.turns) :] + args.turns[: r % len(args.turns)]:
                convs = [history(rng, n, f"r{r}n{n}c{c}") for c in range(args.n)]
                for c in convs:
                    c.append({"role": "user", "content": f"And the {rng.choice(WORDS)} of it?"})
                direct = [(await ask(s, target.direct, c, "direct"))[0] for c in convs]
                cpu0 = process_cpu_seconds(target.pid)
                first = [await ask(s, target.proxy, c, f"r{r}n{n}c{k}") for k, c in enumerate(convs)]
                nexts = []
                for k, (c, (_, _, answer)) in enumerate(zip(convs, first, strict=True)):
                    c += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"Why {k}?"}]
                    nexts.append(await ask(s, target.proxy, c, f"r{r}n{n}c{k}"))
                cpu = process_cpu_seconds(target.pid) - cpu0
                floor = summary(direct)["p50"]
                statuses[n].update(f"first:{st}" for _, st, _ in first)
                statuses[n].update(f"next:{st}" for _, st, _ in nexts)
                rounds[n].append(
                    {
                        "first_p50_over_direct_ms": summary([ms for ms, _, _ in first])["p50"] - floor,
                        "next_p50_over_direct_ms": summary([ms for ms, _, _ in nexts])["p50"] - floor,
                        "cpu_ms_per_request": 1000 * cpu / (2 * len(convs)),
                    }
                )
    return {
        "upstream_ms": args.upstream_ms,
        "pack": args.pack,
        "rounds": args.rounds,
        "conversations_per_length_per_round": args.n,
        "lengths": {
            str(n): {
                "statuses": dict(statuses[n]),
                "median": {k: median_of(rounds[n], k) for k in rounds[n][0]},
                "rounds": rounds[n],
            }
            for n in args.turns
        },
    }


def print_table(res: dict[str, Any], console: Console) -> None:
    t = Table(
        title=f"overhead by history length (p50 over the direct upstream at {res['upstream_ms']:.0f} ms, "
        f"median of {res['rounds']} rounds, {res['pack']})"
    )
    for col in ("earlier turns", "first seen +ms", "next turn +ms", "proxy CPU ms/request", "statuses"):
        t.add_column(col, justify="right" if col != "statuses" else "left")
    for n, row in res["lengths"].items():
        m = row["median"]
        t.add_row(
            n,
            fmt(m["first_p50_over_direct_ms"]),
            fmt(m["next_p50_over_direct_ms"]),
            fmt(m["cpu_ms_per_request"]),
            " ".join(f"{k}={v}" for k, v in sorted(row["statuses"].items())),
        )
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 rounds x 4 conversations per length")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=8, help="conversations per length per round")
    ap.add_argument("--turns", type=int, nargs="+", default=[1, 5, 10, 20, 40])
    ap.add_argument("--upstream-ms", type=float, default=20.0, help="the scripted upstream's fixed latency")
    add_pack_option(ap)
    ap.add_argument("--model-home", type=Path, default=DEFAULT_MODEL_HOME)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/bench_long_history.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.n = 3, 4
    res = asyncio.run(measure(args))
    print_table(res, Console(width=140))
    path = write_json(args.json, "bench_long_history", envelope("bench_long_history", sys.argv, res))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
