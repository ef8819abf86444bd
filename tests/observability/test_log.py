"""The JSON log: library loggers (httpx, aiohttp.access) come through the same JSON pipeline and
only from WARNING, and credentials are redacted wherever they appear: in fields, in messages, in
URLs' query strings, in headers."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from proxy.observability.log import LIBRARY_LOGGERS, configure_logging, redact_secrets

SECRET = "s3cr3t-value-42"


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """configure_logging is the program's one global call: undo it after each test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lib_level in levels.items():
        logging.getLogger(name).setLevel(lib_level)
    structlog.reset_defaults()


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_library_lines_are_json_from_warning_and_redacted(
    restored_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info")
    httpx_log = logging.getLogger("httpx")
    httpx_log.info('HTTP Request: GET http://up:8000/v1/models?api-key=%s "HTTP/1.1 200 OK"', SECRET)
    logging.getLogger("aiohttp.access").info("127.0.0.1 GET /v1/models?key=%s 200", SECRET)
    httpx_log.warning("retrying http://up:8000/v1/files?token=%s&limit=5", SECRET)
    structlog.get_logger("smartcache").info("cache.ready", upstream=f"http://up:8000/v1?api_key={SECRET}")
    captured = capsys.readouterr()
    everything = captured.out + captured.err
    assert SECRET not in everything
    lines = _json_lines(captured.out)  # one stream, every line JSON
    assert [(line["event"][:8], line["level"]) for line in lines] == [("retrying", "warning"), ("cache.re", "info")]
    assert lines[0]["logger"] == "httpx"
    assert lines[0]["event"] == "retrying http://up:8000/v1/files?token=[redacted]&limit=5"
    assert lines[1]["upstream"] == "http://up:8000/v1?api_key=[redacted]"


def test_a_traceback_is_redacted_like_every_other_field(
    restored_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info")
    try:
        raise RuntimeError(f"upstream refused http://up:8000/v1/models?api_key={SECRET} with Bearer {SECRET}")
    except RuntimeError:
        structlog.get_logger("smartcache").exception("upstream.failed")
    out = capsys.readouterr().out
    assert SECRET not in out
    (line,) = _json_lines(out)
    assert "RuntimeError" in line["exception"] and "api_key=[redacted]" in line["exception"]


def test_debug_level_does_not_open_the_library_loggers(
    restored_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("debug")
    logging.getLogger("httpx").info("HTTP Request: GET http://up/v1/models")
    logging.getLogger("httpcore.connection").debug("connect_tcp.started host='up'")
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("authorization", f"Bearer {SECRET}", "[redacted]"),
        ("api_key", SECRET, "[redacted]"),
        ("x-api-key", SECRET, "[redacted]"),
        ("admin_token", SECRET, "[redacted]"),
        ("url", f"http://h/v1/models?api-key={SECRET}", "http://h/v1/models?api-key=[redacted]"),
        ("url", f"http://h/v1/models?a=1&key={SECRET}#x", "http://h/v1/models?a=1&key=[redacted]#x"),
        ("url", f"http://h/v1?access_token={SECRET}", "http://h/v1?access_token=[redacted]"),
        ("url", "http://h/v1/models?monkey=banana", "http://h/v1/models?monkey=banana"),
        ("event", f"sent Authorization: Bearer {SECRET} upstream", "sent Authorization: Bearer [redacted] upstream"),
        ("event", f"header authorization='Basic {SECRET}'", "header authorization='Basic [redacted]'"),
        (
            "headers",
            {"Authorization": f"Bearer {SECRET}", "accept": "x"},
            {"Authorization": "[redacted]", "accept": "x"},
        ),
        ("reason", "miss", "miss"),
        ("score", 0.93, 0.93),
    ],
)
def test_redaction(field: str, value: Any, expected: Any) -> None:
    assert redact_secrets(None, "info", {field: value})[field] == expected


def test_scrubbing_without_a_credentials_mark_changes_nothing_the_patterns_would() -> None:
    """``scrub`` skips the substitutions for text without "=", "bearer" or "basic": on text built
    from credential forms, their case and Unicode variants, it agrees with the substitutions."""
    import itertools
    import random

    from proxy.observability.log import _CREDENTIAL, _QUERY_SECRET, REDACTED, scrub

    parts = [
        "Bearer",
        "BEARER",
        "bEaReR",
        "Basic",
        "BASIC",
        "Baſic",
        "basic",
        "?api_key",
        "&token",
        ";sig",
        "?key",
        "=",
        " ",
        "\t",
        SECRET,
        "x",
        "sk-1",
        "Authorization:",
        "https://h/v1",
        "KEY",
        "keys",
    ]
    rng = random.Random(3)
    for n in itertools.chain(range(1, 4), [6] * 3000):
        text = "".join(rng.choice(parts) for _ in range(n))
        want = _CREDENTIAL.sub(rf"\1\2{REDACTED}", _QUERY_SECRET.sub(rf"\1{REDACTED}", text))
        assert scrub(text) == want, text


# --- debug without the libraries' traces, and one JSON object a line ------------------------------


async def test_debug_keeps_aiosqlites_traces_out_unless_asked(
    restored_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    import aiosqlite

    async def run() -> list[dict[str, Any]]:
        async with aiosqlite.connect(":memory:") as db:
            await db.execute("create table t (x)")
            await db.execute("insert into t values (1)")
        # the worker thread logs its last line after the close returns: joined, so that line is
        # this test's, never one in a later test's stream
        db._thread.join(timeout=5)
        structlog.get_logger("smartcache").debug("cache.lookup", candidates=0)
        return _json_lines(capsys.readouterr().out)

    configure_logging("debug")
    assert [line["event"] for line in await run()] == ["cache.lookup"]
    configure_logging("debug", libraries="debug")
    lines = await run()
    assert {line.get("logger") for line in lines} >= {"aiosqlite", None}
    assert lines[-1]["event"] == "cache.lookup"


def test_libraries_never_open_below_log_level(restored_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning", libraries="debug")
    logging.getLogger("aiosqlite").info("executing")
    structlog.get_logger("smartcache").info("cache.lookup")
    assert capsys.readouterr().out == ""


class _InterruptedStream(io.StringIO):
    """Once armed, the first write lets another thread log a library record and waits a moment
    for it: were the line's newline a write of its own, the record would land before it, two
    objects glued on one line."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.other: threading.Thread | None = None

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.armed:
            self.armed = False
            self.other = threading.Thread(target=logging.getLogger("aiosqlite").warning, args=("from a thread",))
            self.other.start()
            self.other.join(timeout=0.5)  # blocked by the writer's lock until the line is whole
        return written


def test_a_library_record_from_another_thread_never_glues_onto_a_line(restored_logging: None) -> None:
    stream = _InterruptedStream()
    configure_logging("info", stream=stream)
    stream.armed = True
    structlog.get_logger("smartcache").info("chat.request", status="miss")
    assert stream.other is not None
    stream.other.join()
    lines = stream.getvalue().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["chat.request", "from a thread"]
