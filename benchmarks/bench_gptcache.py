"""SmartCache against GPTCache with the same embedder: hit latency, hit throughput, false hits and recall.

GPTCache 0.1.44 (the ``bench`` extra) runs in this process, configured as its docs show for a
local semantic cache: ``manager_factory("sqlite,hnswlib")``, ``SearchDistanceEvaluation`` and a
``similarity_threshold``, with our embedding pack (``--pack``, the default one unless told) as its
embedding function (``load_embedder``, the loader the proxy uses), so the model, the vectors and
the HNSW index are the same kind on both sides and only the cache logic differs. A request goes
through GPTCache's own ``adapt`` (what its OpenAI adapter calls), with a stand-in LLM function that
answers on a miss.

Two small settings make the shipped GPTCache run at all here, and change no decision of it:
its hnswlib wrapper fails a search on an empty index ("Cannot return the results in a contiguous
2D array"), so one sentinel record with a random vector (cosine ~0 to any text) is stored first;
and its SQL store looks records up by the hnswlib label, a numpy integer, which the sqlite3
driver cannot bind (every lookup then finds nothing), so numpy integers are registered as ints.
Its LRU keeps 1,000 records by default; it is raised above the number of requests.

GPTCache's threshold is on ``4 - d²`` for squared L2 distance ``d²`` between unit vectors, so
``similarity_threshold = t`` accepts cosine ``>= 2t - 1``; its default 0.8 is cosine 0.6.

1. Hit latency, in alternating rounds: GPTCache in process (``adapt``: pre-process, embed,
   search, SQL read, evaluate) against ours over HTTP through the proxy process (bench_overhead's
   set-up), for an exact repeat and a paraphrase. GPTCache embeds every request; ours reuses the
   vector of a text it has embedded before, which is part of its cache logic.
2. Exact-repeat hit throughput at 1 and 8 concurrent clients: threads for GPTCache (its API is
   synchronous), concurrent HTTP clients for ours.
3. False hits and recall on the replay harness's development traces (../shared/eval, read only
   for this comparison, nothing is fitted on them) judged by its oracle: GPTCache with
   ``last_content`` and with ``concat_all_queries``, at several thresholds, against the proxy
   replayed by run_replay.py's own ``replay``. GPTCache has no tenants or sessions: one cache
   holds every conversation, so its recall is counted against what the tenant had been answered.

    .venv/bin/python benchmarks/bench_gptcache.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import concurrent.futures
import logging
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import Workload, closed_loop, post, rotated, seed_pool, serving, warm_up
from measurement import DEFAULT_MODEL_HOME, ROOT, add_pack_option, envelope, fmt, median_of, summary, write_json
from soak import ProxyProcess, free_port

from proxy.embedding.packs import load_embedder

EVAL = ROOT.parent / "shared" / "eval"
# GPTCache's threshold for the speed part, per pack: a paraphrase "hit" it does not serve would time
# a miss. USE scores the workload's paraphrases lower than e5 (at cosine 0.9 GPTCache served 3 % of
# them under USE, none in a --quick run); from 0.8 it serves about half
SPEED_COSINE = {"use-multilingual": 0.8}
Messages = list[dict[str, str]]


class PackEmbedding:
    """Our embedding pack as GPTCache's ``embedding_func``: one text in, one unit float32 row out."""

    def __init__(self, pack: str, model_home: Path, *, memo: bool = False) -> None:
        self._embedder = load_embedder(pack, model_home, auto_install=False)
        self.dimension = self._embedder.dim
        self._memo: dict[str, np.ndarray] | None = {} if memo else None
        self._lock = threading.Lock()  # one ONNX session; GPTCache calls it from every thread

    def to_embeddings(self, data: str, **_: Any) -> np.ndarray:
        if self._memo is not None and data in self._memo:
            return self._memo[data]
        with self._lock:
            row = self._embedder.embed([data])[0]
        if self._memo is not None:
            self._memo[data] = row
        return row


