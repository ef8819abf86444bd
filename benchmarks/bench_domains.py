"""Four domains end to end: no cache vs an exact-prefix cache vs SmartCache, end to end
against the local engine (llama.cpp's server with SmolLM2-135M, proxy/upstream/engine.py), on
multi-turn sessions of four domains built from ../shared/data:

- travel: CrossWOZ dialogues (zh, Beijing hotels, sights, restaurants), their user turns;
- customer service: BQ bank customer-service questions (zh), three per session; a re-asked
  question is its crowd-labelled paraphrase (label 1);
- code: MT-Bench and MT-Bench-zh ``coding`` questions with their follow-up turn;
- document rewriting: MT-Bench-101 content and format rephrasing sessions (CR, FR).

Every session is asked turn by turn, each answer (served or fresh) joining the history, as
run_replay.py does. Two kinds of repetition a multi-turn cache exists for (a user re-asking in other words,
another user opening with the same question) are built in: after its second turn a session
re-sends that turn edited (its paraphrase for BQ, a surface variant elsewhere: case, spacing,
punctuation) on the same history, and a second session of the same tenant opens with the first
two turns verbatim.

Judging, with no oracle answers: a request's key is its conversation so far (system prompt and
user turns, compared in run_replay's ``same_form``; a BQ paraphrase carries its original's key);
every fresh answer is remembered with the key it was generated for, so a served answer whose
key differs from the request's is a false hit. Saved tokens are the engine's own ``usage`` of
each answer that a hit served again; prefix tokens the engine reused on forwarded requests
(``prompt_tokens_details.cached_tokens``) are shown apart.

The exact-prefix cache is a dict in this process keyed by the whole request body (model and
messages, byte for byte), answered without a network hop: its hit latency is a floor. Each
system gets a fresh engine, so no system inherits another's KV cache. One round per system
(``--rounds`` for more; the engine's time makes many rounds costly on 2 cores).

    .venv/bin/python benchmarks/bench_domains.py [--quick] [--sessions 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurement import DEFAULT_MODEL_HOME, ROOT, envelope, fmt, percentile, write_json
from soak import ProxyProcess

from proxy.upstream.engine import LocalEngine

DATA = ROOT.parent / "shared" / "data"
SYSTEM = "You are a helpful assistant. 你是一个乐于助人的助手。"
DOMAINS = ("travel", "customer_service", "code", "doc_rewrite")
SYSTEMS = ("no_cache", "exact_prefix", "smartcache")


@dataclass(frozen=True)
class Turn:
    user: str
    same_as: str | None = None  # for a paraphrase: the text whose key it shares
    edit_of_previous: bool = False  # re-sends the previous turn edited, on the same history


@dataclass(frozen=True)
class Session:
    domain: str
    tenant: str
    session: str
    turns: tuple[Turn, ...]


# --- traces ----------------------------------------------------------------------------------


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def dialogues(domain: str, count: int, rng: random.Random) -> list[tuple[list[str], dict[str, str]]]:
    """``count`` dialogues of a domain: (user turns, paraphrases of some of them)."""
    if domain == "travel":
        rows = list(_jsonl(DATA / "crosswoz" / "val_turns.jsonl"))
        picked = rng.sample(rows, count)
        return [([t["content"] for t in d["turns"] if t["role"] == "usr"][:3], {}) for d in picked]
    if domain == "customer_service":
        lines = (DATA / "zh_pairs" / "bq.valid.tsv").read_text(encoding="utf-8").splitlines()
        pairs = [tuple(line.split("\t")[:2]) for line in lines if line.endswith("\t1")]
        chosen = rng.sample(pairs, 3 * count)
        return [([a for a, _ in chosen[3 * i : 3 * i + 3]], dict(chosen[3 * i : 3 * i + 3])) for i in range(count)]
    if domain == "code":
        rows = [
            d
            for name in ("mt_bench", "mt_bench_zh")
            for d in _jsonl(DATA / name / "question.jsonl")
            if d["category"] == "coding"
        ]
        return [(list(d["turns"])[:3], {}) for d in rng.sample(rows, count)]
    rows = [d for d in _jsonl(DATA / "mt_bench_101" / "mtbench101.jsonl") if d["task"] in ("CR", "FR")]
    return [([h["user"] for h in d["history"]][:3], {}) for d in rng.sample(rows, count)]


_TRAILING = re.compile(r"[\s?？.。!！]+$")


def surface_variant(text: str) -> str:
    """The same request typed differently: lower case, spaces collapsed, no closing punctuation
    (or one added, where the text had none to drop and no capitals to lower)."""
    variant = _TRAILING.sub("", " ".join(text.split()).lower())
    return variant if variant and variant != text else text + "?"


def build_sessions(per_domain: int, seed: int) -> list[Session]:
    rng = random.Random(seed)
    sessions: list[Session] = []
    for domain in DOMAINS:
        for i, (users, paraphrases) in enumerate(dialogues(domain, per_domain, rng)):
            tenant = f"sk-domains-{domain}"
            turns = [Turn(u) for u in users]
            edited = users[min(1, len(users) - 1)]
            edit = Turn(paraphrases[edited], same_as=edited) if edited in paraphrases else Turn(surface_variant(edited))
            at = min(2, len(turns))
            turns.insert(at, Turn(edit.user, edit.same_as, edit_of_previous=True))
            sessions.append(Session(domain, tenant, f"{domain}-{i}-a", tuple(turns)))
            sessions.append(Session(domain, tenant, f"{domain}-{i}-b", tuple(Turn(u) for u in users[:2])))
    return sessions


@functools.cache
def _same_form() -> Callable[[str], str]:
    """run_replay.py's rule for two texts that are the same request (case, spacing, punctuation)."""
    sys.path.insert(0, str(ROOT.parent / "shared" / "eval"))
    import run_replay

    return cast("Callable[[str], str]", run_replay.same_form)


