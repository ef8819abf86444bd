"""The request parameters that shape the answer, and what each does to a lookup.

A cached answer is served only to a request that asked for the same thing: the same conversation
(the signature) and the same answer-shaping parameters. Every body field is in one of four
classes (the README's "What a hit must match" has the table and the reasons):

- **ignored**: how the answer travels or who asked (``stream``, ``user``, ``metadata``, ...), and
  sampling near the model's mode (``temperature`` up to 1, ``top_p``): any answer of the model to
  the conversation is one such a request may be given;
- **handled elsewhere**: ``model`` and ``messages`` (the signature), ``n`` and ``logprobs``
  (bypass: ``request._bypass_reason``), ``max_tokens`` (``ChatRequest.answer_cap``: a whole answer
  is served only where it fits, a cut one to its own limit alone);
- **bypass** (``read_params(...).bypass``): audio output, web search, a temperature above 1;
- **partition**: everything else, known or not (``response_format``, ``stop``, ``seed``,
  ``reasoning_effort``, ``logit_bias``, a vendor's ``chat_template_kwargs``, ...). Their canonical
  values are hashed into ``digest``: a request is looked up, and its answer stored, in the pool
  of that digest alone. A field we do not know partitions, because it may change the answer.

A field at its default value (None, an empty list or object, ``response_format: text``, a zero
penalty, ``modalities: ["text"]``) is the plain request's: it partitions nothing, so a client
that spells out the defaults shares the plain pool. Pure: no IO.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.errors import InvalidRequest
from proxy.core.model import Reason

# A caller asking for more variety than the API's default sampling (temperature 1) is asking for
# another answer each time; a cache replays one. At or below it, any answer of the model is one
# such a request could have got (GPTCache skips its cache with a probability rising with the
# temperature; a threshold gives the same request the same treatment every time).
MAX_CACHED_TEMPERATURE = 1.0

IGNORED = frozenset(
    {
        # the signature's own, and ours (``cache`` is removed before the body goes upstream)
        "model",
        "messages",
        "cache",
        # delivery and bookkeeping: not what the answer says
        "stream",
        "stream_options",
        "user",
        "safety_identifier",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        # read by the bypass rules (n > 1, logprobs) and the token-limit rule (answer_cap)
        "n",
        "logprobs",
        "top_logprobs",
        "max_tokens",
        "max_completion_tokens",
        # sampling near the mode (a temperature above MAX_CACHED_TEMPERATURE bypasses)
        "temperature",
        "top_p",
        "top_k",
        "min_p",
    }
)

# values that mean "as if absent"; None, [] and {} are that for every field
_DEFAULTS: Mapping[str, object] = {
    "response_format": {"type": "text"},
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "repetition_penalty": 1,
    "modalities": ["text"],
}
_ABSENT = object()
_DIGEST_CHARS = 16


@dataclass(frozen=True, slots=True)
class AnswerParams:
    """What the request's parameters say about the cache: the pool they partition into ("" for a
    plain request) and a reason to bypass the cache altogether."""

    digest: str = ""
    bypass: Reason | None = None


def read_params(body: Mapping[str, Any]) -> AnswerParams:
    """Check the parameters the cache reads (a bad one is a 400 naming it) and classify them."""
    for name, check in _CHECKS.items():
        value = body.get(name)
        if value is not None:
            check(name, value)
    return AnswerParams(shaping_digest(body), _bypass(body))


def shaping_digest(body: Mapping[str, Any]) -> str:
    """A short hash of the parameters that partition the cache, "" when there are none."""
    shaping = {}
    for name, value in body.items():
        if name in IGNORED or value is None or value == [] or value == {} or value == "":
            continue
        canonical = _canonical(_stops(value) if name == "stop" else value)
        if canonical != _DEFAULTS.get(name, _ABSENT):
            shaping[name] = canonical
    if not shaping:
        return ""
    material = orjson.dumps(shaping, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.sha256(material).hexdigest()[:_DIGEST_CHARS]


def _bypass(body: Mapping[str, Any]) -> Reason | None:
    modalities = body.get("modalities") or ()
    if body.get("audio") is not None or any(m != "text" for m in modalities):
        return Reason.AUDIO_OUTPUT  # the cache keeps text
    if body.get("web_search_options") is not None:
        return Reason.WEB_SEARCH  # read from the web at the time of asking
    temperature = body.get("temperature")
    if temperature is not None and temperature > MAX_CACHED_TEMPERATURE:
        return Reason.HIGH_TEMPERATURE
    return None


def _stops(value: Any) -> list[str]:
    """The stop sequences as a set: one string or a list, in any order, repeats aside."""
    return sorted({value} if isinstance(value, str) else set(value))


def _canonical(value: Any) -> Any:
    """One spelling of a JSON value: 1.0 is 1 (object keys are sorted when hashed); a whole float
    past what a 64-bit integer holds stays a float, as the JSON encoder can write no such integer."""
    if isinstance(value, float) and value.is_integer() and -(2**63) <= value < 2**64:
        return int(value)
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


# ---- the checks: types and the ranges every OpenAI-compatible engine shares ------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(name: str, value: Any) -> None:
    if not _is_int(value) or value < 1:
        raise InvalidRequest(f"'{name}' must be a positive integer, got {value!r}", param=name)


def _non_negative_int(name: str, value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise InvalidRequest(f"'{name}' must be a non-negative integer, got {value!r}", param=name)


def _integer(name: str, value: Any) -> None:
    if not _is_int(value):
        raise InvalidRequest(f"'{name}' must be an integer, got {value!r}", param=name)


def _number(name: str, value: Any) -> None:
    if not _is_number(value):
        raise InvalidRequest(f"'{name}' must be a number, got {value!r}", param=name)


def _temperature(name: str, value: Any) -> None:
    if not _is_number(value) or value < 0:
        raise InvalidRequest(f"'{name}' must be a number of at least 0, got {value!r}", param=name)


def _unit(name: str, value: Any) -> None:
    if not _is_number(value) or not 0 <= value <= 1:
        raise InvalidRequest(f"'{name}' must be a number between 0 and 1, got {value!r}", param=name)


def _boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be a boolean", param=name)


def _string(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string", param=name)


def _array(name: str, value: Any) -> None:
    if not isinstance(value, list):
        raise InvalidRequest(f"'{name}' must be an array", param=name)


def _strings(name: str, value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest(f"'{name}' must be an array of strings", param=name)


def _stop(name: str, value: Any) -> None:
    if not isinstance(value, str) and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise InvalidRequest(f"'{name}' must be a string or an array of strings", param=name)


def _response_format(name: str, value: Any) -> None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidRequest(f"'{name}' must be an object with a string 'type'", param=name)


def _logit_bias(name: str, value: Any) -> None:
    if not isinstance(value, dict) or not all(_is_number(v) for v in value.values()):
        raise InvalidRequest(f"'{name}' must be an object of token ids to numbers", param=name)


_CHECKS: Mapping[str, Callable[[str, Any], None]] = {
    "max_tokens": _positive_int,
    "max_completion_tokens": _positive_int,
    "temperature": _temperature,
    "top_p": _unit,
    "seed": _integer,
    "frequency_penalty": _number,
    "presence_penalty": _number,
    "stop": _stop,
    "response_format": _response_format,
    "logit_bias": _logit_bias,
    "reasoning_effort": _string,
    "modalities": _strings,
    "tools": _array,
    "functions": _array,
    "logprobs": _boolean,
    "top_logprobs": _non_negative_int,
}
