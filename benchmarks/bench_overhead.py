"""Proxy overhead against the direct upstream, per cache outcome, and hit throughput.

The proxy runs as its own process (``python -m proxy serve``, as in soak.py) in front of
soak_upstream.py's app on loopback with a fixed first-byte latency; this process is the client.
Modes, each with its own fresh sessions and texts so no mode feeds another:

- ``direct``: the same requests straight to the upstream (the floor);
- ``miss``: a question never asked before (the embedding runs, the upstream answers);
- ``hit_exact``: a question asked again verbatim in its session (the answer comes from the cache);
- ``hit_paraphrase``: a travel question asked again in other words in its session;
- ``half_hit``: a general question asked again in other words, in the policy's candidate zone
  (forwarded upstream with the context reused);
- ``bypass``: a request the cache must not answer (``logprobs``), forwarded as is;
- ``responses_miss``, ``responses_hit``: ``miss`` and ``hit_exact`` through ``POST /v1/responses``
  (seeded through it too), to the same proxy: what reading a Responses body as a chat request and
  writing a hit as a response object cost beside chat's;
- ``*_raced``: miss, paraphrase hit and half-hit again through a second proxy, beside the first,
  that races the upstream (``race_upstream: on``, docs/architecture.md, "Racing the upstream"): the upstream call
  goes out while the lookup runs. The first proxy runs with ``race_upstream: off``;
- ``hit_verified``: the paraphrase hit through a third proxy whose policy has the travel intent
  set ``verify_accept`` (``VERIFY_ACCEPT``), so the pair verifier reads each candidate before it
  is served. No shipped intent verifies; this row is what one that does would cost. The level is
  low enough for the paraphrases here to pass: it measures time, not precision;
- judged rows (``miss_slow``, ``hit_judged``, ``refused_slow``, ``miss_fast``, ``refused_fast``):
  a fourth proxy whose upstream judges the gray zone (benchmarks/overhead_judged.py): a reworded
  request the judge says yes to, and one it says no to, beside a plain miss, with the upstream
  slower and faster than the judge (``--judge-ms``).

Seeding requests (the first asking of a pair) are not timed. Every mode runs once per round, in
an order rotated each round; the table shows the median over rounds of each round's p50/p95/p99
and of the proxy's CPU time per request (user + system of the proxy process and its threads,
from /proc). A mode's latencies count only the requests whose ``x-cache-status`` was the one the
mode expects; the status column shows what all of them got. A second table says where a mode's
time went in the proxy: its ``/metrics`` stage seconds read before and after the mode, per
request. Then exact-repeat hits at 1, 8 and 64 concurrent clients for a few seconds each, also in
alternating rounds.

bench_proxy.py compares embedding packs with the proxy inside the client's own process; this one
keeps the proxy in a process of its own, so its CPU time is its own and the client's event loop
does not share its latency.

    .venv/bin/python benchmarks/bench_overhead.py [--quick] [--rounds 7] [-n 40] [--judge-ms 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import logging
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml
from aiohttp import web
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
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
from overhead_judged import (
    EXPECT_JUDGED,
    JUDGED_MODES,
    JudgedUpstream,
    JudgedWorkload,
    collate_judged,
    judge_round_trips,
    matches,
    print_judged,
    qualified,
)
from soak import ProxyProcess, free_port
from soak_upstream import Delays, Tally, soak_upstream

from tests.scripted_upstream import Script, scripted_app

PLAIN_MODES = ("direct", "miss", "hit_exact", "hit_paraphrase", "half_hit", "bypass")
RESPONSES_MODES = ("responses_miss", "responses_hit")
RACED_MODES = ("miss_raced", "hit_paraphrase_raced", "half_hit_raced")
VERIFIED_MODES = ("hit_verified",)
MODES = PLAIN_MODES + RESPONSES_MODES + RACED_MODES + VERIFIED_MODES + JUDGED_MODES
KEY = "sk-bench-overhead"
VERIFY_ACCEPT = 0.5
# a mode that asks another mode's texts of its own proxy (raced modes: their plain mode's)
ASKED_AS = {"hit_verified": "hit_paraphrase", "responses_miss": "miss", "responses_hit": "hit_exact"}
EXPECT = {
    "direct": "-",
    "miss": "miss",
    "hit_exact": "hit",
    "hit_paraphrase": "hit",
    "half_hit": "half-hit",
    "bypass": "bypass",
    "responses_miss": "miss",
    "responses_hit": "hit",
    "miss_raced": "miss",
    "hit_paraphrase_raced": "hit",
    "half_hit_raced": "half-hit",
    "hit_verified": "hit",
    **{mode: status or "any" for mode, (status, _) in EXPECT_JUDGED.items()},
}
CITIES = (
    "Lisbon",
    "Porto",
    "Madrid",
    "Seville",
    "Valencia",
    "Paris",
    "Lyon",
    "Marseille",
    "Rome",
    "Florence",
    "Venice",
    "Milan",
    "Naples",
    "Vienna",
    "Prague",
    "Budapest",
    "Krakow",
    "Berlin",
    "Munich",
    "Hamburg",
    "Amsterdam",
    "Brussels",
    "Copenhagen",
    "Stockholm",
    "Oslo",
    "Helsinki",
    "Dublin",
    "Edinburgh",
    "Athens",
    "Istanbul",
    "Kyoto",
    "Osaka",
    "Tokyo",
    "Seoul",
    "Bangkok",
    "Hanoi",
    "Singapore",
    "Sydney",
    "Toronto",
    "Chicago",
)
SIGHTS = (
    "main train station",
    "old town",
    "cathedral",
    "central market",
    "harbour",
    "city museum",
    "opera house",
    "botanical garden",
    "university",
    "airport",
    "royal palace",
    "football stadium",
    "congress centre",
    "main square",
    "zoo",
)
VERBS = ("reset", "change", "export", "delete", "share", "renew")
THINGS = (
    "password",
    "invoice",
    "account",
    "subscription",
    "profile",
    "payment method",
    "email address",
    "phone number",
    "shipping address",
    "notification settings",
    "privacy settings",
    "order history",
)
T = TypeVar("T")
APPS = ("mobile", "desktop", "web", "tablet", "banking", "shopping", "travel", "music")


@dataclass(frozen=True)
class Probe:
    """One timed request; ``seed`` is asked first in the same session, untimed; ``key``: the API
    key (the tenant) both go with, the bench's one key unless set."""

    ask: str
    seed: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    key: str | None = None


