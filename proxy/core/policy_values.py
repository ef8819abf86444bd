"""The values a policy file may hold: one converter per key, each refusing a bad value with a
reason that names what was expected (the loader adds the file and the dotted key)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, cast, get_args

from proxy.core.errors import ConfigError
from proxy.core.model import SCOPES

Check = Literal["budget", "dates", "counts", "entities"]

CHECKS: tuple[Check, ...] = get_args(Check)

JudgeMode = Literal["off", "async", "race"]

JUDGE_MODES: tuple[JudgeMode, ...] = get_args(JudgeMode)
WidenBy = Literal["scores", "judge"]
WIDEN_BY: tuple[WidenBy, ...] = get_args(WidenBy)


class BadValue(ConfigError):
    """One value's problem, before it learns its file and key."""


def _as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadValue(f"expected true or false, got {describe(value)}")
    return value


def _as_unit(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadValue(f"expected a number between 0 and 1, got {describe(value)}")
    if not 0.0 <= value <= 1.0:
        raise BadValue(f"{value} is outside [0, 1]; cosine thresholds and scores lie between 0 and 1")
    return float(value)


def _as_optional_unit(value: Any) -> float | None:
    return None if value is None else _as_unit(value)


def _as_error_rate(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadValue(
            f"expected a rate of wrong answers such as 0.005, or null for no learned levels, got {describe(value)}"
        )
    if not 0.0 < value < 1.0:
        raise BadValue(f"{value} is outside (0, 1): a rate of wrong answers, such as 0.005 for one in 200")
    return float(value)


def _as_probability(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadValue(f"expected a probability between 0 and 1, or null for no verification, got {describe(value)}")
    if not 0.0 <= value <= 1.0:
        raise BadValue(f"{value} is outside [0, 1]; the verifier's calibrated probabilities lie between 0 and 1")
    return float(value)


def _as_positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadValue(f"expected a whole number, got {describe(value)}")
    if value < 1:
        raise BadValue(f"{value} must be at least 1")
    return value


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise BadValue(f"{describe(value)} is not one of: {', '.join(options)}")
        return value

    return convert


def _as_checks(value: Any) -> tuple[Check, ...]:
    items = _as_texts(value)
    for item in items:
        if item not in CHECKS:
            raise BadValue(f"unknown check {item!r}; use any of: {', '.join(CHECKS)}")
    if len(set(items)) != len(items):
        raise BadValue("a check is listed twice; list each once")
    return cast(tuple[Check, ...], items)


def _as_texts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise BadValue(f"expected a list of strings, got {describe(value)}")
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise BadValue(
                f"expected non-empty strings, got {describe(item)}; quote values such as yes, "
                "no, on or 1.5 so YAML keeps them as text"
            )
    return tuple(item.strip() for item in value)


def _as_intent_names(value: Any) -> frozenset[str]:
    items = _as_texts(value)
    if len(set(items)) != len(items):
        raise BadValue("an intent is listed twice; list each once")
    return frozenset(items)


_SCOPE = _choice(SCOPES)
CONVERTERS: Mapping[str, Callable[[Any], Any]] = MappingProxyType(
    {
        "cache": _as_bool,
        "accept": _as_unit,
        "candidate": _as_unit,
        "direct_hit": _as_bool,
        "validate": _as_checks,
        "ttl": _as_positive_int,
        "scope": _SCOPE,
        "widen_to": _SCOPE,
        "widen_by": _choice(WIDEN_BY),
        "global_safe": _as_bool,
        "feedback_floor": _as_unit,
        "prewarm": _as_bool,
        "restatement": _as_bool,
        "repeats_widen_to": _choice(("session", "user", "tenant")),
        "verify_accept": _as_probability,
        "verify_previous": _as_probability,
        "verify_top": _as_positive_int,
        "judge": _choice(JUDGE_MODES),
        "judge_top": _as_positive_int,
        "judge_floor": _as_optional_unit,
        "judge_deadline_ms": _as_positive_int,
        "judge_verify": _as_probability,
        "judge_near": _as_optional_unit,
        "judge_near_again": _as_optional_unit,
        "judge_near_opening": _as_optional_unit,
        "max_error": _as_error_rate,
        "audit_rate": _as_unit,
        "labels_per_user": _as_positive_int,
        "exemplars": _as_texts,
        "keywords": _as_texts,
        "force": _as_bool,
        "neighbours": _as_intent_names,
        "min_similarity": _as_unit,
        "margin": _as_unit,
        "followup_max_chars": _as_positive_int,
        "topic_switch_similarity": _as_unit,
        "never_cache_reader": _as_bool,
    }
)


def type_name(value: Any) -> str:
    return {
        type(None): "nothing",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def describe(value: Any) -> str:
    return f"{type_name(value)} ({value!r})" if not isinstance(value, dict | list) else type_name(value)
