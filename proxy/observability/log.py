"""structlog set-up: JSON lines, one canonical line per request, secrets redacted.

Library loggers (every stdlib logger: aiosqlite, httpx, httpcore, aiohttp, asyncio, ...) go
through the same processors, so the log stays one JSON stream, and only from WARNING whatever
``log_level`` says, unless ``log_libraries`` asks for more: at debug aiosqlite traces every SQL
statement (970 of 982 lines of a debug run), and httpx logs every request URL at INFO, query string
included, which may carry a key (``?api-key=``, Azure's and some gateways' style).

Every line is exactly one JSON object: structlog's lines and the library records' are written by
one writer, each line in one write under one lock. (structlog's PrintLogger prints the line and
its newline as two writes under a lock of its own, so a library record written from another
thread, aiosqlite's, could land between them: two objects glued on one line.)
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO

import structlog

# field names compared lower-case with "-" as "_"
SECRET_KEYS = frozenset(
    {
        "authorization",
        "proxy_authorization",
        "api_key",
        "apikey",
        "x_api_key",
        "admin_token",
        "access_token",
        "password",
        "secret",
        "token",
        "cookie",
        "set_cookie",
    }
)
# set one by one too, for a library that sets its own level; the root's covers the rest
LIBRARY_LOGGERS = ("aiosqlite", "httpx", "httpcore", "aiohttp", "aiohttp.access", "asyncio", "redis", "filelock")
LEVELS = ("debug", "info", "warning", "error")
REDACTED = "[redacted]"
_QUERY_SECRET = re.compile(
    r"(?i)([?&;](?:api[-_]?key|key|token|access[-_]?token|refresh[-_]?token|auth|secret|password|sig|signature)=)"
    r"[^&#\s'\"]+"
)
_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]+")
_HANDLER_NAME = "smartcache-json"


def scrub(text: str) -> str:
    """Credentials inside free text: query-string keys and Authorization schemes."""
    lowered = text.casefold()  # as the patterns' (?i) matches: "Baſic" is "basic" to them
    # every log line scrubs a score of short values, and nearly none holds either form: two
    # substring tests spare them the substitutions, the most of what a line cost
    if "=" not in text and "bearer" not in lowered and "basic" not in lowered:
        return text
    return _CREDENTIAL.sub(rf"\1\2{REDACTED}", _QUERY_SECRET.sub(rf"\1{REDACTED}", text))


# A process-wide memo, kept on purpose: a pure function of its argument over a constant set, so
# no app can see another's use of it; it holds field names, never values, and is bounded.
@functools.lru_cache(maxsize=4096)
def _secret_key(key: str) -> bool:
    """A field name that holds a secret whatever its value (a line's names recur: kept once)."""
    return key.lower().replace("-", "_") in SECRET_KEYS


def _redacted(key: str, value: Any, depth: int) -> Any:
    if _secret_key(key):
        return REDACTED
    if isinstance(value, str):
        return scrub(value)
    if depth > 0 and isinstance(value, Mapping):
        return {k: _redacted(str(k), v, depth - 1) for k, v in value.items()}
    if depth > 0 and isinstance(value, list | tuple):
        return [_redacted("", v, depth - 1) for v in value]
    return value


def redact_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if not key.startswith("_"):  # structlog's own bookkeeping (_record, _from_structlog)
            event[key] = _redacted(key, event[key], depth=2)
    return event


class JsonLines:
    """The one writer of the log's stream: a line and its newline in one write, under one lock,
    whichever thread writes it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()


class LineLogger:
    """structlog's logger: hands the rendered line to the writer, whatever the level's name."""

    def __init__(self, lines: JsonLines) -> None:
        self._lines = lines

    def msg(self, message: str) -> None:
        self._lines.write(message)

    log = debug = info = warn = warning = err = error = critical = exception = fatal = failure = msg


class LineHandler(logging.Handler):
    """The stdlib's handler: library records, rendered by structlog's formatter, to the writer."""

    def __init__(self, lines: JsonLines) -> None:
        super().__init__()
        self._lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.write(self.format(record))
        except Exception:
            self.handleError(record)


def configure_logging(level: str = "info", *, libraries: str = "warning", stream: TextIO | None = None) -> None:
    """The one global call of the program, made by the CLI (never at import). ``libraries``: the
    level from which stdlib (third-party) loggers are written, never below ``level``;
    ``stream``: where the JSON lines go, stdout by default."""
    numeric = logging.getLevelName(level.upper())
    library_level = max(numeric, logging.getLevelName(libraries.upper()))
    lines = JsonLines(stream if stream is not None else sys.stdout)
    shared: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    # tracebacks are text like any other field: formatted first, so the redaction reads them too
    render: list[Any] = [structlog.processors.format_exc_info, redact_secrets, structlog.processors.JSONRenderer()]
    handler = LineHandler(lines)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if h.get_name() != _HANDLER_NAME] + [handler]
    # no logger of ours is a stdlib one: the root's level is the libraries' (a record below it is
    # never even made, which aiosqlite's per-statement traces would cost)
    root.setLevel(library_level)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(library_level)
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *shared, *render],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *_: LineLogger(lines),
        cache_logger_on_first_use=True,
    )
