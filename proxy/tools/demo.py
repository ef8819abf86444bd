"""`smartcache demo`: the embedded engine and the proxy, a short bilingual conversation through
them, and a table of what the cache did with each turn.

The proxy is the one `smartcache serve` runs with no upstream (create_app starts the local
llama.cpp engine itself), so the demo shows the main job, not a mock of it. Answers become
reusable at once (``ready_after=0``): a demo cannot wait out the feedback window. Each run asks
in a namespace of its own, so answers left in the data folder by an earlier run never turn the
first turn into a hit. Each turn of the script says what the shipped model pack and policy make
of it; the table (80 columns) marks a turn that came out otherwise, and a line under it says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from proxy.http.app import UPSTREAM_URL, create_app
from proxy.http.listener import serving
from proxy.settings import Settings
from proxy.tools.stats import Snapshot, metrics_url, parse_metrics

SYSTEM_PROMPT = "You are a concise assistant. Always answer in English, in one or two short sentences."
MAX_TOKENS = 192  # answers cut at the limit are never stored: room for a whole short one
STATUS_STYLE = {"hit": "bold green", "half-hit": "yellow", "miss": "red", "bypass": "cyan"}


@dataclass(frozen=True, slots=True)
class DemoTurn:
    lang: str
    text: str
    expect: str  # the status the shipped policy and model give it (a run that differs says so)
    shows: str  # why: what the turn is there to show


SCRIPT: tuple[DemoTurn, ...] = (
    DemoTurn("zh", "东京五日游怎么安排？预算8000元", "miss", "first ask"),
    DemoTurn("zh", "东京五日游怎么安排？预算八千元", "hit", "same ask, 八千 = 8000"),
    DemoTurn("zh", "东京五日游怎么安排？预算8000元，不要太累的", "half-hit", "a new constraint: forwarded"),
    DemoTurn("zh", "东京今天天气怎么样？", "bypass", "realtime: never cached"),
    DemoTurn("en", "Give me three tips for sleeping better.", "miss", "first ask"),
    DemoTurn("en", "give me 3 tips for sleeping better", "hit", "paraphrase"),
    # scores below the candidate floor against turn 5 (0.83 with the shipped pack): a question of its own
    DemoTurn("en", "Give me three tips for sleeping better, and add one about coffee.", "miss", "asks for more"),
    DemoTurn("en", "Is it raining in Kyoto now?", "bypass", "realtime: never cached"),
)


@dataclass(frozen=True, slots=True)
class TurnResult:
    turn: DemoTurn
    status: str
    reason: str
    similarity: float | None
    latency_ms: float
    saved_tokens: int
    upstream_cached_tokens: int
    answer: str


def demo_settings(base: Settings, *, port: int | None = None, data_dir: Path | None = None) -> Settings:
    """The proxy of `serve` with no upstream, its own data folder, instant answers and debug headers.
    Embedding packs stay where `serve` keeps them, so the demo does not build them twice."""
    chosen = data_dir or base.data_dir / "demo"
    return dataclasses.replace(
        base,
        upstream=None,
        upstream_flavour="llamacpp",
        port=base.port if port is None else port,
        data_dir=chosen,
        model_home=base.model_home or data_dir or base.data_dir,
        ready_after=0.0,
        debug_headers=True,
    )


async def _snapshot(client: httpx.AsyncClient, base_url: str) -> Snapshot:
    response = await client.get(metrics_url(base_url))
    response.raise_for_status()
    return parse_metrics(response.text)


async def ask(
    client: httpx.AsyncClient, base_url: str, turn: DemoTurn, *, model: str, session: str, namespace: str
) -> TurnResult:
    """One turn, with the tokens it saved and the engine's cached tokens read from /metrics deltas."""
    before = await _snapshot(client, base_url)
    body = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "cache": {"namespace": namespace},
        "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": turn.text}],
    }
    started = time.perf_counter()
    response = await client.post(
        f"{base_url}/chat/completions", json=body, headers={"x-smartcache-session": session, "x-smartcache-debug": "1"}
    )
    latency = time.perf_counter() - started
    response.raise_for_status()
    after = await _snapshot(client, base_url)
    score = response.headers.get("x-cache-similarity") or response.headers.get("x-smartcache-score")
    return TurnResult(
        turn=turn,
        status=response.headers.get("x-cache-status", "?"),
        reason=response.headers.get("x-smartcache-reason", ""),
        similarity=float(score) if score else None,
        latency_ms=latency * 1000,
        saved_tokens=round(after.saved_total - before.saved_total),
        upstream_cached_tokens=round(after.upstream_cached_tokens - before.upstream_cached_tokens),
        answer=str(response.json()["choices"][0]["message"]["content"] or ""),
    )