def gptcache_instance(
    embedding: PackEmbedding, data_dir: Path, *, pre: str, cosine: float, capacity: int = 20_000, context_len: int = 10
) -> Any:
    from gptcache import Cache, Config
    from gptcache.manager import manager_factory
    from gptcache.processor.pre import concat_all_queries, last_content
    from gptcache.similarity_evaluation import SearchDistanceEvaluation

    for numpy_int in (np.int64, np.uint64, np.int32):
        sqlite3.register_adapter(numpy_int, int)
    manager = manager_factory(
        "sqlite,hnswlib",
        data_dir=str(data_dir),
        vector_params={"dimension": embedding.dimension, "max_elements": capacity},
        eviction_params={"max_size": capacity},
    )
    sentinel = np.random.default_rng(0).standard_normal(embedding.dimension).astype(np.float32)
    manager.save("sentinel", "sentinel", sentinel / np.linalg.norm(sentinel))
    cache = Cache()
    cache.init(
        pre_embedding_func={"last_content": last_content, "concat_all_queries": concat_all_queries}[pre],
        embedding_func=embedding.to_embeddings,
        data_manager=manager,
        similarity_evaluation=SearchDistanceEvaluation(),
        config=Config(similarity_threshold=(cosine + 1) / 2, context_len=context_len),
    )
    return cache


def gptcache_ask(cache: Any, messages: Messages, answer: Callable[[], str]) -> tuple[str, bool]:
    """(the answer, whether it came from the cache) through GPTCache's ``adapt``."""
    from gptcache.adapter.adapter import adapt

    asked: list[bool] = []

    def llm(*_: Any, **__: Any) -> str:
        asked.append(True)
        return answer()

    def save(data: str, update: Callable[[str], None], *_: Any, **__: Any) -> str:
        update(data)
        return data

    out = adapt(llm, lambda data: data, save, messages=messages, cache_obj=cache)
    return str(out), not asked


def user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


# --- 1 and 2: hit latency and throughput -----------------------------------------------------


def gptcache_latency(cache: Any, mode: str, work: Workload, n: int) -> dict[str, float]:
    probes = work.probes(mode, n)
    for p in probes:
        gptcache_ask(cache, user(p.seed or p.ask), lambda: "an answer")
    times, hits = [], 0
    for p in probes:
        t0 = time.perf_counter()
        _, hit = gptcache_ask(cache, user(p.ask), lambda: "an answer")
        ms = (time.perf_counter() - t0) * 1000
        hits += hit
        if hit:
            times.append(ms)
    return {**summary(times), "hit_share": hits / n}


async def ours_latency(
    s: aiohttp.ClientSession, url: str, mode: str, work: Workload, n: int, tag: str
) -> dict[str, float]:
    probes = work.probes(mode, n)
    for i, p in enumerate(probes):
        await post(s, url, p.seed or p.ask, f"{tag}-{i}")
    timed = [await post(s, url, p.ask, f"{tag}-{i}") for i, p in enumerate(probes)]
    return {**summary([ms for ms, st in timed if st == "hit"]), "hit_share": sum(st == "hit" for _, st in timed) / n}


def gptcache_throughput(cache: Any, texts: Sequence[str], threads: int, seconds: float) -> dict[str, float]:
    deadline = time.perf_counter() + seconds
    counts = collections.Counter[str]()
    lock = threading.Lock()

    def client(c: int) -> None:
        k = c
        while time.perf_counter() < deadline:
            try:
                _, hit = gptcache_ask(cache, user(texts[k % len(texts)]), lambda: "an answer")
                outcome = "hit" if hit else "miss"
            except Exception:  # counted, not raised: GPTCache's parts are not all thread-safe
                outcome = "error"
            with lock:
                counts[outcome] += 1
            k += threads

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(client, range(threads)))
    elapsed = time.perf_counter() - t0
    total = max(1, counts.total())
    return {"requests_per_s": counts["hit"] / elapsed, "hit_share": counts["hit"] / total, "errors": counts["error"]}


