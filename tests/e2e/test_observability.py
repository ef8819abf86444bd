"""Observability end to end: a scripted session through the real proxy moves every counter on
/metrics by exactly what happened, the canonical log line of each request says the same, debug
headers appear only when allowed and asked for, and `smartcache stats` reads it all back."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import structlog
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from structlog.testing import capture_logs

from proxy.cli import main as cli_main
from proxy.http.app import LIFECYCLE
from proxy.observability.metrics import STAGES
from proxy.tools.stats import Snapshot, fetch_snapshot, metrics_url, parse_metrics, print_stats
from tests.conftest import Proxy, ProxyFactory
from tests.scripted_upstream import Script, scripted_app

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CACHED_PER_CALL = 7  # prompt tokens the upstream says its own prefix cache served, on every JSON answer
SECRET = "SECRET-ELBRUS-5642"
FIRST_QUESTION = "What is the tallest mountain in Europe?"


@dataclass
class Turn:
    status: str
    content: str
    headers: dict[str, str]
    usage: Any
    log: MutableMapping[str, Any] = field(default_factory=dict)


@dataclass
class Observed:
    proxy: Proxy
    before: Snapshot
    turns: list[Turn]
    after: Snapshot


@pytest.fixture
async def caching_upstream() -> AsyncIterator[tuple[Script, str]]:
    """The scripted upstream, reporting ``cached_tokens`` as vLLM does with prompt-tokens details."""
    script = Script(answers={FIRST_QUESTION: f"Mount Elbrus ({SECRET}), 5642 m."})

    @web.middleware
    async def report_cached(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        if isinstance(response, web.Response) and response.content_type == "application/json" and response.body:
            data = json.loads(response.body)  # type: ignore[arg-type]
            if isinstance(data.get("usage"), dict):
                data["usage"]["prompt_tokens_details"] = {"cached_tokens": CACHED_PER_CALL}
                return web.json_response(data, status=response.status)
        return response

    app = scripted_app(script)
    app.middlewares.append(report_cached)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield script, str(server.make_url("/v1"))
    await server.close()


async def scrape(proxy: Proxy) -> Snapshot:
    async with aiohttp.ClientSession() as session, session.get(metrics_url(proxy.base_url)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return parse_metrics(await resp.text())


async def ask(
    client: openai.AsyncOpenAI,
    text: str,
    history: list[dict[str, str]] | None = None,
    *,
    stream: bool = False,
    **kw: Any,
) -> Turn:
    messages: list[Any] = [SYSTEM, *(history or []), {"role": "user", "content": text}]
    if stream:
        async with client.chat.completions.with_streaming_response.create(
            model="m", messages=messages, stream=True, stream_options={"include_usage": True}, **kw
        ) as resp:
            chunks = [c async for c in await resp.parse()]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return Turn(resp.headers["x-cache-status"], content, dict(resp.headers), chunks[-1].usage)
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages, **kw)
    completion = raw.parse()
    return Turn(
        raw.headers["x-cache-status"], completion.choices[0].message.content or "", dict(raw.headers), completion.usage
    )


def delta(after: dict[Any, float], before: dict[Any, float]) -> dict[Any, float]:
    return {
        k: after.get(k, 0.0) - before.get(k, 0.0)
        for k in after.keys() | before.keys()
        if after.get(k, 0.0) != before.get(k, 0.0)
    }


async def run_session(proxy: Proxy) -> list[Turn]:
    """miss, hit, correction, miss, half-hit, two bypasses; then a miss and a streamed hit that
    nobody corrects. Each turn gets its own canonical log line attached."""
    s1 = proxy.client(**{"x-smartcache-session": "obs-1"})
    s2 = proxy.client(**{"x-smartcache-session": "obs-2"})
    turns: list[Turn] = []
    with capture_logs() as logs:
        first = await ask(s1, FIRST_QUESTION)
        turns += [first, await ask(s1, "what is the tallest mountain in europe")]
        history = [{"role": "user", "content": FIRST_QUESTION}, {"role": "assistant", "content": first.content}]
        turns += [await ask(s1, "that's wrong", history)]
        turns += [await ask(s1, "What does the liability clause in this contract mean")]
        # a case change inside the turn is not framing (names are case-sensitive): judged by
        # meaning, where the legal intent serves nothing
        turns += [await ask(s1, "What does the Liability clause in this Contract mean")]
        turns += [await ask(s1, "What is the weather in Paris today?")]
        turns += [await ask(s1, "Tell me a joke", n=2)]
        turns += [await ask(s2, "Give me three tips for sleeping better.")]
        turns += [await ask(s2, "give me 3 tips for sleeping better", stream=True)]
    lines = [e for e in logs if e["event"] == "chat.request"]
    assert len(lines) == len(turns)
    for turn, line in zip(turns, lines, strict=True):
        turn.log = line
    return turns


@pytest.fixture
async def observed(make_proxy: ProxyFactory, caching_upstream: tuple[Script, str]) -> Observed:
    structlog.reset_defaults()  # capture_logs needs loggers that were not cached by an earlier configure
    # no background sweep mid-test: the hit judge's window closes when the test ticks
    proxy = await make_proxy(upstream=caching_upstream[1], sweep_interval=3600.0)
    before = await scrape(proxy)
    turns = await run_session(proxy)
    await asyncio.sleep(1.1)  # the judge's window is max(ready_after, 1 s); the s2 hit is never corrected
    await proxy.app[LIFECYCLE].tick()
    return Observed(proxy, before, turns, await scrape(proxy))


EXPECTED = [  # status header, metric status, intent (None: whatever the log line says), metric reason
    ("miss", "miss", None, "no_candidate"),  # general or travel: the exemplars' call, not this test's
    ("hit", "hit", None, "accept"),
    ("miss", "miss", None, "correction"),
    ("miss", "miss", "legal", None),
    ("half-hit", "half_hit", "legal", "no_direct_hit"),
    ("bypass", "bypass", "realtime", "intent_disabled"),
    ("bypass", "bypass", "-", "n>1"),
    ("miss", "miss", None, None),
    ("hit", "hit", None, "accept"),
]


async def test_each_request_counter_moves_by_exactly_one_per_request(observed: Observed) -> None:
    before, turns, after = observed.before, observed.turns, observed.after
    assert [t.status for t in turns] == [e[0] for e in EXPECTED]
    expected: dict[tuple[str, str, str], float] = {}
    for turn, (_, status, intent, reason) in zip(turns, EXPECTED, strict=True):
        assert turn.log["status"] == turn.status
        if intent is not None:
            assert turn.log["intent"] == intent
        label = turn.log["reason"].split(":")[0] or "-"
        if reason is not None:
            assert label == reason
        key = (status, turn.log["intent"], label)
        expected[key] = expected.get(key, 0.0) + 1
    assert delta(dict(after.requests_by), dict(before.requests_by)) == expected
    assert delta(dict(after.requests), dict(before.requests)) == {"miss": 4, "hit": 2, "half_hit": 1, "bypass": 2}
    latency = {s: after.latency[s].count - before.latency[s].count for s in after.latency}
    assert latency == {"miss": 4, "hit": 2, "half_hit": 1, "bypass": 2}


async def test_hits_are_judged_saved_tokens_and_engine_cached_tokens_kept_apart(observed: Observed) -> None:
    before, turns, after = observed.before, observed.turns, observed.after
    assert delta(dict(after.judged), dict(before.judged)) == {"corrected": 1, "accepted": 1}
    misses_served_again = [turns[0].usage, turns[7].usage]  # the records the two hits served
    saved = {
        "prompt": sum(u.prompt_tokens for u in misses_served_again),
        "completion": sum(u.completion_tokens for u in misses_served_again),
    }
    assert delta(dict(after.saved_tokens), dict(before.saved_tokens)) == saved
    assert [t.log["saved_tokens"] for t in turns] == [0, saved_by(turns[0]), 0, 0, 0, 0, 0, 0, saved_by(turns[7])]
    forwarded = [t for t in turns if t.status != "hit"]
    assert after.upstream_cached_tokens - before.upstream_cached_tokens == CACHED_PER_CALL * len(forwarded)
    assert [t.log["upstream_cached_tokens"] for t in turns] == [
        0 if t.status == "hit" else CACHED_PER_CALL for t in turns
    ]
    # hits answer with zero usage: nothing was generated for them
    assert turns[1].usage.total_tokens == 0 and turns[8].usage.total_tokens == 0


def saved_by(miss: Turn) -> int:
    return int(miss.usage.prompt_tokens + miss.usage.completion_tokens)


async def test_writes_records_and_stage_timings_match_the_log_lines(observed: Observed) -> None:
    before, turns, after = observed.before, observed.turns, observed.after
    stored = [t.log["stored"] for t in turns]
    # the answer that follows a correction is never stored
    assert stored == [True, False, False, True, True, False, False, True, False]
    assert delta(dict(after.writes), dict(before.writes)) == {"ready": 4}  # ready_after=0: ready at once
    assert after.records.get("ready") == 4 and after.index_size == 4
    ran = {stage: sum(stage in t.log["stages_ms"] for t in turns) for stage in STAGES}
    ran["parse"] = len(turns)  # parse is timed by the handler, before the canonical line's stages begin
    moved = {stage: after.stages[stage].count - before.stages[stage].count for stage in STAGES}
    assert moved == ran
    assert (ran["serve"], ran["upstream"], ran["store"], ran["index"]) == (2, 7, 4, 6)
    for turn in turns:
        # the latency is the reply's; the write-back ("store") follows the reply (proxy.service.settling)
        replied = {stage: ms for stage, ms in turn.log["stages_ms"].items() if stage != "store"}
        assert turn.log["latency_ms"] >= sum(replied.values()) * 0.99
        assert turn.log["tenant"] and "key-A" not in json.dumps(turn.log)


async def test_log_scores_are_the_headers_scores(observed: Observed) -> None:
    turns = observed.turns
    for turn in turns:
        if turn.status == "hit":
            assert turn.headers["x-cache-similarity"] == f"{turn.log['score']:.4f}"
            assert turn.headers["x-cache-id"] == turn.log["cache_id"]
        else:
            assert "x-cache-similarity" not in turn.headers
    assert turns[4].log["score"] is not None  # a half-hit found its candidate
    assert turns[5].log["score"] is None and turns[6].log["score"] is None  # bypasses never look up


async def test_stats_reads_the_live_proxy(observed: Observed, capsys: pytest.CaptureFixture[str]) -> None:
    proxy, after = observed.proxy, observed.after
    snap = await asyncio.to_thread(fetch_snapshot, proxy.base_url)  # given the client's /v1 URL
    assert snap.requests == after.requests and snap.judged == after.judged
    assert snap.hit_rate == pytest.approx(2 / 9)
    assert snap.precision_hit == pytest.approx(0.5)
    assert snap.cache_pollution == pytest.approx(1 / 9)
    assert snap.saved_total == after.saved_total > 0
    assert snap.stages["embed"].mean is not None and snap.stages["embed"].mean > 0  # model calls, apart from sign
    assert snap.stages["sign"].mean is not None and snap.stages["sign"].mean > 0
    root = str(proxy.server.make_url("/"))
    code = await asyncio.to_thread(cli_main, ["stats", "--url", root])
    out = capsys.readouterr().out
    assert code == 0
    for text in ("22.2 %", "50.0 %", "11.1 %", f"{snap.saved_total:.0f}", "half_hit", "upstream", "p95 ms"):
        assert text in out, text


async def test_stats_says_when_the_proxy_is_not_there(capsys: pytest.CaptureFixture[str]) -> None:
    code = await asyncio.to_thread(cli_main, ["stats", "--url", "http://127.0.0.1:9"])
    assert code == 2
    assert "cannot read metrics from http://127.0.0.1:9" in capsys.readouterr().err


async def test_debug_headers_only_when_enabled_and_asked(
    make_proxy: ProxyFactory, caching_upstream: tuple[Script, str]
) -> None:
    off = await make_proxy(upstream=caching_upstream[1])
    asked = await ask(off.client(**{"x-smartcache-debug": "1"}), FIRST_QUESTION)
    assert not debug_headers(asked)
    on = await make_proxy(upstream=caching_upstream[1], debug_headers=True, data_dir=off.settings.data_dir / "on")
    plain = await ask(on.client(**{"x-smartcache-session": "d1"}), FIRST_QUESTION)
    assert plain.status == "miss" and not debug_headers(plain)
    structlog.reset_defaults()
    with capture_logs() as logs:
        hit = await ask(
            on.client(**{"x-smartcache-session": "d1", "x-smartcache-debug": "1"}),
            "what is the tallest mountain in europe",
        )
    (line,) = [e for e in logs if e["event"] == "chat.request"]
    shown = debug_headers(hit)
    assert hit.status == "hit" and SECRET in hit.content
    assert shown["x-smartcache-reason"] == line["reason"] == "accept"
    assert shown["x-smartcache-intent"] == line["intent"]
    assert shown["x-smartcache-score"] == f"{line['score']:.4f}"
    tags = json.loads(shown["x-smartcache-tags"])
    assert tags["intent"] == line["intent"] and set(tags["entities"]) >= {"places", "products", "numbers"}
    timings = dict(part.split("=") for part in shown["x-smartcache-timings"].split(","))
    # the headers leave before the answer is served, so they time every stage but that one
    assert set(timings) == set(line["stages_ms"]) - {"serve"}
    assert {"sign", "index", "decide"} <= set(timings)
    for stage, shown_ms in timings.items():
        assert float(shown_ms.removesuffix("ms")) == pytest.approx(line["stages_ms"][stage], abs=0.06)
    # the record served is described by its id only: never its answer nor its question's text
    for value in shown.values():
        assert SECRET not in value and "5642" not in value and FIRST_QUESTION not in value


def debug_headers(turn: Turn) -> dict[str, str]:
    return {k.lower(): v for k, v in turn.headers.items() if k.lower().startswith("x-smartcache-")}


def test_stats_numbers_from_a_hand_written_exposition() -> None:
    text = "\n".join(
        [
            'smartcache_requests_total{status="hit",intent="travel",reason="accept"} 3',
            'smartcache_requests_total{status="miss",intent="travel",reason="no_candidate"} 5',
            'smartcache_requests_total{status="bypass",intent="-",reason="n>1"} 2',
            'smartcache_hits_judged_total{outcome="accepted"} 2',
            'smartcache_hits_judged_total{outcome="corrected"} 1',
            'smartcache_saved_tokens_total{kind="prompt"} 120',
            'smartcache_saved_tokens_total{kind="completion"} 30',
            "smartcache_upstream_cached_tokens_total 64",
            'smartcache_stage_seconds_bucket{stage="sign",le="0.01"} 1',
            'smartcache_stage_seconds_bucket{stage="sign",le="0.1"} 3',
            'smartcache_stage_seconds_bucket{stage="sign",le="+Inf"} 4',
            'smartcache_stage_seconds_count{stage="sign"} 4',
            'smartcache_stage_seconds_sum{stage="sign"} 0.5',
            "",
        ]
    )
    snap = parse_metrics(text)
    assert snap.total_requests == 10 and snap.hit_rate == pytest.approx(0.3)
    assert snap.precision_hit == pytest.approx(2 / 3) and snap.cache_pollution == pytest.approx(0.1)
    assert snap.saved_total == 150 and snap.upstream_cached_tokens == 64
    sign = snap.stages["sign"]
    assert sign.mean == pytest.approx(0.125)
    assert sign.quantile(0.5) == pytest.approx(0.01 + 0.09 * 0.5)  # rank 2 of 4: halfway into (0.01, 0.1]
    assert sign.quantile(0.99) == pytest.approx(0.1)  # in the +Inf bucket: the last finite bound
    assert parse_metrics("").precision_hit is None and parse_metrics("").hit_rate is None
    console = Console(record=True, width=140)
    print_stats(snap, console)
    rendered = console.export_text()
    for text_shown in ("30.0 %", "66.7 %", "10.0 %", "150", "64", "125.0"):
        assert text_shown in rendered


@pytest.mark.parametrize(
    ("given", "scraped"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/metrics"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/metrics"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/metrics"),
        ("127.0.0.1:8080", "http://127.0.0.1:8080/metrics"),
        ("https://cache.example/smartcache/v1/", "https://cache.example/smartcache/metrics"),
        ("http://h:1/metrics", "http://h:1/metrics"),
    ],
)
def test_metrics_url(given: str, scraped: str) -> None:
    assert metrics_url(given) == scraped


# --- every response says why ------------------------------------------------------------------------


async def test_every_response_says_why_hits_and_bypasses_too(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    client = proxy.client(**{"x-smartcache-session": "why-1"})
    first = await ask(client, FIRST_QUESTION)
    again = await ask(proxy.client(**{"x-smartcache-session": "why-2"}), FIRST_QUESTION)  # in its own: no regenerate
    history = [{"role": "user", "content": FIRST_QUESTION}, {"role": "assistant", "content": first.content}]
    thanks = await ask(client, "Got it, thanks!", history)
    long = await ask(proxy.client(**{"x-smartcache-session": "why-3"}), "Summarise this: " + "lorem ipsum " * 4_000)
    said = [(t.status, t.headers.get("x-cache-reason")) for t in (first, again, thanks, long)]
    assert said == [
        ("miss", "no_candidate"),
        ("hit", "exact_repeat"),
        ("bypass", "acknowledgement"),  # asks nothing: not a topic switch, and its answer is the conversation's
        ("bypass", "too_long"),
    ]


@pytest.mark.parametrize("text", ["great", "嗯", "Got it, thanks!", "好的，谢谢"])
async def test_an_acknowledgement_is_forwarded_and_never_kept(make_proxy: ProxyFactory, text: str) -> None:
    proxy = await make_proxy()
    history = [{"role": "user", "content": FIRST_QUESTION}, {"role": "assistant", "content": "Mount Elbrus."}]
    for session in ("ack-1", "ack-2"):
        turn = await ask(proxy.client(**{"x-smartcache-session": session}), text, history)
        assert (turn.status, turn.headers.get("x-cache-reason")) == ("bypass", "acknowledgement")
    assert (await scrape(proxy)).records.get("ready", 0) == 0


# --- the dashboard's metrics exist from the start ---------------------------------------------------


def dashboard_metric_names() -> set[str]:
    """The raw metric names the shipped dashboard reads, through the recording rules it names."""
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    dashboard = json.loads((deploy / "grafana" / "dashboards" / "smartcache.json").read_text(encoding="utf-8"))
    rules = yaml.safe_load((deploy / "prometheus" / "rules.yml").read_text(encoding="utf-8"))
    recorded = {r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    exprs = [t["expr"] for p in dashboard["panels"] for q in (p, *p.get("panels", [])) for t in q.get("targets", [])]
    names: set[str] = set()
    while exprs:
        for name in re.findall(r"\bsmartcache[a-zA-Z0-9_:]*", exprs.pop()):
            if name in recorded:
                exprs.append(recorded.pop(name))
            elif ":" not in name:
                names.add(name)
    return names


async def test_every_metric_the_dashboard_reads_is_there_before_any_request(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    async with aiohttp.ClientSession() as session, session.get(metrics_url(proxy.base_url)) as resp:
        text = await resp.text()
    exposed = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    read = dashboard_metric_names()
    assert {"smartcache_evictions_total", "smartcache_requests_total", "smartcache_upstream_errors_total"} <= read
    assert read - exposed == set()
