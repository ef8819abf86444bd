"""bench_overhead's judged rows: the gray zone the model judge reads (docs/architecture.md, "The judge").

A proxy of its own, under the shipped policy with its judge on (``race``: the forward and the
judge start together, the forward's bytes wait for the verdict up to ``judge_deadline_ms``), in
front of tests/scripted_upstream.py's app, which answers judge requests as the replay harness's
oracle does (yes when the cached answer is the one it gives the new request), never wrong here
and after ``judge_ms``; its exam is passed before anything is timed. Each probe asks an app how-to
in a tenant of its own (a key per probe, so the record it rewords is its only candidate), then
asks it again in other words (``REWORDINGS``). A yes makes the wording an alias, so that no
wording is ever asked twice: each probe draws a question of its own.

- ``miss_slow``: a question the tenant never asked, the upstream slower than the judge: the
  plain miss each refused row is set against, side by side in every round;
- ``hit_judged``: the rewording of a question the upstream answers as it answered the first
  wording: the judge says yes, the cached answer is served and the forward cancelled. Its p50
  less ``judge_ms`` is the proxy's own time;
- ``refused_slow``: the rewording of a question answered otherwise: the judge says no before the
  forward's first byte, so it should wait no longer than ``miss_slow``;
- ``miss_fast``, ``refused_fast``: the same two with the upstream faster than the judge: the
  forward waits for the verdict, never past the deadline.

Each round also times the judge asked straight, a judge request sent to that upstream without a
proxy (``judge_round_trips``): ``hit_judged``'s p50 less it is the proxy's own time measured as
the direct rows measure a miss's, beside the p50 less the judge's nominal ``judge_ms``.
"""

from __future__ import annotations

import asyncio
import collections
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from measurement import fmt, median_of, summary
from rich.console import Console
from rich.table import Table

from proxy.upstream.judge import JUDGE_HEADER, judge_body
from tests.scripted_upstream import Script

SLOW_MODES = ("miss_slow", "hit_judged", "refused_slow")
FAST_MODES = ("miss_fast", "refused_fast")
JUDGED_MODES = SLOW_MODES + FAST_MODES
# (x-cache-status, x-cache-reason) a judged mode's timed requests must get; None: any
EXPECT_JUDGED: Mapping[str, tuple[str | None, str | None]] = {
    "miss_slow": ("miss", None),
    "hit_judged": ("hit", "judged"),
    # the decision that stood before the judge was asked: a miss or a half-hit
    "refused_slow": (None, "judge_refused"),
    "miss_fast": ("miss", None),
    "refused_fast": (None, "judge_refused"),
}
# each refused row and the plain miss it is set against
BESIDE = {"refused_slow": "miss_slow", "refused_fast": "miss_fast"}
HIT_TARGET_MS = 8.0  # issue 47: a judged hit within the judge's latency and this much
# the words and rewordings below keep a question's intent when reworded nine times in ten (the
# rest, filtered by intent, are left out of the timings and counted in the status column), name
# no change ("update" would), and are scored in the gray zone the shipped policy leaves to the judge
VERBS = ("export", "reset", "recover", "print", "unlock", "renew", "view", "delete")
THINGS = (
    "recovery email",
    "security questions",
    "shipping address",
    "profile picture",
    "display name",
    "password",
    "subscription",
    "username",
    "email address",
    "billing details",
    "order history",
    "saved cards",
)
APPS = ("mobile", "video", "chat", "web", "calendar", "maps", "music", "desktop", "fitness", "photo")
ASKED = "How do I {verb} my {thing} in the {app} app?"
REWORDINGS = (
    "How can I {verb} my {thing} in the {app} app?",
    "How do I go about it if I want to {verb} my {thing} in the {app} app?",
    "In the {app} app, how can I {verb} my {thing}?",
)