async def speed(args: argparse.Namespace, embedding: PackEmbedding, tmp: Path) -> dict[str, Any]:
    cache = gptcache_instance(embedding, tmp / "speed", pre="last_content", cosine=args.speed_cosine)
    work = Workload(args.seed)
    rows: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    tput: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        serving(args.upstream_ms, args.pack, args.model_home) as target,
        aiohttp.ClientSession(timeout=timeout) as s,
    ):
        await warm_up(s, target)
        gptcache_latency(cache, "hit_exact", work, 3)
        cells = [(side, mode) for side in ("gptcache", "ours") for mode in ("hit_exact", "hit_paraphrase")]
        for r in range(args.rounds):
            for side, mode in rotated(cells, r):
                if side == "gptcache":
                    row = await asyncio.to_thread(gptcache_latency, cache, mode, work, args.n)
                else:
                    row = await ours_latency(s, target.proxy, mode, work, args.n, f"r{r}-{mode}")
                rows[f"{side}/{mode}"].append(row)
            print(f"speed round {r + 1}/{args.rounds}", file=sys.stderr)
        pool = await seed_pool(s, target.proxy)
        texts = [text for _, text in pool]
        for text in texts:
            gptcache_ask(cache, user(text), lambda: "an answer")
        levels = [(side, c) for side in ("gptcache", "ours") for c in args.clients]
        for r in range(args.rounds):
            for side, c in rotated(levels, r):
                if side == "gptcache":
                    row = await asyncio.to_thread(gptcache_throughput, cache, texts, c, args.seconds)
                else:
                    row = await closed_loop(s, target.proxy, pool, c, args.seconds)
                tput[f"{side}/{c}"].append(row)
    latency = {
        key: {stat: median_of(rs, stat) for stat in ("p50", "p95", "p99", "hit_share")} | {"rounds": rs}
        for key, rs in rows.items()
    }
    throughput = {key: {"requests_per_s": median_of(rs, "requests_per_s"), "rounds": rs} for key, rs in tput.items()}
    ratios = {
        mode: latency[f"ours/{mode}"]["p50"] / latency[f"gptcache/{mode}"]["p50"]
        for mode in ("hit_exact", "hit_paraphrase")
    }
    tratios = {
        str(c): throughput[f"ours/{c}"]["requests_per_s"] / max(1e-9, throughput[f"gptcache/{c}"]["requests_per_s"])
        for c in args.clients
    }
    return {
        "latency_ms": latency,
        "ours_over_gptcache_p50": ratios,
        "throughput": throughput,
        "ours_over_gptcache_throughput": tratios,
    }


# --- 3: false hits and recall on the dev traces ----------------------------------------------


def load_traces(path: Path, every: int) -> tuple[list[dict[str, Any]], dict[str, str], Any]:
    sys.path.insert(0, str(EVAL))
    import run_replay  # the harness's own loader: keys of identical prefixes merged, oracle answers

    convs, oracle = run_replay.load(str(path))
    return convs[::every], oracle, run_replay


def judge(res: collections.Counter[str], turn: dict[str, Any], hit: bool, text: str, tag: Any) -> None:
    found = tag.search(text)
    got = found.group(1) if found else None
    res["hit" if hit else "miss"] += 1
    if not hit:
        return
    if turn.get("expect") == "no_hit":
        res["forbidden_hits"] += 1
    elif got == turn["key"]:
        res["correct_hits"] += 1
    else:
        res["false_hits"] += 1


def gptcache_replay(cache: Any, convs: Sequence[dict[str, Any]], oracle: dict[str, str], rr: Any) -> dict[str, Any]:
    """run_replay.replay's loop, with GPTCache answering instead of the proxy."""
    res: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    seen_session: dict[str, set[str]] = collections.defaultdict(set)
    seen_tenant: dict[str, set[str]] = collections.defaultdict(set)
    for c in convs:
        hist: Messages = [{"role": "system", "content": c["system"]}]
        last: Messages | None = None
        for t in c["turns"]:
            msgs = last if t.get("regenerate") and last is not None else [*hist, {"role": "user", "content": t["user"]}]
            users = [m["content"] for m in msgs if m["role"] == "user"]
            r = res[c["category"]]
            r["requests"] += 1
            reusable = t.get("expect") != "no_hit"
            r["session_reusable"] += reusable and t["key"] in seen_session[c["session"]]
            r["tenant_reusable"] += reusable and t["key"] in seen_tenant[c["tenant"]]
            fresh = oracle.get(rr.prefix_hash(c["system"], users), "unknown conversation〔ref:UNKNOWN〕")
            text, hit = gptcache_ask(cache, msgs, lambda fresh=fresh: fresh)
            judge(r, t, hit, text, rr.TAG)
            seen_session[c["session"]].add(t["key"])
            seen_tenant[c["tenant"]].add(t["key"])
            last = msgs
            hist = [*msgs, {"role": "assistant", "content": text or "(empty)"}]
    return totals(res)


