"""`smartcache demo` for real: the embedded llama.cpp engine, the proxy in front of it and the
offline embedder, run as the command a new user types. This is also the test of the main job's
pieces: the engine comes up, the proxy comes up in front of it, a repeated question is a hit,
and stopping the proxy stops the engine."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import sys
from pathlib import Path

import openai
import pytest

from proxy.settings import load_settings
from proxy.tools.demo import (
    MAX_TOKENS,
    SCRIPT,
    SYSTEM_PROMPT,
    DemoTurn,
    TurnResult,
    demo_settings,
    notes,
    results_table,
)
from tests.conftest import Proxy, Upstream

ROOT = Path(__file__).resolve().parents[2]
ADDRESSES = re.compile(r"proxy (http://127\.0\.0\.1:(\d+)/v1) -> engine http://127\.0\.0\.1:(\d+)/v1")
READY = "Ctrl-C stops the proxy and the engine."


def demo_env(model_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMARTCACHE_")}
    # the pack built once for the test session; the 80 columns of a plain terminal
    return {**env, "SMARTCACHE_MODEL_HOME": str(model_home), "COLUMNS": "80", "PYTHONUNBUFFERED": "1"}


ROW = re.compile(r"^\s*(\d+)\s{2,}")


def table_rows(out: str) -> list[list[str]]:
    """Each turn's first line, as cells: #, the turn's first words, status, sim, ms, saved, kv."""
    return [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if ROW.match(line)]


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def start_demo(tmp_path: Path, model_home: Path, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "demo",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "demo"),
        *extra,
        cwd=ROOT,
        env=demo_env(model_home),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


def check_table(out: str) -> None:
    rows = table_rows(out)
    assert [row[0] for row in rows] == [str(i) for i in range(1, len(SCRIPT) + 1)], out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    # what each turn is said to show is what it showed
    assert [row[2] for row in rows] == [turn.expect for turn in SCRIPT], out
    assert "was expected to be" not in out, out
    for row in rows:
        if row[2] == "hit":
            assert float(row[3]) >= 0.9 and int(row[5]) > 0, row  # a hit saved the tokens of its record
        if row[2] == "bypass":
            assert row[3] == "-" and int(row[5]) == 0, row


@pytest.mark.engine
async def test_demo_once_prints_the_table_and_stops_engine_and_proxy(tmp_path: Path, model_home: Path) -> None:
    proc = await start_demo(tmp_path, model_home, "--once")
    raw, _ = await asyncio.wait_for(proc.communicate(), timeout=240)
    out = raw.decode()
    print(out)
    assert proc.returncode == 0, out
    check_table(out)
    found = ADDRESSES.search(out)
    assert found, out
    assert refused(int(found.group(2))) and refused(int(found.group(3)))
    assert (tmp_path / "demo" / "engine.log").stat().st_size > 0


@pytest.mark.engine
async def test_demo_keeps_serving_until_ctrl_c(tmp_path: Path, model_home: Path) -> None:
    proc = await start_demo(tmp_path, model_home)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        while not lines or READY not in lines[-1]:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=240)
            assert line, "".join(lines)
            lines.append(line.decode())
        out = "".join(lines)
        check_table(out)
        found = ADDRESSES.search(out)
        assert found
        # the user's own requests after the script: a question and its paraphrase, in a session of their own
        client = openai.AsyncOpenAI(
            base_url=found.group(1),
            api_key="mine",
            max_retries=0,
            timeout=120,
            default_headers={"x-smartcache-session": "mine"},
        )
        model = (await client.models.list()).data[0].id
        statuses = []
        for text in ("Give me three tips for sleeping better.", "give me 3 tips for sleeping better"):
            raw = await client.chat.completions.with_raw_response.create(
                model=model,
                max_tokens=MAX_TOKENS,
                temperature=0,
                messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}],
            )
            statuses.append(raw.headers["x-cache-status"])
        assert statuses == ["miss", "hit"]
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), timeout=60)
    assert proc.returncode == 0
    assert refused(int(found.group(2))) and refused(int(found.group(3)))


def test_demo_settings_start_the_local_engine_with_instant_answers(tmp_path: Path) -> None:
    base = load_settings(
        environ={"SMARTCACHE_UPSTREAM": "http://elsewhere:8000/v1"}, overrides={"data_dir": tmp_path / "base"}
    )
    settings = demo_settings(base, port=0)
    assert settings.upstream is None and settings.upstream_flavour == "llamacpp"
    assert settings.data_dir == tmp_path / "base" / "demo" and settings.models_root == tmp_path / "base"
    assert settings.ready_after == 0 and settings.debug_headers and settings.port == 0
    chosen = demo_settings(base, data_dir=tmp_path / "mine")
    assert chosen.data_dir == chosen.models_root == tmp_path / "mine" and chosen.port == base.port


def test_script_is_bilingual_and_shows_every_status() -> None:
    assert 6 <= len(SCRIPT) <= 8
    assert {t.lang for t in SCRIPT} == {"zh", "en"}
    assert {t.expect for t in SCRIPT} == {"miss", "hit", "half-hit", "bypass"}


def result(turn: DemoTurn, status: str, reason: str, similarity: float | None = 0.98765) -> TurnResult:
    return TurnResult(turn, status, reason, similarity, 12.4, 0, 5, "hi")


def rendered(results: list[TurnResult], width: int = 80) -> str:
    from rich.console import Console

    console = Console(record=True, width=width)
    console.print(results_table(results))
    for note in notes(results):
        console.print(note, markup=False, highlight=False)
    return console.export_text()


@pytest.mark.parametrize(("similarity", "shown"), [(None, "-"), (0.98765, "0.99")])
def test_results_table_cells(similarity: float | None, shown: str) -> None:
    out = rendered([result(DemoTurn("en", "hello there", "miss", "first ask"), "miss", "no_candidate", similarity)])
    (row,) = table_rows(out)
    assert row == ["1", "hello there", "miss", shown, "12", "0", "5"]
    assert "no_candidate" in out and "first ask" in out


def test_the_whole_script_fits_80_columns_with_every_turn_whole() -> None:
    """At 80 columns (a plain terminal, or a pipe) the table neither folds its headers nor cuts a
    turn: the turn's text wraps, every other cell stays on its row."""
    results = [result(turn, turn.expect, "modifies_context") for turn in SCRIPT]
    out = rendered(results)
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert re.search(r"^ *# +turn +cache +sim +ms +saved +kv *$", out, re.M), out
    assert [row[2] for row in table_rows(out)] == [turn.expect for turn in SCRIPT]
    for row, turn in zip(table_rows(out), SCRIPT, strict=True):
        assert turn.text.startswith(row[1]) and len(row[1]) >= 10, row  # each begins on its row
    assert "…" not in out  # wrapped (folded, for Chinese), never cut