@dataclass(frozen=True)
class JudgedProbe:
    """One timed request in a tenant of its own (``key``); ``seed`` asked first, untimed;
    ``answer``: what the upstream answers both, so that the judge says yes."""

    ask: str
    seed: str
    key: str
    answer: str | None = None


class JudgedWorkload:
    """Questions no mode asks twice. The reworded modes split one shuffled pool between them: the
    answers the upstream gives for a yes are keyed by wording, so no two of them may share one."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        combos = [(v, t, a) for v in VERBS for t in THINGS for a in APPS]
        rng.shuffle(combos)
        reworded = [m for m in JUDGED_MODES if not m.startswith("miss")]
        self._pools = {mode: combos[i :: len(reworded)] for i, mode in enumerate(reworded)}
        self._pools.update({mode: rng.sample(combos, len(combos)) for mode in JUDGED_MODES if mode.startswith("miss")})
        self._drawn: collections.Counter[str] = collections.Counter()

    def probes(self, mode: str, n: int, tag: str) -> list[JudgedProbe]:
        return [self._probe(mode, f"sk-bench-{tag}-{mode}-{i}") for i in range(n)]

    def _probe(self, mode: str, key: str) -> JudgedProbe:
        k = self._drawn[mode]
        self._drawn[mode] += 1
        pool = self._pools[mode]
        if k >= len(pool):
            raise ValueError(f"{mode}: more probes than the {len(pool)} questions of its pool")
        verb, thing, app = pool[k]
        seed = ASKED.format(verb=verb, thing=thing, app=app)
        if mode.startswith("miss"):  # the tenant's one record is about something else entirely
            hours = k + 2 + 1000 * JUDGED_MODES.index(mode)  # no text twice: the signer caches vectors
            return JudgedProbe(f"How many minutes are in {hours} hours?", seed, key)
        ask = REWORDINGS[k % len(REWORDINGS)].format(verb=verb, thing=thing, app=app)
        answer = f"To {verb} your {thing} in the {app} app, open Settings." if mode == "hit_judged" else None
        return JudgedProbe(ask, seed, key, answer)


@dataclass
class JudgedUpstream:
    """The judged proxy's upstream, scripted per mode: how long its answers take, what it answers."""

    script: Script
    slow_ms: float
    fast_ms: float

    def prepare(self, mode: str, probes: Sequence[JudgedProbe]) -> None:
        self.script.delay = (self.slow_ms if mode in SLOW_MODES else self.fast_ms) / 1000
        for p in probes:
            if p.answer is not None:
                self.script.answers[p.seed] = self.script.answers[p.ask] = p.answer


def matches(mode: str, status: str, reason: str) -> bool:
    want_status, want_reason = EXPECT_JUDGED[mode]
    return want_status in (None, status) and want_reason in (None, reason)