def totals(res: dict[str, collections.Counter[str]]) -> dict[str, Any]:
    tot: collections.Counter[str] = collections.Counter()
    for counts in res.values():
        tot.update(counts)
    pair_false = sum(res[c]["false_hits"] for c in res if "_pairs" in c)
    hits = tot["hit"]
    return {
        "requests": tot["requests"],
        "hits": hits,
        "correct_hits": tot["correct_hits"],
        "false_hits_conversations": tot["false_hits"] - pair_false,
        "false_hits_pairs": pair_false,
        "forbidden_hits": tot["forbidden_hits"],
        "precision": tot["correct_hits"] / hits if hits else float("nan"),
        "recall_vs_tenant_reusable": tot["correct_hits"] / max(1, tot["tenant_reusable"]),
        "recall_vs_session_reusable": tot["correct_hits"] / max(1, tot["session_reusable"]),
        "by_category": {cat: dict(counts) for cat, counts in sorted(res.items())},
    }


async def ours_replay(
    args: argparse.Namespace, convs: Sequence[dict[str, Any]], oracle: dict[str, str], rr: Any
) -> dict[str, Any]:
    """The proxy process in front of run_replay's oracle upstream, replayed by run_replay's own loop."""
    logging.getLogger("aiohttp").setLevel(logging.ERROR)
    stats: collections.Counter[str] = collections.Counter()
    runner = web.AppRunner(rr.oracle_app(oracle, stats), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    env = {
        **os.environ,
        "SMARTCACHE_LOG_LEVEL": "warning",
        "SMARTCACHE_MODEL_HOME": str(args.model_home),
        "SMARTCACHE_EMBEDDING_MODEL": args.pack,
    }
    work = Path(tempfile.mkdtemp(prefix="smartcache-vs-gptcache-"))
    proxy = ProxyProcess(f"http://127.0.0.1:{port}/v1", work / "d", env)
    try:
        await proxy.start()
        res, _samples = await rr.replay(proxy.url, convs, 0, "oracle")
    finally:
        proxy.stop()
        await runner.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    out = totals(res)
    out["half_hits"] = sum(r["half-hit"] for r in res.values())
    return out


async def quality(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    convs, oracle, rr = load_traces(args.traces, args.every)
    embedding = PackEmbedding(args.pack, args.model_home, memo=True)  # same texts in every configuration
    out: dict[str, Any] = {"conversations": len(convs), "gptcache": {}}
    for pre in ("last_content", "concat_all_queries"):
        for cosine in args.cosines:
            cache = gptcache_instance(embedding, tmp / f"q-{pre}-{cosine}", pre=pre, cosine=cosine)
            t0 = time.perf_counter()
            row = gptcache_replay(cache, convs, oracle, rr)
            print(f"gptcache {pre} cos>={cosine}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            out["gptcache"][f"{pre}@{cosine}"] = row
    t0 = time.perf_counter()
    out["smartcache"] = await ours_replay(args, convs, oracle, rr)
    print(f"smartcache replay: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


# --- output -----------------------------------------------------------------------------------


def print_tables(res: dict[str, Any], console: Console) -> None:
    sp = res.get("speed")
    if sp:
        t = Table(title="hit latency, ms (median of rounds); GPTCache in process, ours over HTTP")
        for col in ("hit", "side", "p50", "p95", "p99", "hit share", "ours / GPTCache p50"):
            t.add_column(col, justify="left" if col in ("hit", "side") else "right")
        for mode in ("hit_exact", "hit_paraphrase"):
            for side in ("gptcache", "ours"):
                row = sp["latency_ms"][f"{side}/{mode}"]
                ratio = fmt(sp["ours_over_gptcache_p50"][mode], 2) if side == "ours" else ""
                t.add_row(
                    mode, side, fmt(row["p50"]), fmt(row["p95"]), fmt(row["p99"]), fmt(row["hit_share"], 2), ratio
                )
        console.print(t)
        t = Table(title="exact-repeat hit throughput, hits/s (median of rounds)")
        for col in ("clients", "GPTCache (threads)", "ours (HTTP clients)", "ours / GPTCache"):
            t.add_column(col, justify="right")
        for c, ratio in sp["ours_over_gptcache_throughput"].items():
            g, o = sp["throughput"][f"gptcache/{c}"], sp["throughput"][f"ours/{c}"]
            t.add_row(c, fmt(g["requests_per_s"]), fmt(o["requests_per_s"]), fmt(ratio, 2))
        console.print(t)
    q = res.get("quality")
    if q:
        t = Table(title=f"dev traces ({q['conversations']} conversations), judged by run_replay's oracle")
        cols = ("system", "hits", "correct", "false (conv)", "false (pairs)", "forbidden", "precision")
        for col in (*cols, "recall vs tenant", "recall vs session"):
            t.add_column(col, justify="left" if col == "system" else "right")
        rows = [(f"GPTCache {k}", v) for k, v in q["gptcache"].items()] + [("SmartCache", q["smartcache"])]
        for name, v in rows:
            t.add_row(
                name,
                str(v["hits"]),
                str(v["correct_hits"]),
                str(v["false_hits_conversations"]),
                str(v["false_hits_pairs"]),
                str(v["forbidden_hits"]),
                fmt(v["precision"], 3),
                fmt(v["recall_vs_tenant_reusable"], 3),
                fmt(v["recall_vs_session_reusable"], 3),
            )
        console.print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="5 rounds x 5 hits, 1 s per level, every 24th conversation, 2 thresholds"
    )
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("-n", type=int, default=30, help="timed hits per side and mode per round")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--upstream-ms", type=float, default=20.0)
    ap.add_argument(
        "--speed-cosine",
        type=float,
        help="GPTCache's threshold in the speed part (default: where it serves the paraphrases under the pack)",
    )
    ap.add_argument("--cosines", type=float, nargs="+", default=[0.6, 0.9, 0.95, 0.98])
    ap.add_argument("--traces", type=Path, default=EVAL / "dev_traces.jsonl")
    ap.add_argument("--every", type=int, default=1, help="replay every k-th conversation")
    ap.add_argument("--only", choices=("speed", "quality"))
    add_pack_option(ap)
    ap.add_argument("--model-home", type=Path, default=DEFAULT_MODEL_HOME)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/bench_gptcache.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.n, args.seconds, args.every, args.cosines = 5, 5, 1.0, 24, [0.6, 0.95]
    if args.speed_cosine is None:
        args.speed_cosine = SPEED_COSINE.get(args.pack, 0.9)
    logging.getLogger("gptcache").setLevel(logging.ERROR)
    res: dict[str, Any] = {
        "gptcache_version": _gptcache_version(),
        "pack": args.pack,
        "speed_cosine": args.speed_cosine,
    }
    tmp = Path(tempfile.mkdtemp(prefix="bench-gptcache-"))
    # registered before any GPTCache instance: its own atexit flush writes into tmp, and atexit
    # runs last-registered first
    atexit.register(shutil.rmtree, tmp, True)
    failed = []
    for part in ("speed", "quality"):
        if args.only not in (None, part):
            continue
        try:
            if part == "speed":
                res[part] = asyncio.run(speed(args, PackEmbedding(args.pack, args.model_home), tmp))
            else:
                res[part] = asyncio.run(quality(args, tmp))
        except Exception as exc:  # the other part's figures are still worth writing
            print(f"{part} failed: {exc!r}", file=sys.stderr)
            failed.append(part)
            res[f"{part}_error"] = repr(exc)
    print_tables(res, Console(width=150))
    path = write_json(args.json, "bench_gptcache", envelope("bench_gptcache", sys.argv, res))
    print(f"wrote {path}")
    return 1 if failed else 0


def _gptcache_version() -> str:
    from importlib.metadata import version

    return version("gptcache")


if __name__ == "__main__":
    raise SystemExit(main())
