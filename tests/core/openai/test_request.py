from __future__ import annotations

import orjson
import pytest

from proxy.core.errors import InvalidRequest
from proxy.core.openai.request import (
    MAX_CACHEABLE_CHARS,
    completion_chunks,
    parse_cache_control,
    parse_chat_request,
)


def body(**kw: object) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


def test_cache_field_is_stripped_and_controls_merged() -> None:
    req = parse_chat_request(
        body(cache={"no_store": True, "ttl": 60, "namespace": "ns"}), cache_control="max-age=30, no-cache"
    )
    assert "cache" not in req.forward_body
    assert req.controls.no_store and req.controls.no_cache
    assert req.controls.ttl == 30 and req.controls.namespace == "ns"


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"n": 2}, "n>1"),
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function"}]}, "tools"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "non_text_content",
        ),
        ({"messages": [{"role": "system", "content": "s"}]}, "no_user_turn"),
        ({"n": 1}, None),
    ],
)
def test_bypass_reasons(kw: dict[str, object], reason: str | None) -> None:
    assert parse_chat_request(body(**kw)).bypass_reason == reason


def test_text_parts_are_joined_and_roles_kept() -> None:
    req = parse_chat_request(
        body(
            messages=[
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None},
                {"role": "user", "content": "c"},
            ]
        )
    )
    assert req.system_text == "sys"
    assert [m.role for m in req.turns] == ["user", "assistant", "user"]
    assert req.turns[0].text == "a\nb"
    assert req.last_user_text == "c"


@pytest.mark.parametrize("header", ["max-age=abc", "max-age="])
def test_bad_cache_control_is_a_client_error(header: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_cache_control(header)


def test_chunks_form_a_valid_stream() -> None:
    events = completion_chunks(completion_id="chatcmpl-x", model="m", content="hello world " * 5, include_usage=True)
    assert events[-1] == b"data: [DONE]\n\n"
    decoded = [orjson.loads(e[6:]) for e in events[:-1]]
    assert decoded[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(d["choices"][0]["delta"].get("content", "") for d in decoded if d["choices"])
    assert text == "hello world " * 5
    assert decoded[-2]["choices"][0]["finish_reason"] == "stop"
    assert decoded[-1]["choices"] == [] and decoded[-1]["usage"]["total_tokens"] == 0


def test_a_conversation_longer_than_the_cache_reads_is_forwarded_uncached() -> None:
    at_limit = {"model": "m", "messages": [{"role": "user", "content": "x" * MAX_CACHEABLE_CHARS}]}
    over = {"model": "m", "messages": [{"role": "system", "content": "s" * 10}, at_limit["messages"][0]]}
    assert parse_chat_request(orjson.dumps(at_limit)).bypass_reason is None
    assert parse_chat_request(orjson.dumps(over)).bypass_reason == "too_long"


@pytest.mark.parametrize(
    ("kw", "cap"),
    [
        ({}, None),
        ({"max_tokens": 96}, 96),
        ({"max_completion_tokens": 64, "max_tokens": 96}, 64),  # the newer name wins, as upstream
        ({"max_tokens": None}, None),  # a limit that is not a positive integer is refused (test_params)
    ],
)
def test_the_answer_cap_is_the_requests_own_token_limit(kw: dict[str, object], cap: int | None) -> None:
    assert parse_chat_request(body(**kw)).answer_cap == cap


def test_the_parameters_that_shape_the_answer_name_the_records_pool_and_still_go_upstream() -> None:
    plain = parse_chat_request(body(cache={"namespace": "ns"}, temperature=0.2))
    assert (plain.shaping, plain.record_namespace) == ("", "ns")
    json_mode = parse_chat_request(body(cache={"namespace": "ns"}, response_format={"type": "json_object"}))
    assert json_mode.shaping and json_mode.record_namespace == "ns\x1f" + json_mode.shaping
    assert json_mode.forward_body["response_format"] == {"type": "json_object"}
    assert parse_chat_request(body(seed=7)).record_namespace == "\x1f" + parse_chat_request(body(seed=7)).shaping


@pytest.mark.parametrize("namespace", ["a\x1fb", "line\nbreak", "\x7f"])
def test_a_namespace_with_a_control_character_is_refused(namespace: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(body(cache={"namespace": namespace}))
    assert caught.value.param == "cache.namespace"


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"temperature": 1.5}, "high_temperature"),
        ({"modalities": ["text", "audio"]}, "audio_output"),
        ({"web_search_options": {}}, "web_search"),
        ({"n": 2, "temperature": 1.5}, "n>1"),  # the request's own shape is named first
    ],
)
def test_parameters_that_ask_for_what_a_cache_cannot_give_bypass_it(kw: dict[str, object], reason: str) -> None:
    assert parse_chat_request(body(**kw)).bypass_reason == reason