async def run_script(
    base_url: str, turns: Sequence[DemoTurn] = SCRIPT, *, session: str = "demo", namespace: str | None = None
) -> list[TurnResult]:
    namespace = namespace or f"demo-{secrets.token_hex(4)}"
    async with httpx.AsyncClient(timeout=300.0, trust_env=False, headers={"Authorization": "Bearer demo"}) as client:
        models = (await client.get(f"{base_url}/models")).json()  # passed through to the engine
        model = str(models["data"][0]["id"])
        return [await ask(client, base_url, turn, model=model, session=session, namespace=namespace) for turn in turns]


# the table fits 80 columns: the turn's text wraps to what the others leave
COLUMNS: tuple[tuple[str, str], ...] = (
    ("#", "right"),
    ("turn", "left"),
    ("cache", "left"),
    ("sim", "right"),
    ("ms", "right"),
    ("saved", "right"),
    ("kv", "right"),
)
UNEXPECTED = "!"  # marks a status other than the turn's ``expect``


def row_cells(index: int, r: TurnResult) -> tuple[tuple[str, str], ...]:
    """One turn's cells as (first line, second line), plain text: the turn and what it shows; the
    status (marked when it is not the expected one) and its reason; the score, ms, tokens saved,
    and prompt tokens the engine served from its own prefix cache."""
    status = r.status if r.status == r.turn.expect else f"{r.status} {UNEXPECTED}"
    return (
        (str(index), ""),
        (r.turn.text, r.turn.shows),
        (status, r.reason),
        ("-" if r.similarity is None else f"{r.similarity:.2f}", ""),
        (f"{r.latency_ms:.0f}", ""),
        (str(r.saved_tokens), ""),
        (str(r.upstream_cached_tokens), ""),
    )


def results_table(results: Sequence[TurnResult]) -> Table:
    table = Table(
        title="smartcache demo: one conversation, turn by turn", box=box.SIMPLE_HEAD, pad_edge=False, leading=1
    )
    for name, justify in COLUMNS:
        wraps = name == "turn"
        table.add_column(
            name,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=not wraps,
            overflow="fold",  # a line of Chinese has no space to wrap at
            ratio=1 if wraps else None,
        )
    for i, r in enumerate(results, 1):
        cells = [escape(first) + (f"\n[dim]{escape(second)}[/]" if second else "") for first, second in row_cells(i, r)]
        cells[2] = f"[{STATUS_STYLE.get(r.status, '')}]{cells[2]}"
        table.add_row(*cells)
    return table


def notes(results: Sequence[TurnResult]) -> list[str]:
    """What the columns mean, and each turn that came out other than its ``expect``, said."""
    said = [
        "cache: what the cache did, and why (hit: served from it; half-hit: a related conversation was "
        "found, the request forwarded with prefix-cache hints; miss: forwarded; bypass: never cached). "
        "sim: the best candidate's score. saved: the tokens a hit saved. kv: prompt tokens the engine "
        "served from its own prefix cache."
    ]
    for i, r in enumerate(results, 1):
        if r.status != r.turn.expect:
            reason = f" ({r.reason})" if r.reason else ""
            expected = f"was expected to be a {r.turn.expect} ({r.turn.shows})"
            said.append(f"{UNEXPECTED} turn {i} {expected} and was a {r.status}{reason}.")
    return said


async def _until_interrupted() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)


async def run_demo(settings: Settings, *, once: bool, console: Console | None = None) -> list[TurnResult]:
    """Start engine and proxy, replay the script, print the table; then serve until Ctrl-C
    unless ``once``. Both stop together on the way out."""
    console = console or Console()
    console.print("starting the local llama.cpp engine and the SmartCache proxy ...")
    app = create_app(settings)
    async with serving(app, settings.host, settings.port, max_connections=settings.max_connections) as listener:
        base_url = f"http://{settings.host}:{listener.port}/v1"
        console.print(f"proxy {base_url} -> engine {app[UPSTREAM_URL]}")
        results = await run_script(base_url)
        console.print(results_table(results))
        for note in notes(results):
            console.print(note, markup=False, highlight=False)
        if not once:
            console.print(
                f"\nSmartCache keeps running: point a client at [bold]{base_url}[/] "
                f"(export OPENAI_BASE_URL={base_url}), watch {metrics_url(base_url)}, "
                "run `smartcache stats`."
            )
            # a line of its own: whatever the terminal's width, the last line says how to stop
            console.print("Ctrl-C stops the proxy and the engine.")
            await _until_interrupted()
        return results