def key_of(users: Sequence[str]) -> str:
    same_form = _same_form()
    return hashlib.sha1(json.dumps([same_form(SYSTEM), *map(same_form, users)]).encode()).hexdigest()[:12]


# --- replay ----------------------------------------------------------------------------------


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)


@dataclass
class Answered:
    text: str
    usage: dict[str, Any]
    served_from_cache: bool


class Asker:
    """One system's way to answer a request: straight to the engine, through the exact-prefix
    dict, or through the proxy."""

    def __init__(self, system: str, session: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
        self.system, self.http, self.url, self.max_tokens = system, session, url, max_tokens
        self.exact: dict[str, Answered] = {}

    async def ask(self, s: Session, messages: list[dict[str, str]]) -> Answered:
        body = {"model": "local", "messages": messages, "temperature": 0, "max_tokens": self.max_tokens}
        if self.system == "exact_prefix":
            raw = json.dumps(body, ensure_ascii=False, sort_keys=True)
            if raw in self.exact:
                got = self.exact[raw]
                return Answered(got.text, got.usage, True)
        headers = {"Authorization": f"Bearer {s.tenant}", "x-smartcache-session": s.session}
        async with self.http.post(self.url, json=body, headers=headers) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"{self.system}: {resp.status} {str(data)[:200]}")
            status = resp.headers.get("x-cache-status", "")
        text = data["choices"][0]["message"]["content"] or ""
        answered = Answered(text, data.get("usage") or {}, status == "hit")
        if self.system == "exact_prefix":
            self.exact[json.dumps(body, ensure_ascii=False, sort_keys=True)] = answered
        return answered


async def replay(asker: Asker, sessions: Sequence[Session]) -> dict[str, Tally]:
    tallies: dict[str, Tally] = collections.defaultdict(Tally)
    produced: dict[str, Produced] = {}  # fresh answer text -> the keys it answered, its tokens
    for s in sessions:
        tally = tallies[s.domain]
        history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        users: list[str] = []
        before_last = history
        for turn in s.turns:
            if turn.edit_of_previous:
                history, users = before_last, users[:-1]
            key = key_of([*users, turn.same_as or turn.user])
            before_last = history
            messages = [*history, {"role": "user", "content": turn.user}]
            t0 = time.perf_counter()
            got = await asker.ask(s, messages)
            tally.latencies.append(time.perf_counter() - t0)
            judge(tally.counts, got, key, produced)
            users.append(turn.same_as or turn.user)
            history = [*messages, {"role": "assistant", "content": got.text}]
    return tallies


@dataclass
class Produced:
    keys: set[str]
    total_tokens: int


def judge(counts: collections.Counter[str], got: Answered, key: str, produced: dict[str, Produced]) -> None:
    """A served answer is right when the engine gave that text for this request's key; a small
    model gives the same text to different requests now and then, so every key it answered counts."""
    counts["requests"] += 1
    details = got.usage.get("prompt_tokens_details") or {}
    if not got.served_from_cache:
        fresh = produced.setdefault(got.text, Produced(set(), int(got.usage.get("total_tokens") or 0)))
        fresh.keys.add(key)
        counts["engine_cached_prompt_tokens"] += int(details.get("cached_tokens") or 0)
        counts["engine_prompt_tokens"] += int(got.usage.get("prompt_tokens") or 0)
        return
    counts["hits"] += 1
    origin = produced.get(got.text)
    if origin is None:
        counts["hits_unjudged"] += 1
        return
    counts["correct_hits" if key in origin.keys else "false_hits"] += 1
    counts["saved_tokens"] += origin.total_tokens


