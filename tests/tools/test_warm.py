"""Warmed records are reachable by real requests: keyed by the clients' model, API key and session."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

import proxy.cli
from proxy.cli import build_parser, main
from proxy.http import keys
from tests.conftest import ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat

SYSTEM = "You are a helpful assistant."
QUESTION = "What is the boiling point of water at sea level?"
ANSWER = "100 degrees Celsius at sea level (warmed)."


def _trace(path: Path, *turns: dict[str, str]) -> Path:
    conv = {
        "id": "w-1",
        "category": "warm",
        "tenant": "trace-tenant",
        "session": "trace-session-1",
        "system": SYSTEM,
        "turns": list(turns) or [{"user": QUESTION, "key": "K1", "answer": ANSWER}],
    }
    path.write_text(json.dumps(conv) + "\n", encoding="utf-8")
    return path


async def _warm(
    tmp_path: Path, model_home: Path, monkeypatch: pytest.MonkeyPatch, *flags: str, turns: Sequence[dict[str, str]] = ()
) -> None:
    monkeypatch.setenv("SMARTCACHE_MODEL_HOME", str(model_home))
    # the command configures structlog for the whole process; later tests capture its logs
    monkeypatch.setattr(proxy.cli, "configure_logging", lambda level, **_: None)
    argv = ["warm", str(_trace(tmp_path / "t.jsonl", *turns)), "--data-dir", str(tmp_path / "data"), *flags]
    assert await asyncio.to_thread(main, argv) == 0


@pytest.mark.slow
async def test_a_warmed_answer_is_served_to_a_client_with_that_key_and_model(
    make_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path, model_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _warm(tmp_path, model_home, monkeypatch, "--model", "m", "--api-key", "key-A")
    proxy = await make_proxy()
    status, text, _ = await chat(proxy.client("key-A"), ask(QUESTION))  # no session header, as most clients
    assert (status, text) == ("hit", ANSWER)
    assert upstream.script.calls == []
    status, _, _ = await chat(proxy.client("key-B"), ask(QUESTION))
    assert status == "miss"  # another tenant never sees it


@pytest.mark.slow
async def test_without_an_api_key_each_conversations_tenant_is_its_key(
    make_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path, model_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _warm(tmp_path, model_home, monkeypatch, "--model", "m", "--keep-sessions")
    proxy = await make_proxy()
    client = proxy.client("trace-tenant", **{"x-smartcache-session": "trace-session-1"})
    status, text, _ = await chat(client, ask(QUESTION))
    assert (status, text) == ("hit", ANSWER)


@pytest.mark.slow
async def test_warm_keeps_what_the_proxy_keeps_of_a_request_it_never_looked_up(
    make_proxy: ProxyFactory, tmp_path: Path, model_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An intent never cached leaves no record; a turn that left its topic is kept, as the proxy
    keeps it."""
    turns = [
        {"user": "周末去杭州玩三天，帮我排一个行程", "key": "T", "answer": "第一天西湖，第二天灵隐寺。(warmed)"},
        {"user": "明天的会议纪要帮我整理一下", "key": "M", "answer": "请把会议记录发给我。(warmed)"},
        {"user": "今天杭州天气怎么样？", "key": "W", "answer": "晴。(warmed)"},
    ]
    await _warm(tmp_path, model_home, monkeypatch, "--model", "m", "--api-key", "key-A", turns=turns)
    proxy = await make_proxy()
    kept = [(r.answer_text, r.coarse_tags.context_switch) async for r in proxy.app[keys.CACHE].store.iter_live()]
    assert sorted(kept) == sorted([(turns[0]["answer"], False), (turns[1]["answer"], True)])


def test_warm_help_offers_its_own_flags_and_no_serve_only_ones() -> None:
    sub = build_parser()._subparsers._group_actions[0].choices["warm"]  # type: ignore[union-attr]
    flags = {opt for action in sub._actions for opt in action.option_strings}
    assert {"--model", "--api-key", "--keep-sessions", "--data-dir", "--policy"} <= flags
    assert not flags & {"--upstream", "--port", "--host", "--flavour", "--ready-after"}


def test_warm_needs_the_model_clients_send() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["warm", "t.jsonl"])


def test_warm_refuses_a_data_dir_a_running_proxy_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running proxy's index lives in memory: records written beside it would never be served
    by it (the "4 records written" it never serves). Warm takes the proxy's lock, or says why not."""
    from proxy.service.datadir import data_dir_lock

    monkeypatch.setattr(proxy.cli, "configure_logging", lambda level, **_: None)
    data = tmp_path / "data"
    with data_dir_lock(data):  # as `smartcache serve` holds it
        code = main(["warm", str(_trace(tmp_path / "t.jsonl")), "--model", "m", "--data-dir", str(data)])
    assert code == 2
    captured = capsys.readouterr()
    assert "records written" not in captured.out
    (line,) = captured.err.splitlines()
    assert line.startswith(f"error: {data}: data_dir: in use by another SmartCache process")
    assert "Stop the proxy, warm, then start it again" in line and "store: redis" in line


def test_warm_help_says_it_runs_with_the_proxy_stopped() -> None:
    sub = build_parser()._subparsers._group_actions[0].choices["warm"]  # type: ignore[union-attr]
    text = " ".join(sub.format_help().split())
    assert "with the proxy stopped" in text and "lock" in text and "Redis" in text
