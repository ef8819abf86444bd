"""The request parameters that shape the answer (proxy/core/openai/params.py): which ones partition the
cache, which are ignored, which bypass it, and which values are refused. One row per parameter,
as the README's "What a hit must match" table lists them."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.errors import InvalidRequest
from proxy.core.model import Reason
from proxy.core.openai.params import read_params, shaping_digest

SCHEMA = {
    "name": "colors",
    "strict": True,
    "schema": {"type": "object", "properties": {"colors": {"type": "array", "items": {"type": "string"}}}},
}

# each row asks for another answer than the plain request: its own pool, never the plain one's
PARTITIONS: list[tuple[str, dict[str, Any]]] = [
    ("json_object", {"response_format": {"type": "json_object"}}),
    ("json_schema", {"response_format": {"type": "json_schema", "json_schema": SCHEMA}}),
    ("stop", {"stop": ["red"]}),
    ("seed", {"seed": 7}),
    ("reasoning_effort", {"reasoning_effort": "high"}),
    ("verbosity", {"verbosity": "low"}),
    ("logit_bias", {"logit_bias": {"50256": -100}}),
    ("frequency_penalty", {"frequency_penalty": 0.5}),
    ("presence_penalty", {"presence_penalty": -1}),
    ("tool_choice", {"tool_choice": "none"}),
    ("function_call", {"function_call": "none"}),
    ("parallel_tool_calls", {"parallel_tool_calls": False}),
    ("prediction", {"prediction": {"type": "content", "content": "red, yellow, blue"}}),
    ("vendor extra", {"chat_template_kwargs": {"enable_thinking": False}}),
    ("vendor guided decoding", {"guided_regex": "[a-z]+"}),
]

# the plain request's pool: delivery, identity, sampling near the mode, defaults spelled out
PLAIN: list[tuple[str, dict[str, Any]]] = [
    ("nothing", {}),
    ("stream", {"stream": True, "stream_options": {"include_usage": True}}),
    ("user", {"user": "u-1", "safety_identifier": "s-1", "metadata": {"app": "x"}}),
    ("store and tiers", {"store": True, "service_tier": "auto", "prompt_cache_key": "k"}),
    ("temperature 0", {"temperature": 0}),
    ("temperature 1", {"temperature": 1.0}),
    ("top_p", {"top_p": 0.9, "top_k": 40, "min_p": 0.05}),
    ("token limit", {"max_tokens": 500, "max_completion_tokens": 500}),
    ("n 1, no logprobs", {"n": 1, "logprobs": False, "top_logprobs": None}),
    ("response_format text", {"response_format": {"type": "text"}}),
    ("empty stop", {"stop": []}),
    ("null stop", {"stop": None, "seed": None, "reasoning_effort": None}),
    ("empty logit_bias", {"logit_bias": {}}),
    ("zero penalties", {"frequency_penalty": 0, "presence_penalty": 0.0}),
    ("text modality", {"modalities": ["text"]}),
    ("empty tools", {"tools": [], "functions": []}),
]


@pytest.mark.parametrize(("name", "params"), PARTITIONS, ids=[n for n, _ in PARTITIONS])
def test_a_parameter_that_shapes_the_answer_has_a_pool_of_its_own(name: str, params: dict[str, Any]) -> None:
    read = read_params(params)
    assert read.digest != "" and read.bypass is None, name


def test_every_shaping_parameter_has_a_pool_apart_from_every_other() -> None:
    digests = [read_params(params).digest for _, params in PARTITIONS]
    assert len(set(digests)) == len(digests)


@pytest.mark.parametrize(("name", "params"), PLAIN, ids=[n for n, _ in PLAIN])
def test_delivery_sampling_and_defaults_share_the_plain_pool(name: str, params: dict[str, Any]) -> None:
    assert read_params(params).digest == "", name
    assert read_params(params).bypass is None, name


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"stop": "red"}, {"stop": ["red"]}),
        ({"stop": ["red", "blue"]}, {"stop": ["blue", "red", "red"]}),
        ({"frequency_penalty": 1}, {"frequency_penalty": 1.0}),
        ({"seed": 7, "temperature": 0.2}, {"seed": 7, "stream": True, "max_tokens": 9}),
        ({"response_format": {"json_schema": SCHEMA, "type": "json_schema"}}, PARTITIONS[1][1]),
    ],
)
def test_the_same_request_spelled_two_ways_shares_a_pool(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert read_params(a).digest == read_params(b).digest != ""


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"seed": 7}, {"seed": 8}),
        ({"reasoning_effort": "low"}, {"reasoning_effort": "high"}),
        ({"stop": ["red"]}, {"stop": ["blue"]}),
        (
            {"response_format": {"type": "json_schema", "json_schema": SCHEMA}},
            {"response_format": {"type": "json_schema", "json_schema": {**SCHEMA, "name": "other"}}},
        ),
    ],
)
def test_another_value_is_another_pool(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert read_params(a).digest != read_params(b).digest


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"temperature": 1.5}, Reason.HIGH_TEMPERATURE),
        ({"temperature": 2}, Reason.HIGH_TEMPERATURE),
        ({"temperature": 1.0}, None),
        ({"modalities": ["text", "audio"]}, Reason.AUDIO_OUTPUT),
        ({"audio": {"voice": "alloy", "format": "wav"}}, Reason.AUDIO_OUTPUT),
    ],
)
def test_parameters_that_bypass_the_cache(params: dict[str, Any], reason: Reason | None) -> None:
    assert read_params(params).bypass is reason


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("max_tokens", -5),
        ("max_tokens", 0),
        ("max_tokens", 1.5),
        ("max_tokens", True),
        ("max_tokens", "20"),
        ("max_completion_tokens", -1),
        ("temperature", -0.1),
        ("temperature", "hot"),
        ("top_p", 1.5),
        ("top_p", -0.5),
        ("seed", "7"),
        ("seed", 1.5),
        ("stop", 3),
        ("stop", ["red", 1]),
        ("response_format", "json"),
        ("response_format", {"type": 1}),
        ("response_format", {"schema": {}}),
        ("logit_bias", [1, 2]),
        ("logit_bias", {"50256": "never"}),
        ("frequency_penalty", "high"),
        ("presence_penalty", True),
        ("reasoning_effort", 3),
        ("modalities", "text"),
        ("tools", {"type": "function"}),
        ("functions", "f"),
        ("logprobs", "yes"),
        ("top_logprobs", -1),
    ],
)
def test_a_bad_value_is_a_client_error_naming_its_parameter(param: str, value: Any) -> None:
    with pytest.raises(InvalidRequest) as caught:
        read_params({param: value})
    assert caught.value.param == param
    assert param in caught.value.message


@pytest.mark.parametrize("huge", [1.8446744073709552e19, -1e300, 1e19])
def test_a_whole_number_past_64_bits_still_has_a_pool(huge: float) -> None:
    # such a float was turned into an int the JSON encoder refuses: a 500 instead of an answer
    digest = shaping_digest({"model": "m", "tools": [huge]})
    assert digest and digest != shaping_digest({"model": "m", "tools": [1.0]})