async def run_system(system: str, sessions: Sequence[Session], args: argparse.Namespace) -> dict[str, Tally]:
    async with LocalEngine(parallel=2, ctx_size=4096) as engine:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            if system != "smartcache":
                return await replay(
                    Asker(system, http, engine.base_url + "/chat/completions", args.max_tokens), sessions
                )
            env = {
                **os.environ,
                "SMARTCACHE_LOG_LEVEL": "warning",
                "SMARTCACHE_MODEL_HOME": str(args.model_home),
                "SMARTCACHE_UPSTREAM_FLAVOUR": "llamacpp",
                "SMARTCACHE_UPSTREAM_TIMEOUT": "600",
            }
            work = Path(tempfile.mkdtemp(prefix="smartcache-domains-"))
            proxy = ProxyProcess(engine.base_url, work / "d", env)
            try:
                await proxy.start()
                return await replay(Asker(system, http, proxy.url + "/v1/chat/completions", args.max_tokens), sessions)
            finally:
                proxy.stop()
                shutil.rmtree(work, ignore_errors=True)


def collate(per_round: Sequence[dict[str, dict[str, Tally]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for system in SYSTEMS:
        for domain in (*DOMAINS, "all"):
            lat: list[float] = []
            counts: collections.Counter[str] = collections.Counter()
            for rnd in per_round:
                for d, tally in rnd[system].items():
                    if domain in ("all", d):
                        lat += tally.latencies
                        counts.update(tally.counts)
            out[f"{system}/{domain}"] = {
                "p50_s": percentile(lat, 50),
                "p95_s": percentile(lat, 95),
                "hit_rate": counts["hits"] / max(1, counts["requests"]),
                **dict(counts),
            }
    return out


def print_table(res: dict[str, Any], console: Console) -> None:
    table = Table(title=f"four domains against the local engine ({res['engine_model']}), end to end")
    cols = ("domain", "system", "requests", "p50 s", "p95 s", "hit rate", "false hits", "saved tokens")
    for col in (*cols, "engine-reused prefix tokens"):
        table.add_column(col, justify="left" if col in ("domain", "system") else "right")
    for domain in (*DOMAINS, "all"):
        for system in SYSTEMS:
            r = res["table"][f"{system}/{domain}"]
            table.add_row(
                domain,
                system,
                str(r.get("requests", 0)),
                fmt(r["p50_s"], 2),
                fmt(r["p95_s"], 2),
                f"{100 * r['hit_rate']:.1f} %",
                str(r.get("false_hits", 0)),
                str(r.get("saved_tokens", 0)),
                f"{r.get('engine_cached_prompt_tokens', 0)} of {r.get('engine_prompt_tokens', 0)}",
            )
    console.print(table)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    sessions = build_sessions(args.sessions, args.seed)
    rounds: list[dict[str, dict[str, Tally]]] = []
    for r in range(args.rounds):
        rnd: dict[str, dict[str, Tally]] = {}
        for system in SYSTEMS[r % 3 :] + SYSTEMS[: r % 3]:
            t0 = time.perf_counter()
            rnd[system] = await run_system(system, sessions, args)
            print(f"round {r + 1}: {system} {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        rounds.append(rnd)
    return {
        "engine_model": "SmolLM2-135M-Instruct Q4_1",
        "sessions": len(sessions),
        "requests_per_system_per_round": sum(len(s.turns) for s in sessions),
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "table": collate(rounds),
    }


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 dialogue per domain, answers of at most 32 tokens")
    ap.add_argument("--sessions", type=int, default=8, help="dialogues per domain (each gives two sessions)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--model-home", type=Path, default=DEFAULT_MODEL_HOME)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/bench_domains.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.sessions, args.max_tokens = 1, 32
    # the engine runs in a process group of its own: a SIGTERM to this one must unwind through
    # LocalEngine's exit to stop it
    signal.signal(signal.SIGTERM, _interrupted)
    res = asyncio.run(measure(args))
    print_table(res, Console(width=150))
    path = write_json(args.json, "bench_domains", envelope("bench_domains", sys.argv, res))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
