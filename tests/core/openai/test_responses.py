"""A Responses request read as the chat request the cache keys on: its conversation, its keying
(the same digest as chat's where the parameters agree), its bypass reasons and its 400s."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.conversation import request_hash
from proxy.core.errors import InvalidRequest
from proxy.core.model import Reason
from proxy.core.openai.request import MAX_CACHEABLE_CHARS, Message, chat_request
from proxy.core.openai.responses import Chain, as_chat, continued, parse_responses_request, upstream_body


def responses(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "input": "What is the capital of France?", **kw}


def chat(messages: list[dict[str, str]], **kw: Any) -> Any:
    msgs = tuple(Message(m["role"], m["content"]) for m in messages)
    return chat_request({"model": "m", "messages": messages, **kw}, msgs)


def read(earlier: Chain | None = None, **kw: Any) -> Any:
    return as_chat(parse_responses_request(responses(**kw)), earlier)


def test_instructions_and_input_are_the_conversation_chat_would_send() -> None:
    req = read(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "Hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
            {"role": "developer", "content": [{"type": "input_text", "text": "Answer in English."}]},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "Capital of"}, {"type": "input_text", "text": "France?"}],
            },
        ],
    )
    same = chat(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": "Capital of\nFrance?"},
        ]
    )
    assert req.messages == same.messages and req.bypass_reason is None
    assert request_hash(req) == request_hash(same)
    assert req.forward_body["messages"] == same.forward_body["messages"]  # what the judge and prewarm read


@pytest.mark.parametrize(
    ("given", "chat_kw"),
    [
        ({}, {}),
        (
            {"temperature": 0.2, "top_p": 0.9, "store": True, "metadata": {"a": "b"}, "truncation": "auto"},
            {"temperature": 0},
        ),
        ({"text": {"format": {"type": "text"}}}, {"response_format": {"type": "text"}}),
        ({"text": {"format": {"type": "json_object"}}}, {"response_format": {"type": "json_object"}}),
        (
            {"text": {"format": {"type": "json_schema", "name": "c", "schema": {"type": "object"}, "strict": True}}},
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "c", "schema": {"type": "object"}, "strict": True},
                }
            },
        ),
        ({"text": {"verbosity": "low"}}, {"verbosity": "low"}),
        ({"reasoning": {"effort": "high"}}, {"reasoning_effort": "high"}),
        ({"seed": 7, "tool_choice": "none"}, {"seed": 7, "tool_choice": "none"}),
    ],
)
def test_the_parameters_are_keyed_as_chat_keys_them(given: dict[str, Any], chat_kw: dict[str, Any]) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    assert read(**given).shaping == chat(question, **chat_kw).shaping


def test_parameters_that_differ_are_another_pool() -> None:
    plain = read().shaping
    assert plain == ""
    pools = {read(text={"format": {"type": "json_object"}}).shaping, read(reasoning={"effort": "low"}).shaping, plain}
    assert len(pools) == 3


def test_max_output_tokens_is_the_answers_cap() -> None:
    assert read(max_output_tokens=50).answer_cap == 50
    assert read().answer_cap is None


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"tools": [{"type": "function", "name": "f"}]}, Reason.TOOLS),
        ({"tools": [{"type": "web_search"}]}, Reason.TOOLS),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, Reason.TOOLS),
        ({"input": [{"type": "mcp_approval_response", "approve": True}]}, Reason.TOOLS),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, Reason.NON_TEXT_CONTENT),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            Reason.NON_TEXT_CONTENT,
        ),
        ({"input": [{"type": "reasoning", "id": "rs", "summary": []}]}, Reason.REASONING_ITEMS),
        ({"reasoning": {"summary": "auto"}}, Reason.REASONING_ITEMS),
        ({"include": ["reasoning.encrypted_content"]}, Reason.REASONING_ITEMS),
        ({"include": ["message.output_text.logprobs"]}, Reason.LOGPROBS),
        ({"top_logprobs": 3}, Reason.LOGPROBS),
        ({"background": True}, Reason.BACKGROUND),
        ({"conversation": "conv_1"}, Reason.STORED_CONTEXT),
        ({"prompt": {"id": "pmpt_1"}}, Reason.STORED_CONTEXT),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, Reason.STORED_CONTEXT),
        ({"previous_response_id": "resp_unknown"}, Reason.UNKNOWN_PREVIOUS_RESPONSE),
        ({"temperature": 1.5}, Reason.HIGH_TEMPERATURE),
        ({"input": [{"role": "assistant", "content": "Hi"}]}, Reason.NO_USER_TURN),
        ({"input": None}, Reason.NO_USER_TURN),
        ({"input": "x" * (MAX_CACHEABLE_CHARS + 1)}, Reason.TOO_LONG),
        ({"background": False, "tools": [], "include": ["file_search_call.results"]}, None),
    ],
)
def test_what_the_cache_cannot_judge_has_its_reason(kw: dict[str, Any], reason: Reason | None) -> None:
    assert read(**kw).bypass_reason == reason


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"model": ""}, "model"),
        ({"input": 5}, "input"),
        ({"input": [3]}, "input[0]"),
        ({"input": [{"type": 3}]}, "input[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user"}]}, "input[0].content"),
        ({"input": [{"role": "user", "content": [{"text": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"instructions": ["x"]}, "instructions"),
        ({"previous_response_id": ""}, "previous_response_id"),
        ({"text": "json"}, "text"),
        ({"text": {"format": {"name": "x"}}}, "text.format"),
        ({"text": {"verbosity": 1}}, "text.verbosity"),
        ({"reasoning": {"effort": 1}}, "reasoning.effort"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": True}, "max_output_tokens"),
        ({"include": "x"}, "include"),
        ({"background": "yes"}, "background"),
        ({"store": 1}, "store"),
        ({"stream": "no"}, "stream"),
        ({"top_p": 2}, "top_p"),
        ({"tools": {}}, "tools"),
        ({"cache": {"ttl": -1}}, "cache.ttl"),
    ],
)
def test_a_bad_field_is_refused_by_name(kw: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        read(**kw)
    assert caught.value.param == param


def test_cache_controls_are_read_and_store_false_stores_nothing() -> None:
    req = read(cache={"namespace": "ns", "no_cache": True})
    assert req.controls.namespace == "ns" and req.controls.no_cache and not req.controls.no_store
    assert "cache" not in req.forward_body
    assert read(store=False).controls.no_store
    parsed = parse_responses_request(responses(cache={"namespace": "ns"}))
    assert "cache" not in parsed.body


FIRST = (Message("user", "Capital of Japan?"), Message("assistant", "Tokyo."))


def test_a_follow_up_reads_as_its_whole_conversation_instructions_first() -> None:
    req = read(Chain(FIRST), previous_response_id="resp_1", instructions="Be brief.", input="And its population?")
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "user"]
    assert req.messages[1:3] == FIRST and req.bypass_reason is None


def test_the_upstream_gets_the_body_untouched_unless_the_proxy_served_what_it_continues() -> None:
    parsed = parse_responses_request(responses(previous_response_id="resp_1", input="And its population?"))
    assert upstream_body(parsed, Chain(FIRST, served=False)) == parsed.body
    assert upstream_body(parsed, None) == parsed.body
    sent = upstream_body(parsed, Chain(FIRST, served=True))
    assert "previous_response_id" not in sent
    assert sent["input"] == [
        {"role": "user", "content": "Capital of Japan?"},
        {"role": "assistant", "content": "Tokyo."},
        {"role": "user", "content": "And its population?"},
    ]


def test_the_chain_a_response_closes() -> None:
    parsed = parse_responses_request(responses(previous_response_id="resp_1", input="Population?", instructions="x"))
    chain = continued(parsed, Chain(FIRST), "About 14 million.", served=True)
    assert chain == Chain((*FIRST, Message("user", "Population?"), Message("assistant", "About 14 million.")), True)
    # an unknown history, items other than text messages, or more than the cache reads: nothing to continue
    assert continued(parsed, None, "x", served=False) is None
    tooled = parse_responses_request(responses(input=[{"type": "function_call_output", "call_id": "c", "output": "x"}]))
    assert continued(tooled, None, "x", served=False) is None
    long = parse_responses_request(responses(input="x" * MAX_CACHEABLE_CHARS))
    assert continued(long, None, "y", served=False) is None