def test_a_turn_that_came_out_otherwise_is_marked_and_said() -> None:
    turns = [DemoTurn("en", "Give me tips, and one about coffee.", "half-hit", "an addition")]
    out = rendered([result(turns[0], "miss", "below_candidate")])
    (row,) = table_rows(out)
    assert row[2] == "miss !"
    said = " ".join(out.split())
    assert "! turn 1 was expected to be a half-hit (an addition) and was a miss (below_candidate)." in said
    assert "was expected" not in rendered([result(turns[0], "half-hit", "modifies_context")])


async def run_example(proxy: Proxy, *command: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MODEL"))}
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=ROOT,
        env={**env, "OPENAI_BASE_URL": proxy.base_url, "OPENAI_API_KEY": "key-example"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_openai_sdk_example_shows_a_miss_then_a_streamed_hit(proxy: Proxy, upstream: Upstream) -> None:
    out = await run_example(proxy, sys.executable, "examples/openai_sdk.py")
    assert re.search(r"^\[not streamed\] x-cache-status=miss$", out, re.M), out
    hit_line = r"^\[streamed\] x-cache-status=hit x-cache-similarity=(?:0\.9\d+|1\.0000) x-cache-id=sc-\w+ age=\d+$"
    assert re.search(hit_line, out, re.M), out
    answer = "Answer #1 to: Give me three tips for sleeping better."
    assert out.count(answer) == 2  # the hit streamed the very answer the miss stored
    assert len(upstream.script.calls) == 1


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_example_shows_miss_hit_and_a_skipped_lookup(proxy: Proxy, upstream: Upstream) -> None:
    out = await run_example(proxy, "bash", "examples/curl.sh")
    statuses = re.findall(r"^x-cache-status: (\S+)", out, re.M | re.I)
    assert statuses == ["miss", "hit", "miss"], out
    assert 'data: {"id"' in out and "data: [DONE]" in out  # the hit was replayed as SSE
    assert len(upstream.script.calls) == 2  # the Cache-Control: no-cache ask went upstream
