"""structlog set-up: JSON lines, one canonical line per request, secrets redacted."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import structlog

SECRET_KEYS = frozenset({"authorization", "api_key", "admin_token", "password", "token"})


def redact_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if key.lower() in SECRET_KEYS:
            event[key] = "[redacted]"
    return event


def configure_logging(level: str = "info") -> None:
    """The one global call of the program, made by the CLI (never at import)."""
    numeric = logging.getLevelName(level.upper())
    logging.basicConfig(level=numeric, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=True,
    )