async def qualified(session: aiohttp.ClientSession, base_url: str, model: str, timeout: float = 120.0) -> None:
    """Wait until the judge has passed its exam for ``model`` (``/readyz``); fail if it failed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    state = None
    while loop.time() < deadline:
        async with session.get(base_url + "/readyz") as resp:
            state = (await resp.json()).get("judge", {}).get(model)
        if state == "passed":
            return
        if state == "failed":
            raise RuntimeError("the judged proxy's judge failed its exam")
        await asyncio.sleep(0.25)
    raise RuntimeError(f"the judge's exam did not end in {timeout:.0f} s (state {state})")


async def judge_round_trips(session: aiohttp.ClientSession, url: str, n: int) -> dict[str, float]:
    """The judge asked straight at ``url``, no proxy between: ``n`` judge requests as the proxy
    sends them, their milliseconds over HTTP (``summary``)."""
    question = [{"role": "user", "content": ASKED.format(verb="reset", thing="password", app="mobile")}]
    body = judge_body(question, "Open Settings, then Security.", "m", logprobs=True)
    headers = {JUDGE_HEADER: "1", "Authorization": "Bearer sk-bench-judge-direct"}
    times = []
    for _ in range(n):
        t0 = asyncio.get_running_loop().time()
        async with session.post(url, json=body, headers=headers) as resp:
            await resp.read()
        times.append((asyncio.get_running_loop().time() - t0) * 1000)
    return summary(times)


def collate_judged(
    modes: Mapping[str, Any],
    judge_rounds: Sequence[Mapping[str, float]],
    *,
    judge_ms: float,
    deadline_ms: float,
    slow_ms: float,
    fast_ms: float,
) -> dict[str, Any]:
    """The judged rows against their targets, from the modes' per-round figures and the judge's
    own (``judge_round_trips``), round by round."""
    out: dict[str, Any] = {
        "judge_ms": judge_ms,
        "judge_deadline_ms": deadline_ms,
        "upstream_slow_ms": slow_ms,
        "upstream_fast_ms": fast_ms,
        "judge_direct": {key: median_of(judge_rounds, key) for key in ("p50", "p95")},
    }
    if "hit_judged" in modes:
        med = modes["hit_judged"]["median"]
        out["hit_judged"] = {
            "p50": med["p50"],
            "p95": med["p95"],
            "p50_less_judge_ms": med["p50"] - judge_ms,
            # median over rounds of each round's p50 less the judge's p50 asked straight in that round
            "p50_less_judge_direct_ms": paired_median(modes["hit_judged"]["rounds"], judge_rounds),
            "target_ms": HIT_TARGET_MS,
        }
    for refused, plain in BESIDE.items():
        if refused not in modes or plain not in modes:
            continue
        out[refused] = {
            "p50": modes[refused]["median"]["p50"],
            "plain_miss_p50": modes[plain]["median"]["p50"],
            # median over rounds of each round's difference of p50s, both measured in that round
            "extra_wait_ms": paired_median(modes[refused]["rounds"], modes[plain]["rounds"]),
            "target_ms": 0.0 if refused == "refused_slow" else deadline_ms,
        }
    return out


def paired_median(rounds: Sequence[Mapping[str, float]], beside: Sequence[Mapping[str, float]]) -> float:
    """The median over rounds of one p50 less another taken in the same round (NaN: none both had)."""
    pairs = zip(rounds, beside, strict=True)
    deltas = [r["p50"] - b["p50"] for r, b in pairs if r["p50"] == r["p50"] and b["p50"] == b["p50"]]
    return statistics.median(deltas) if deltas else float("nan")


def print_judged(judged: Mapping[str, Any], console: Console) -> None:
    table = Table(
        title=(
            f"the judge's gray zone: judge {judged['judge_ms']:.0f} ms, deadline {judged['judge_deadline_ms']:.0f} ms; "
            f"upstream {judged['upstream_slow_ms']:.0f} ms (slow) / {judged['upstream_fast_ms']:.0f} ms (fast)"
        )
    )
    for col in ("row", "p50", "p95", "measure", "ms", "target"):
        table.add_column(col, justify="left" if col in ("row", "measure") else "right")
    if "hit_judged" in judged:
        row = judged["hit_judged"]
        table.add_row(
            "hit_judged",
            fmt(row["p50"]),
            fmt(row["p95"]),
            f"p50 less the judge's {judged['judge_ms']:g} ms",
            fmt(row["p50_less_judge_ms"]),
            f"<= {row['target_ms']:g}",
        )
        direct = judged["judge_direct"]
        table.add_row(
            "judge_direct",
            fmt(direct["p50"]),
            fmt(direct["p95"]),
            "hit_judged's p50 less this, by round",
            fmt(row["p50_less_judge_direct_ms"]),
            f"<= {row['target_ms']:g}",
        )
    for refused, plain in BESIDE.items():
        if refused in judged:
            row = judged[refused]
            target = "0" if refused == "refused_slow" else f"<= {row['target_ms']:g}"
            table.add_row(
                refused, fmt(row["p50"]), "-", f"extra wait over {plain}", f"{row['extra_wait_ms']:+.1f}", target
            )
    console.print(table)
