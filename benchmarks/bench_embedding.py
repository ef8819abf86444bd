"""Offline embedding packs side by side: speed, batched and unbatched, and quality on pairs.

For each pack: install time (a fresh data dir converts every pack), single-query latency
(p50/p99) and embeddings/s one text per call, embeddings/s at batch sizes 8 and 32, the
proxy's micro-batching (16 concurrent callers, one text each, through BatchingEmbedder:
embeddings/s, per-caller p50/p99 and texts per model call), and
ROC AUC of cosine similarity on labelled pairs from /work/shared/data: English QQP duplicates
(gptcache_similar_qqp) and Chinese adversarial paraphrases (pawsx_zh).

    .venv/bin/python benchmarks/bench_embedding.py                  # all packs, 300 pairs each
    .venv/bin/python benchmarks/bench_embedding.py --packs use-multilingual --pairs 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from proxy.embedding.backends import SyncEmbedder
from proxy.embedding.batching import BatchingEmbedder
from proxy.embedding.packs import PACKS, install_pack, load_embedder

DATA = Path(os.environ.get("SMARTCACHE_DATA", "/work/shared/data"))
Pair = tuple[str, str, int]


@dataclass(frozen=True)
class PackResult:
    name: str
    dim: int
    install_s: float
    single_ms: tuple[float, float]  # p50, p99
    micro: tuple[float, float, float, float]  # emb/s, caller p50 ms, caller p99 ms, texts per model call
    per_second: dict[int, float]  # batch size -> embeddings/s
    auc: dict[str, float]


def qqp_pairs(count: int, rng: random.Random) -> list[Pair]:
    rows: list[dict[str, object]] = []
    for part in sorted((DATA / "gptcache_similar_qqp").glob("similiar_qqp_full.part*.jsonl")):
        with part.open(encoding="utf-8") as lines:
            rows.extend(json.loads(line) for line in lines if line.strip())
    return [(str(r["text_a"]), str(r["text_b"]), int(str(r["label"]))) for r in rng.sample(rows, count)]


def pawsx_pairs(count: int, rng: random.Random) -> list[Pair]:
    rows = []
    with (DATA / "pawsx_zh" / "PAWSX.valid.tsv").open(encoding="utf-8") as lines:
        for line in lines:
            a, b, label = line.rstrip("\n").split("\t")
            rows.append((a, b, int(label)))
    return rng.sample(rows, count)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Probability a positive outscores a negative (ties count half): the Mann-Whitney U."""
    order = scores.argsort(kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores):  # average ranks of ties
        tied = scores == value
        ranks[tied] = ranks[tied].mean()
    positives = int(labels.sum())
    negatives = len(labels) - positives
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def embed_in_batches(embedder: SyncEmbedder, texts: Sequence[str], size: int) -> np.ndarray:
    return np.concatenate([embedder.embed(texts[i : i + size]) for i in range(0, len(texts), size)])


def pair_auc(embedder: SyncEmbedder, pairs: Sequence[Pair]) -> float:
    left = embed_in_batches(embedder, [a for a, _, _ in pairs], 32)
    right = embed_in_batches(embedder, [b for _, b, _ in pairs], 32)
    return roc_auc((left * right).sum(axis=1), np.array([label for _, _, label in pairs]))


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def single_query(embedder: SyncEmbedder, texts: Sequence[str]) -> tuple[tuple[float, float], float]:
    """(p50, p99) milliseconds of one-text calls, and embeddings/s at one text per call."""
    latencies = np.array([timed(partial(embedder.embed, [text])) for text in texts])
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000
    return (float(p50), float(p99)), len(texts) / float(latencies.sum())


def batched(embedder: SyncEmbedder, texts: Sequence[str], size: int) -> float:
    return len(texts) / timed(lambda: embed_in_batches(embedder, texts, size))


def micro_batched(embedder: SyncEmbedder, texts: Sequence[str], callers: int = 16) -> tuple[float, float, float, float]:
    """Concurrent callers, one text per request, as the proxy's requests arrive."""

    async def run() -> tuple[float, float, float, float]:
        batching = BatchingEmbedder(embedder, max_batch=32, max_wait_s=0.002)
        latencies: list[float] = []

        async def caller(chunk: Sequence[str]) -> None:
            for text in chunk:
                start = time.perf_counter()
                await batching.embed([text])
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(caller(texts[i::callers]) for i in range(callers)))
        total = time.perf_counter() - start
        calls = batching.model_calls
        await batching.close()
        p50, p99 = np.percentile(latencies, [50, 99]) * 1000
        return len(texts) / total, float(p50), float(p99), len(texts) / calls

    return asyncio.run(run())


def bench_pack(
    name: str, data_dir: Path, threads: int, texts: Sequence[str], pairs: dict[str, list[Pair]]
) -> PackResult:
    install_s = timed(lambda: install_pack(name, data_dir, progress=False))
    embedder = load_embedder(name, data_dir, threads=threads, auto_install=False)
    embed_in_batches(embedder, texts[:64], 32)  # warm-up: session arenas, caches
    single_ms, one_per_call = single_query(embedder, texts)
    per_second = {1: one_per_call} | {size: batched(embedder, texts, size) for size in (8, 32)}
    micro = micro_batched(embedder, texts)
    auc = {corpus: pair_auc(embedder, rows) for corpus, rows in pairs.items()}
    return PackResult(name, embedder.dim, install_s, single_ms, micro, per_second, auc)


def table(results: Sequence[PackResult], threads: int, n_texts: int, n_pairs: int) -> str:
    load = os.getloadavg()[0]  # other work on a shared machine skews every number here
    header = (
        f"threads={threads}, {n_texts} query texts (en+zh), {n_pairs} pairs per corpus, "
        f"1-min load average at the end {load:.1f} on {os.cpu_count()} CPUs\n"
        "| pack | dim | install s | 1 query p50 ms | p99 ms | emb/s batch 1 | batch 8 | batch 32 "
        "| micro-batched emb/s | caller p50 ms | p99 ms | texts/call "
        "| AUC QQP en | AUC PAWS-X zh |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [
        f"| {r.name} | {r.dim} | {r.install_s:.1f} | {r.single_ms[0]:.2f} | {r.single_ms[1]:.2f} "
        f"| {r.per_second[1]:.0f} | {r.per_second[8]:.0f} | {r.per_second[32]:.0f} "
        f"| {r.micro[0]:.0f} | {r.micro[1]:.2f} | {r.micro[2]:.2f} | {r.micro[3]:.1f} "
        f"| {r.auc['qqp']:.3f} | {r.auc['pawsx']:.3f} |"
        for r in results
    ]
    return "\n".join([header, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packs", nargs="+", default=list(PACKS), choices=list(PACKS))
    parser.add_argument("--pairs", type=int, default=300, help="labelled pairs per corpus")
    parser.add_argument("--queries", type=int, default=200, help="texts for the latency runs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, help="reuse installed packs here (default: fresh temp dir)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    rng = random.Random(args.seed)
    pairs = {"qqp": qqp_pairs(args.pairs, rng), "pawsx": pawsx_pairs(args.pairs, rng)}
    half = args.queries // 2
    texts = [a for a, _, _ in pairs["qqp"][:half]] + [a for a, _, _ in pairs["pawsx"][: args.queries - half]]
    rng.shuffle(texts)

    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="smartcache-bench-"))
    try:
        results = [bench_pack(name, data_dir, args.threads, texts, pairs) for name in args.packs]
    finally:
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(table(results, args.threads, len(texts), args.pairs))


if __name__ == "__main__":
    main()