class Workload:
    """Fresh texts for every mode and round: repeated texts would let the signer's vector cache
    skip the embedding on the second round. A mode's k-th paraphrase pair is the k-th of its
    shuffled pool, so a raced mode asks its proxy what the plain mode asked the other."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self._counter = itertools.count(1)
        self._drawn: collections.Counter[str] = collections.Counter()
        self._hotels = [(c, s) for c in CITIES for s in SIGHTS]
        self._accounts = [(v, t, a) for v in VERBS for t in THINGS for a in APPS]
        rng.shuffle(self._hotels)
        rng.shuffle(self._accounts)

    def probes(self, mode: str, n: int) -> list[Probe]:
        return [self._probe(mode) for _ in range(n)]

    def _probe(self, mode: str) -> Probe:
        k = self._drawn[mode]
        self._drawn[mode] += 1
        mode = ASKED_AS.get(mode, mode.removesuffix("_raced"))
        i = next(self._counter)
        question = f"Question number {i}: what is {i} times {i + 7}?"
        if mode in ("direct", "miss"):
            return Probe(question)
        if mode == "hit_exact":
            return Probe(question, seed=question)
        if mode == "bypass":
            return Probe(question, extra={"logprobs": True})
        if mode == "hit_paraphrase":
            city, sight = self._hotels[k % len(self._hotels)]
            return Probe(
                f"Can you suggest a hotel close to the {sight} in {city}?",
                seed=f"Suggest a hotel near the {sight} in {city}",
            )
        verb, thing, app = self._accounts[k % len(self._accounts)]
        return Probe(
            f"How can I {verb} my {thing} in the {app} app?", seed=f"How do I {verb} my {thing} in the {app} app?"
        )


async def post(
    session: aiohttp.ClientSession,
    url: str,
    text: str,
    sid: str,
    extra: dict[str, Any] | None = None,
    key: str | None = None,
) -> tuple[float, str]:
    """(milliseconds to the whole answer, x-cache-status)."""
    ms, status, _ = await post_reasoned(session, url, text, sid, extra, key)
    return ms, status


async def post_reasoned(
    session: aiohttp.ClientSession,
    url: str,
    text: str,
    sid: str,
    extra: dict[str, Any] | None = None,
    key: str | None = None,
) -> tuple[float, str, str]:
    """(milliseconds to the whole answer, x-cache-status, x-cache-reason); a ``/responses`` URL is
    sent a Responses body, any other a chat one."""
    said: dict[str, Any] = (
        {"input": text} if url.endswith("/responses") else {"messages": [{"role": "user", "content": text}]}
    )
    body = {"model": "m", **said, **(extra or {})}
    headers = {"Authorization": f"Bearer {key or KEY}", "x-smartcache-session": sid}
    t0 = time.perf_counter()
    async with session.post(url, json=body, headers=headers) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}")
        status, reason = resp.headers.get("x-cache-status", "-"), resp.headers.get("x-cache-reason", "-")
    return (time.perf_counter() - t0) * 1000, status, reason


def proxy_of(mode: str) -> str:
    """Which of ``Serving``'s targets a mode asks."""
    if mode == "direct":
        return "direct"
    if mode in JUDGED_MODES:
        return "judged"
    return "raced" if mode.endswith("_raced") else "verified" if mode in VERIFIED_MODES else "proxy"


