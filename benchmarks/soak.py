"""Soak: the proxy under load, upstream faults, bad input and kill -9, as one bounded run.

    .venv/bin/python benchmarks/soak.py --quick        # <= 5 minutes
    .venv/bin/python benchmarks/soak.py                # the full run (200 clients x 60 s, 10k idle, 20 kills)

The proxy runs as its own process (``python -m proxy serve``) in front of benchmarks/soak_upstream.py
on loopback; this process is the load generator. Phases:

1. load: N clients (half streaming; 60 % of questions repeated across a tenant's sessions, so
   hits, misses and half-hits mix) for T seconds; latency per cache status, errors, the proxy's RSS
   and open file descriptors sampled every 5 s; every answer must carry the asking key's marker
   (another key's answer is a cross-tenant hit). Each client sends its next request when its last
   is answered (a closed loop: with many clients the queue sets the latency), or with ``--rate R``
   requests arrive at R a second whatever is pending (an open loop, Poisson arrivals spread over
   the N clients' sessions, latency counted from each arrival's due time): the rate a deployment
   sustains. Overhead is latency less what the upstream meant to take (its ``x-soak-upstream-ms``,
   relayed on misses and half-hits; a hit's is its latency).
2. faults: each upstream fault, streamed and not: the client gets a clean error (or the stream
   ends with an error event), the same request again is not served from the cache, and the proxy
   stays healthy.
3. idle: N idle client connections held open (half never send a byte, half send one request
   and keep the connection): the proxy's RSS and descriptors while held, a request's latency
   beside them, and how many the proxy has closed once ``keepalive_timeout`` has passed.
4. fuzz: tests/e2e/test_bad_input_fuzz.py with ``SMARTCACHE_FUZZ_EXAMPLES`` generated requests.
5. kill -9: writes under load, the proxy killed at a random moment, restarted; every record that
   was ready is still ready, and ``PRAGMA integrity_check`` passes.

The last line is machine-readable: ``errors=N ready_records_lost=N cross_tenant_hits=N ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from measurement import process_cpu_seconds
from soak_upstream import FAULTS, PLANNED_HEADER

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("load", "faults", "idle", "fuzz", "kill")
KEYS = [f"sk-soak-tenant-{i}" for i in range(5)]
FAQ = [
    f"How do I {verb} my {thing}?"
    for verb in ("reset", "change", "export", "delete", "share", "renew")
    for thing in ("password", "invoice", "account", "subscription", "profile")
]


@dataclass(frozen=True)
class Plan:
    clients: int
    seconds: float
    kill_rounds: int
    fuzz_examples: int
    idle_connections: int
    rate: float = 0.0  # requests/s arriving in an open loop; 0: each client waits for its answer


@dataclass
class Report:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    overheads: dict[str, list[float]] = field(default_factory=dict)  # latency less the upstream's planned time
    errors: int = 0
    load_cpu_s: dict[str, float] = field(default_factory=dict)  # CPU each process used during the load phase
    error_samples: list[str] = field(default_factory=list)
    cross_tenant_hits: int = 0
    rss_mb: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    faults_survived: int = 0
    faults_tried: int = 0
    fault_failures: list[str] = field(default_factory=list)
    idle_held: int = 0
    idle_left_open: int = 0  # of the proxy's descriptors, once keepalive_timeout has passed
    idle_eof: int = 0  # client sockets that saw the proxy hang up
    idle_rss_mb: tuple[float, float, float] = (0.0, 0.0, 0.0)  # before, held, after the timeout
    idle_fds: tuple[int, int, int] = (0, 0, 0)
    idle_probe_ms: tuple[float, float] = (0.0, 0.0)  # a miss's latency without, then beside them
    fuzz_cases: int = 0
    server_errors_on_bad_input: int = 0
    kill_rounds: int = 0
    ready_records_lost: int = 0
    integrity_failures: int = 0

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what[:200])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the scripted upstream exited with {proc.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return
    raise RuntimeError(f"the scripted upstream did not listen on {port} within {timeout} s")


class ProxyProcess:
    def __init__(self, upstream: str, data_dir: Path, env: dict[str, str]) -> None:
        self.upstream, self.data_dir, self.env = upstream, data_dir, env
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"proxy-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 180) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--upstream",
            self.upstream,
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--ready-after",
            "0",
        ]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"proxy exited with {self.proc.returncode}; see {self.log}")
                try:
                    async with session.get(self.url + "/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.3)
        raise RuntimeError(f"proxy did not become healthy in {timeout} s; see {self.log}")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()

    def rss_mb(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def fd_count(self) -> int:
        assert self.proc is not None
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


@dataclass(frozen=True)
class Answer:
    status: int
    cache: str  # x-cache-status
    text: str  # the answer, or the error body
    upstream_ms: float = 0.0  # what the upstream meant to take, where its header came through


async def ask(
    session: aiohttp.ClientSession, url: str, key: str, sid: str, text: str, *, stream: bool, timeout: float = 60
) -> Answer:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}
    headers = {"authorization": f"Bearer {key}", "x-smartcache-session": sid}
    async with session.post(
        url + "/v1/chat/completions", json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as r:
        raw = await r.text()
        cache = r.headers.get("x-cache-status", "")
        upstream_ms = float(r.headers.get(PLANNED_HEADER, 0.0))
        if r.status != 200 or not stream:
            if r.status == 200:
                return Answer(r.status, cache, json.loads(raw)["choices"][0]["message"]["content"], upstream_ms)
            return Answer(r.status, cache, raw)
        parts, failed = [], ""
        for line in raw.splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                event = json.loads(line[6:])
            except ValueError:
                failed = failed or json.dumps({"malformed_event": line[:80]})
                continue
            if "error" in event:
                failed = json.dumps(event["error"])
            else:
                parts += [c["delta"].get("content") or "" for c in event.get("choices", [])]
        return Answer(599 if failed else 200, cache, failed or "".join(parts), upstream_ms)


async def load_phase(proxy: ProxyProcess, plan: Plan, report: Report, rng: random.Random) -> None:
    deadline = time.monotonic() + plan.seconds
    connector = aiohttp.TCPConnector(limit=0)
    turns = [0] * plan.clients

    async def request(n: int, session: aiohttp.ClientSession, due: float) -> None:
        """Client n's next turn, timed from ``due`` (when it was meant to go out)."""
        key = KEYS[n % len(KEYS)]
        turns[n] += 1
        turn = turns[n]
        repeat = rng.random() < 0.6
        text = rng.choice(FAQ) if repeat else f"Client {n} asks question number {turn}: what is {rng.random():.6f}?"
        sid = f"c{n}-t{turn}" if repeat else f"c{n}"
        try:
            got = await ask(session, proxy.url, key, sid, text, stream=n % 2 == 0)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            report.error(f"{type(exc).__name__}: {exc}")
            return
        if got.status != 200:
            report.error(f"{got.status} {got.text}")
            return
        latency = (time.perf_counter() - due) * 1000
        report.latencies.setdefault(got.cache, []).append(latency)
        report.overheads.setdefault(got.cache, []).append(latency - got.upstream_ms)
        if f"[for:{key}]" not in got.text:
            report.cross_tenant_hits += 1

    async def client(n: int, session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            await request(n, session, time.perf_counter())

    async def arrivals(session: aiohttp.ClientSession) -> None:
        pending: set[asyncio.Task[None]] = set()
        due, n = time.perf_counter(), 0
        while time.monotonic() < deadline:
            task = asyncio.create_task(request(n % plan.clients, session, due))
            pending.add(task)
            task.add_done_callback(pending.discard)
            n += 1
            due += rng.expovariate(plan.rate)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await asyncio.gather(*pending)

    def load(session: aiohttp.ClientSession) -> list[Any]:
        if plan.rate:
            return [arrivals(session)]
        return [client(n, session) for n in range(plan.clients)]

    async def sampler() -> None:
        while time.monotonic() < deadline:
            report.rss_mb.append(proxy.rss_mb())
            report.fds.append(proxy.fd_count())
            await asyncio.sleep(5)

    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(sampler(), *load(session))
    report.rss_mb.append(proxy.rss_mb())
    report.fds.append(proxy.fd_count())


async def fault_phase(proxy: ProxyProcess, report: Report) -> None:
    async with aiohttp.ClientSession() as session:
        for fault in FAULTS:
            for stream in (False, True):
                if fault == "badsse" and not stream:
                    continue  # an SSE fault only
                report.faults_tried += 1
                text = f"Tell me about faults, case {fault} {stream} {time.time_ns()} [fault:{fault}]"
                try:
                    status = (await ask(session, proxy.url, KEYS[0], f"fault-{fault}", text, stream=stream)).status
                    again = await ask(session, proxy.url, KEYS[0], f"fault-{fault}", text, stream=stream)
                    async with session.get(proxy.url + "/healthz") as health:
                        healthy = health.status == 200
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    report.fault_failures.append(f"{fault}/{'stream' if stream else 'json'}: {exc!r}"[:200])
                    continue
                cleaned = status >= 400 and again.cache != "hit" and healthy
                if cleaned:
                    report.faults_survived += 1
                else:
                    report.fault_failures.append(f"{fault}/{'stream' if stream else 'json'}: {status}, {again.cache}")


async def probe(proxy: ProxyProcess) -> float:
    async with aiohttp.ClientSession() as session:
        began = time.perf_counter()
        text = f"What is an idle connection, {time.time_ns()}?"
        await ask(session, proxy.url, KEYS[0], "idle-probe", text, stream=False)
        return (time.perf_counter() - began) * 1000


async def idle_phase(proxy: ProxyProcess, plan: Plan, report: Report, keepalive: float) -> None:
    await probe(proxy)  # the first request of a fresh proxy warms its caches: not a fair baseline
    report.idle_probe_ms = (await probe(proxy), 0.0)
    before = (proxy.rss_mb(), proxy.fd_count())
    port = int(proxy.url.rsplit(":", 1)[1])
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    # batches under the listen backlog (128): past it the kernel drops handshakes, and a client
    # that then sends nothing holds a socket the proxy never accepted
    for start in range(0, plan.idle_connections, 100):
        batch = range(start, min(start + 100, plan.idle_connections))
        held += await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in batch))

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: soak\r\n\r\n")
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        length = next(int(line.split(":", 1)[1]) for line in head.splitlines() if line.startswith("content-length:"))
        await reader.readexactly(length)  # the connection stays open, idle, after its answer

    used = held[: len(held) // 2]
    for start in range(0, len(used), 500):
        await asyncio.gather(*(once(r, w) for r, w in used[start : start + 500]))
    # a connect returns once the kernel has the handshake; the proxy accepts from its backlog as
    # it gets the CPU, so count what it holds rather than what the client opened
    held_at = (proxy.rss_mb(), proxy.fd_count())
    report.idle_held = held_at[1] - before[1]
    report.idle_probe_ms = (report.idle_probe_ms[0], await probe(proxy))
    await asyncio.sleep(keepalive + 3)

    async def closed(reader: asyncio.StreamReader) -> bool:
        try:
            return await asyncio.wait_for(reader.read(), 5) == b""
        except (TimeoutError, ConnectionError):
            return False

    after = (proxy.rss_mb(), proxy.fd_count())  # before the client lets go of anything
    report.idle_left_open = max(0, after[1] - before[1])
    report.idle_eof = sum(await asyncio.gather(*(closed(r) for r, _ in held)))
    for _, writer in held:
        writer.close()
    report.idle_rss_mb = (before[0], held_at[0], after[0])
    report.idle_fds = (before[1], held_at[1], after[1])


def fuzz_phase(plan: Plan, report: Report, env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/e2e/test_bad_input_fuzz.py"]
    if plan.fuzz_examples == 0:
        cmd += ["-k", "parser_and_identity"]  # the pure level only
    done = subprocess.run(
        cmd, cwd=ROOT, env={**env, "SMARTCACHE_FUZZ_EXAMPLES": str(plan.fuzz_examples)}, capture_output=True, text=True
    )
    report.fuzz_cases = 10_000 + plan.fuzz_examples  # the parser level runs 10,000 of its own
    report.server_errors_on_bad_input = 0 if done.returncode == 0 else 1
    if done.returncode != 0:
        print(done.stdout[-3000:], file=sys.stderr)


def ready_ids(db: Path) -> set[str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return {row[0] for row in conn.execute("SELECT cache_id FROM records WHERE state = 'ready'")}


async def kill_writer(
    proxy: ProxyProcess, session: aiohttp.ClientSession, rng: random.Random, n: int, round_: int, stop: float
) -> None:
    i = 0
    while time.monotonic() < stop:
        i += 1
        text = f"Round {round_} writer {n} question {i}: describe item {rng.random():.8f}"
        try:
            await ask(session, proxy.url, KEYS[n % len(KEYS)], f"k{round_}-{n}", text, stream=n % 2 == 1)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return  # the kill may land mid-request


async def kill_phase(proxy: ProxyProcess, plan: Plan, report: Report, rng: random.Random) -> None:
    db = proxy.data_dir / "cache.sqlite3"
    for round_ in range(plan.kill_rounds):
        await proxy.start()
        stop = time.monotonic() + rng.uniform(1.0, 4.0)

        async with aiohttp.ClientSession() as session:
            writers = asyncio.gather(
                *(kill_writer(proxy, session, rng, n, round_, stop) for n in range(8)), return_exceptions=True
            )
            await asyncio.sleep(max(0.0, stop - time.monotonic() - 0.2))
            before = ready_ids(db) if db.exists() else set()
            proxy.kill9()
            await writers
        await proxy.start()
        after = ready_ids(db)
        report.ready_records_lost += len(before - after)
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            if conn.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
                report.integrity_failures += 1
        proxy.stop()
        report.kill_rounds += 1


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def print_report(plan: Plan, report: Report) -> None:
    arrivals = f"arriving at {plan.rate:g}/s over " if plan.rate else ""
    print(
        f"\nsoak: {arrivals}{plan.clients} clients x {plan.seconds:.0f} s, {plan.kill_rounds} kill -9 rounds, "
        f"{plan.fuzz_examples} HTTP fuzz cases, {plan.idle_connections} idle connections"
    )
    print(f"{'status':10} {'requests':>9} {'p50 ms':>9} {'p99 ms':>9} {'p50 overhead ms':>16}")
    for status, values in sorted(report.latencies.items()):
        over = statistics.median(report.overheads.get(status) or [float("nan")])
        p50, p99 = statistics.median(values), pct(values, 0.99)
        print(f"{status or '-':10} {len(values):9d} {p50:9.1f} {p99:9.1f} {over:16.1f}")
    total = sum(len(v) for v in report.latencies.values())
    print(f"requests {total}, errors {report.errors} {report.error_samples}")
    if total:
        cores = os.cpu_count() or 1
        print(
            f"{total / plan.seconds:.0f} requests/s; of the {cores * plan.seconds:.0f} CPU-seconds these {cores} cores "
            "had, " + ", ".join(f"{who} used {cpu:.0f}" for who, cpu in report.load_cpu_s.items())
        )
    if report.rss_mb:
        print(
            f"RSS MB start {report.rss_mb[0]:.0f} peak {max(report.rss_mb):.0f} end {report.rss_mb[-1]:.0f}; "
            f"fds start {report.fds[0]} peak {max(report.fds)} end {report.fds[-1]}"
        )
    print(f"faults survived {report.faults_survived}/{report.faults_tried} {report.fault_failures}")
    rss, fds = report.idle_rss_mb, report.idle_fds
    print(
        f"idle connections {report.idle_held} held by the proxy: "
        f"RSS MB {rss[0]:.0f} -> {rss[1]:.0f} held -> {rss[2]:.0f} after; "
        f"fds {fds[0]} -> {fds[1]} -> {fds[2]}; a miss {report.idle_probe_ms[0]:.0f} ms alone, "
        f"{report.idle_probe_ms[1]:.0f} ms beside them; "
        f"still open on the proxy after keepalive_timeout {report.idle_left_open}, "
        f"client sockets that saw it hang up {report.idle_eof}"
    )
    print(f"fuzz cases {report.fuzz_cases}, server errors on bad input {report.server_errors_on_bad_input}")
    print(
        f"kill -9 rounds {report.kill_rounds}, ready records lost {report.ready_records_lost}, "
        f"integrity failures {report.integrity_failures}, cross-tenant hits {report.cross_tenant_hits}"
    )
    fields: dict[str, Any] = {
        "errors": report.errors,
        "ready_records_lost": report.ready_records_lost,
        "cross_tenant_hits": report.cross_tenant_hits,
        "server_errors_on_bad_input": report.server_errors_on_bad_input,
        "faults_failed": report.faults_tried - report.faults_survived,
        "integrity_failures": report.integrity_failures,
        "kill_rounds": report.kill_rounds,
        "fuzz_cases": report.fuzz_cases,
        "idle_connections": report.idle_held,
        "idle_left_open": report.idle_left_open,
        "requests": total,
        "rss_peak_mb": round(max(report.rss_mb), 1) if report.rss_mb else 0,
    }
    print(" ".join(f"{k}={v}" for k, v in fields.items()))


async def run(plan: Plan, args: argparse.Namespace) -> int:
    phases = set(args.phases.split(","))
    if phases - set(PHASES):
        raise SystemExit(f"unknown phase(s) {sorted(phases - set(PHASES))}; known: {', '.join(PHASES)}")
    rng = random.Random(args.seed)
    report = Report()
    up_port = free_port()
    upstream_proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "soak_upstream.py"), "--port", str(up_port),
         "--hang", str(args.fault_timeout + 5), "--seed", str(args.seed)],
    )  # fmt: skip
    await wait_listening(up_port, upstream_proc)
    work = Path(tempfile.mkdtemp(prefix="smartcache-soak-"))
    env = {
        **os.environ,
        "SMARTCACHE_REGENERATE_WINDOW": "0",
        "SMARTCACHE_LOG_LEVEL": "warning",
        # above the load generator's own pool timeout (aiohttp's 15 s), so the client always lets go
        # of an idle pooled connection first and never reuses one the proxy is closing
        "SMARTCACHE_KEEPALIVE_TIMEOUT": str(args.keepalive_timeout),
    }
    if args.model_home:
        env["SMARTCACHE_MODEL_HOME"] = str(args.model_home)
    upstream = f"http://127.0.0.1:{up_port}/v1"
    # under load an upstream answer waits its turn for these 2 cores, so the load runs with an
    # engine's deadline; the faults run with a short one, or each timeout fault would hold for it
    loaded = {**env, "SMARTCACHE_UPSTREAM_TIMEOUT": str(args.upstream_timeout)}
    proxy = ProxyProcess(upstream, work / "load", loaded)
    faulted = ProxyProcess(upstream, work / "faults", {**env, "SMARTCACHE_UPSTREAM_TIMEOUT": str(args.fault_timeout)})
    try:
        if phases & {"load", "idle"}:
            await proxy.start()
        if "load" in phases:
            print(f"load: {plan.clients} clients for {plan.seconds:.0f} s ...", file=sys.stderr)
            assert proxy.proc is not None
            pids = {
                "the proxy": proxy.proc.pid,
                "the scripted upstream": upstream_proc.pid,
                "the load generator": os.getpid(),
            }
            before = {who: process_cpu_seconds(pid) for who, pid in pids.items()}
            await load_phase(proxy, plan, report, rng)
            report.load_cpu_s = {who: process_cpu_seconds(pid) - before[who] for who, pid in pids.items()}
        if "idle" in phases:
            print(f"idle: {plan.idle_connections} connections ...", file=sys.stderr)
            await idle_phase(proxy, plan, report, args.keepalive_timeout)
        proxy.stop()
        if "faults" in phases:
            print("faults ...", file=sys.stderr)
            await faulted.start()
            await fault_phase(faulted, report)
            faulted.stop()
        if "fuzz" in phases:
            print("fuzz ...", file=sys.stderr)
            fuzz_phase(plan, report, env)
        if "kill" in phases:
            print(f"kill -9 x {plan.kill_rounds} ...", file=sys.stderr)
            await kill_phase(ProxyProcess(upstream, work / "kill", env), plan, report, rng)
    finally:
        proxy.stop()
        faulted.stop()
        upstream_proc.terminate()
        upstream_proc.wait(timeout=30)
    print_report(plan, report)
    if args.json:
        Path(args.json).write_text(json.dumps(report.__dict__, indent=2, default=str), encoding="utf-8")
    bad = report.errors or report.ready_records_lost or report.cross_tenant_hits or report.server_errors_on_bad_input
    return 1 if bad or report.integrity_failures or report.idle_left_open else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    quick = "50 clients x 30 s, 2,000 idle connections, 3 kills, 300 fuzz cases (<= 5 min)"
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--phases", default=",".join(PHASES), help=f"a comma-separated subset of {','.join(PHASES)}")
    ap.add_argument("--clients", type=int)
    ap.add_argument("--rate", type=float, default=0.0, help="open loop: requests/s arriving over the clients' sessions")
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--kills", type=int)
    ap.add_argument("--fuzz", type=int)
    ap.add_argument(
        "--upstream-timeout", type=float, default=30.0, help="the proxy's upstream timeout under load (seconds)"
    )
    ap.add_argument(
        "--fault-timeout", type=float, default=3.0, help="the proxy's upstream timeout in the fault phase (seconds)"
    )
    ap.add_argument("--model-home", type=Path, default=ROOT / ".smartcache", help="where the embedding pack lives")
    ap.add_argument("--idle", type=int, help="idle connections to hold (default 10,000; --quick 2,000)")
    ap.add_argument("--keepalive-timeout", type=float, default=20.0, help="the proxy's keepalive_timeout (seconds)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", help="write the report as JSON here")
    args = ap.parse_args(argv)
    base = Plan(50, 30, 3, 300, 2_000) if args.quick else Plan(200, 60, 20, 10_000, 10_000)
    plan = Plan(
        args.clients or base.clients,
        args.seconds or base.seconds,
        args.kills if args.kills is not None else base.kill_rounds,
        args.fuzz if args.fuzz is not None else base.fuzz_examples,
        args.idle if args.idle is not None else base.idle_connections,
        args.rate,
    )
    return asyncio.run(run(plan, args))


if __name__ == "__main__":
    sys.exit(main())