@dataclass
class ModeResult:
    rounds: list[dict[str, float]] = field(default_factory=list)
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)


async def run_mode(
    session: aiohttp.ClientSession,
    mode: str,
    probes: Sequence[Probe],
    urls: dict[str, str],
    pids: dict[str, int],
    tag: str,
    result: ModeResult,
    gap_s: float = 0.0,
) -> None:
    target = proxy_of(mode)
    url = urls[target]
    if mode in RESPONSES_MODES:
        url = url.replace("/chat/completions", "/responses")
    for i, probe in enumerate(probes):
        if probe.seed is not None:
            await post(session, url, probe.seed, f"{tag}-{i}", key=probe.key)
    pid = pids["proxy" if target == "direct" else target]  # direct: read, then reported as nan
    before = {} if target == "direct" else await stage_totals(session, url)
    cpu0 = process_cpu_seconds(pid)
    timed = []
    for i, p in enumerate(probes):
        if gap_s:
            await asyncio.sleep(gap_s)
        timed.append(await post_reasoned(session, url, p.ask, f"{tag}-{i}", p.extra, p.key))
    cpu = process_cpu_seconds(pid) - cpu0
    after = {} if target == "direct" else await stage_totals(session, url)
    if mode in JUDGED_MODES:  # the reason tells a judged answer from the rest
        result.statuses.update(f"{status}/{reason}" for _, status, reason in timed)
        matched = [ms for ms, status, reason in timed if matches(mode, status, reason)]
    else:
        result.statuses.update(status for _, status, _ in timed)
        matched = [ms for ms, status, _ in timed if status == EXPECT[mode]]
    row = summary(matched)
    row["cpu_ms_per_request"] = float("nan") if mode == "direct" else 1000 * cpu / len(probes)
    for stage, total in after.items():
        row[f"stage_{stage}"] = 1000 * (total - before.get(stage, 0.0)) / len(probes)
    result.rounds.append(row)


_STAGE_SUM = re.compile(r'^smartcache_stage_seconds_sum\{stage="(\w+)"\} (\S+)$', re.M)


async def stage_totals(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The proxy's own seconds so far in each request stage (its ``/metrics``): read before and
    after a mode, they say where the mode's time went, per request."""
    async with session.get(url.split("/v1/")[0] + "/metrics") as resp:
        text = await resp.text()
    return {stage: float(total) for stage, total in _STAGE_SUM.findall(text)}


async def closed_loop(
    session: aiohttp.ClientSession, url: str, texts: Sequence[tuple[str, str]], clients: int, seconds: float
) -> dict[str, float]:
    """``clients`` concurrent loops, each asking its sessions' seeded questions again until the time is up."""
    statuses: collections.Counter[str] = collections.Counter()
    deadline = time.perf_counter() + seconds

    async def client(c: int) -> None:
        k = c
        while time.perf_counter() < deadline:
            sid, text = texts[k % len(texts)]
            _, status = await post(session, url, text, sid)
            statuses[status] += 1
            k += clients

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    elapsed = time.perf_counter() - t0
    return {"requests_per_s": statuses["hit"] / elapsed, "hit_share": statuses["hit"] / max(1, statuses.total())}


@dataclass(frozen=True)
class Serving:
    direct: str  # the upstream's chat URL
    # chat URL and process of each proxy by name: "proxy", and "raced", "verified" and "judged" when asked for
    proxies: dict[str, tuple[str, int]]
    judge: str | None = None  # the judged proxy's upstream's chat URL, where its judge answers

    @property
    def proxy(self) -> str:
        return self.proxies["proxy"][0]

    @property
    def pid(self) -> int:
        return self.proxies["proxy"][1]


@contextlib.asynccontextmanager
async def serving(
    upstream_ms: float,
    pack: str,
    model_home: Path,
    env: dict[str, str] | None = None,
    *,
    raced: bool = False,
    verified: bool = False,
    judged: JudgedUpstream | None = None,
) -> AsyncIterator[Serving]:
    """The scripted upstream in this process and a proxy process in front of it, both on loopback;
    ``raced``: a second proxy beside it that races the upstream (the first never does);
    ``verified``: a third whose travel intent sets ``verify_accept``; ``judged``: a fourth in front
    of that upstream of its own, whose judge decides."""
    logging.getLogger("aiohttp").setLevel(logging.ERROR)
    delays = Delays(first_byte=(upstream_ms / 1000,) * 2)
    runner = web.AppRunner(soak_upstream(delays, Tally(), random.Random(0)), access_log=None)
    await runner.setup()
    up_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", up_port).start()
    judging_runner = web.AppRunner(scripted_app(judged.script if judged else Script()), access_log=None)
    await judging_runner.setup()
    judging_port = free_port()
    if judged is not None:
        await web.TCPSite(judging_runner, "127.0.0.1", judging_port).start()
    proxy_env = {
        **os.environ,
        "SMARTCACHE_REGENERATE_WINDOW": "0",  # a verbatim repeat is a hit here, not a regenerate
        "SMARTCACHE_LOG_LEVEL": "warning",
        "SMARTCACHE_MODEL_HOME": str(model_home),
        "SMARTCACHE_EMBEDDING_MODEL": pack,
        "SMARTCACHE_RACE_UPSTREAM": "off",
        **(env or {}),
    }
    work = Path(tempfile.mkdtemp(prefix="smartcache-bench-"))
    envs = {"proxy": proxy_env}
    if raced:
        envs["raced"] = {**proxy_env, "SMARTCACHE_RACE_UPSTREAM": "on"}
    if verified:
        policy = verifying_policy(proxy_env, work / "verifying.yaml")
        envs["verified"] = {**proxy_env, "SMARTCACHE_POLICY": str(policy)}
    up = f"http://127.0.0.1:{up_port}/v1"
    processes = {name: ProxyProcess(up, work / name, env) for name, env in envs.items()}
    if judged is not None:
        processes["judged"] = ProxyProcess(f"http://127.0.0.1:{judging_port}/v1", work / "judged", proxy_env)
    try:
        for process in processes.values():
            await process.start()
        yield Serving(
            f"{up}/chat/completions",
            {name: (process.url + "/v1/chat/completions", pid_of(process)) for name, process in processes.items()},
            f"http://127.0.0.1:{judging_port}/v1/chat/completions" if judged is not None else None,
        )
    finally:
        for process in processes.values():
            process.stop()
        await runner.cleanup()
        await judging_runner.cleanup()
        shutil.rmtree(work, ignore_errors=True)


def pid_of(proxy: ProxyProcess) -> int:
    assert proxy.proc is not None
    return proxy.proc.pid


def verifying_policy(env: dict[str, str], path: Path) -> Path:
    """The pack's shipped policy with the travel intent verifying at ``VERIFY_ACCEPT``."""
    from proxy.settings import shipped_policy

    data = yaml.safe_load(shipped_policy(env["SMARTCACHE_EMBEDDING_MODEL"]).read_text(encoding="utf-8"))
    data["intents"]["travel"]["verify_accept"] = VERIFY_ACCEPT
    data["version"] = f"{data['version']}-bench-verified"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


async def warm_up(s: aiohttp.ClientSession, target: Serving) -> None:
    """Loads the graph's kernels and opens the sockets before anything is timed; a verifying
    proxy also verifies a pair, which builds the verifier's graph."""
    for i in range(3):
        for url, _ in target.proxies.values():
            await post(s, url, f"warm-up question {i}", "warm")
        await post(s, target.direct, f"warm-up question {i}", "warm")
    if "verified" in target.proxies:
        url = target.proxies["verified"][0]
        await post(s, url, "Suggest a hotel near the zoo in Lima", "warm-verify")
        await post(s, url, "Can you suggest a hotel close to the zoo in Lima?", "warm-verify")
    if "judged" in target.proxies:  # its first request began the exam: nothing is timed before it passes
        url = target.proxies["judged"][0]
        await qualified(s, url.removesuffix("/v1/chat/completions"), "m")
        for i, (seed, ask) in enumerate(JUDGED_WARM_UP):
            await post(s, url, seed, f"warm-judge-{i}", key=f"sk-warm-judge-{i}")
            await post(s, url, ask, f"warm-judge-{i}", key=f"sk-warm-judge-{i}")


# a pair the judge reads (its no: the scripted upstream answers them otherwise), to build the
# verifier's graph and open the judge's connection
JUDGED_WARM_UP = (
    ("How do I rename my playlist in the radio app?", "How can I rename my playlist in the radio app?"),
    ("How do I hide my birthday in the chat app?", "Can you tell me how to hide my birthday in the chat app?"),
)


async def seed_pool(s: aiohttp.ClientSession, url: str, size: int = 64) -> list[tuple[str, str]]:
    """(session, question) pairs each asked once, so asking again is an exact-repeat hit."""
    pool = [(f"tp-{k}", f"Throughput question {k}: how many minutes are in {k} hours?") for k in range(size)]
    for sid, text in pool:
        await post(s, url, text, sid)
    return pool


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    modes = (
        PLAIN_MODES
        + RESPONSES_MODES
        + (RACED_MODES if args.race else ())
        + (VERIFIED_MODES if args.verified else ())
        + (JUDGED_MODES if args.judged else ())
    )
    results = {mode: ModeResult() for mode in modes}
    work_gen, judged_gen = Workload(args.seed), JudgedWorkload(args.seed)
    throughput: dict[int, list[dict[str, float]]] = {c: [] for c in args.clients}
    judge_rounds: list[dict[str, float]] = []  # the judge asked straight, once a round
    judged = (
        JudgedUpstream(Script(judge_delay=args.judge_ms / 1000), args.judged_slow_ms, args.judged_fast_ms)
        if args.judged
        else None
    )
    async with serving(
        args.upstream_ms, args.pack, args.model_home, raced=args.race, verified=args.verified, judged=judged
    ) as target:
        urls = {"direct": target.direct, **{name: url for name, (url, _) in target.proxies.items()}}
        pids = {name: pid for name, (_, pid) in target.proxies.items()}
        connector = aiohttp.TCPConnector(limit=max(args.clients) + 8)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as s:
            await warm_up(s, target)
            for r in range(args.rounds):
                for mode in rotated(modes, r):
                    if mode in JUDGED_MODES:
                        assert judged is not None
                        probes = judged_probes(judged, judged_gen, mode, args.n, f"r{r}")
                    else:
                        probes = work_gen.probes(mode, args.n)
                    await run_mode(s, mode, probes, urls, pids, f"r{r}-{mode}", results[mode], args.gap_ms / 1000)
                if target.judge is not None:
                    judge_rounds.append(await judge_round_trips(s, target.judge, args.n))
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
            pool = await seed_pool(s, target.proxy)
            for r in range(args.rounds):
                for clients in rotated(args.clients, r):
                    throughput[clients].append(await closed_loop(s, target.proxy, pool, clients, args.seconds))
    return collate(results, throughput, args, judge_rounds)


def judged_probes(upstream: JudgedUpstream, workload: JudgedWorkload, mode: str, n: int, tag: str) -> list[Probe]:
    """A judged mode's probes, its upstream set for them (their latency, the answers the judge approves)."""
    drawn = workload.probes(mode, n, tag)
    upstream.prepare(mode, drawn)
    return [Probe(p.ask, seed=p.seed, key=p.key) for p in drawn]


def rotated(items: Sequence[T], r: int) -> list[T]:
    """``items`` starting at position r: each round runs the modes in another order."""
    k = r % len(items)
    return [*items[k:], *items[:k]]


def collate(
    results: dict[str, ModeResult],
    throughput: dict[int, list[dict[str, float]]],
    args: argparse.Namespace,
    judge_rounds: Sequence[dict[str, float]] = (),
) -> dict[str, Any]:
    direct = results["direct"].rounds
    modes: dict[str, Any] = {}
    for mode, res in results.items():
        deltas = [row["p50"] - base["p50"] for row, base in zip(res.rounds, direct, strict=True)]
        stages = sorted({key for row in res.rounds for key in row if key.startswith("stage_")})
        modes[mode] = {
            "expected_status": EXPECT[mode],
            "statuses": dict(res.statuses),
            "median": {key: median_of(res.rounds, key) for key in ("p50", "p95", "p99", "cpu_ms_per_request")},
            # the proxy's time per request in each stage (its /metrics), median of rounds
            "stages_ms": {key.removeprefix("stage_"): median_of(res.rounds, key) for key in stages},
            "p50_over_direct_ms": over_direct(mode, deltas),
            "rounds": res.rounds,
        }
    extra: dict[str, Any] = {}
    if args.judged:
        extra["judged"] = collate_judged(
            modes,
            judge_rounds,
            judge_ms=args.judge_ms,
            deadline_ms=shipped_judge_deadline_ms(args.pack),
            slow_ms=args.judged_slow_ms,
            fast_ms=args.judged_fast_ms,
        )
    return {
        "upstream_ms": args.upstream_ms,
        "gap_ms": args.gap_ms,
        "pack": args.pack,
        "rounds": args.rounds,
        "requests_per_mode_per_round": args.n,
        "modes": modes,
        "hit_throughput": {
            str(c): {
                "requests_per_s": median_of(rows, "requests_per_s"),
                "hit_share": median_of(rows, "hit_share"),
                "rounds": rows,
            }
            for c, rows in throughput.items()
        },
        "throughput_seconds": args.seconds,
        **extra,
    }


def over_direct(mode: str, deltas: Sequence[float]) -> float:
    """The median over rounds of a mode's p50 less the direct row's; NaN for a judged mode, whose
    upstream is another, with latencies of its own."""
    if mode == "direct":
        return 0.0
    return float("nan") if mode in JUDGED_MODES else median_of([{"d": d} for d in deltas], "d")


def shipped_judge_deadline_ms(pack: str) -> float:
    """How long the shipped policy lets a raced forward wait for the verdict."""
    from proxy.settings import shipped_policy

    data = yaml.safe_load(shipped_policy(pack).read_text(encoding="utf-8"))
    return float(data["defaults"]["judge_deadline_ms"])


def print_tables(res: dict[str, Any], console: Console) -> None:
    table = Table(
        title=(
            f"proxy vs direct upstream ({res['upstream_ms']:.0f} ms scripted), {res['pack']}, median of "
            f"{res['rounds']} rounds x {res['requests_per_mode_per_round']} requests (ms)"
            + (f", {res['gap_ms']:.0f} ms between requests" if res.get("gap_ms") else "")
        )
    )
    for col in ("mode", "x-cache-status (all)", "p50", "p95", "p99", "p50 over direct", "proxy CPU ms/req"):
        table.add_column(col, justify="left" if col.startswith(("mode", "x-")) else "right")
    for mode, row in res["modes"].items():
        med = row["median"]
        table.add_row(
            mode,
            ",".join(f"{k}:{v}" for k, v in sorted(row["statuses"].items())),
            fmt(med["p50"]),
            fmt(med["p95"]),
            fmt(med["p99"]),
            "-"
            if row["p50_over_direct_ms"] != row["p50_over_direct_ms"] or mode == "direct"
            else f"{row['p50_over_direct_ms']:+.1f}",
            fmt(med["cpu_ms_per_request"]),
        )
    console.print(table)
    if "judged" in res:
        print_judged(res["judged"], console)
    print_stages(res, console)
    tp = Table(title=f"exact-repeat hit throughput, {res['throughput_seconds']:.0f} s per level, median of rounds")
    for col in ("clients", "hits/s", "hit share"):
        tp.add_column(col, justify="right")
    for clients, row in res["hit_throughput"].items():
        tp.add_row(clients, fmt(row["requests_per_s"]), fmt(row["hit_share"], 3))
    console.print(tp)


# the order a request meets them; "store" and "settle" come after its reply
STAGE_ORDER = ("parse", "sign", "embed", "index", "verify", "decide", "judge", "serve", "upstream", "settle", "store")


def print_stages(res: dict[str, Any], console: Console) -> None:
    rows = {mode: row.get("stages_ms", {}) for mode, row in res["modes"].items() if row.get("stages_ms")}
    seen = {stage for stages in rows.values() for stage in stages}
    if not rows:
        return
    columns = [s for s in STAGE_ORDER if s in seen] + sorted(seen - set(STAGE_ORDER))
    table = Table(title="the proxy's ms per request in each stage (its /metrics), median of rounds")
    table.add_column("mode")
    for stage in columns:
        table.add_column(stage, justify="right")
    for mode, stages in rows.items():
        table.add_row(mode, *(fmt(stages[s], 2) if s in stages else "-" for s in columns))
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="5 rounds x 12 requests, 2 s per throughput level")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("-n", type=int, default=40, help="timed requests per mode per round")
    ap.add_argument("--seconds", type=float, default=8.0, help="per throughput level per round")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--upstream-ms", type=float, default=20.0, help="the scripted upstream's fixed latency")
    add_pack_option(ap)
    ap.add_argument("--model-home", type=Path, default=DEFAULT_MODEL_HOME)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="a pause before each timed request, so that it is not also paying for the bookkeeping the "
        "proxy does after its last reply (a client's think time); 0: back to back",
    )
    ap.add_argument("--no-race", dest="race", action="store_false", help="skip the second, racing proxy")
    ap.add_argument("--no-verified", dest="verified", action="store_false", help="skip the third, verifying proxy")
    ap.add_argument(
        "--no-judged", dest="judged", action="store_false", help="skip the fourth proxy and its judged rows"
    )
    ap.add_argument("--judge-ms", type=float, default=20.0, help="the judged proxy's judge: its latency")
    ap.add_argument(
        "--judged-slow-ms",
        type=float,
        default=80.0,
        help="the judged proxy's upstream where it is slower than the judge",
    )
    ap.add_argument(
        "--judged-fast-ms",
        type=float,
        default=5.0,
        help="the judged proxy's upstream where it is faster than the judge",
    )
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/bench_overhead.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.n, args.seconds = 5, 12, 2.0
    res = asyncio.run(measure(args))
    print_tables(res, Console(width=140))
    path = write_json(args.json, "bench_overhead", envelope("bench_overhead", sys.argv, res))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
