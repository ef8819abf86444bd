"""The Responses API through the cache, end to end: the official SDK's ``client.responses`` against
the proxy, whose scripted upstream answers ``/v1/responses`` as an OpenAI-compatible server does
(JSON or its event stream, and ``previous_response_id`` for the responses it stored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat
from tests.e2e.test_judge import CAPITAL, CAPITAL_REWORDED, PARIS, judging_policy, qualified
from tests.e2e.test_lifecycle import admin
from tests.e2e.test_redis_replicas import redis, replica  # noqa: F401 (redis: a fixture)
from tests.storage.redis_server import RedisServer

SYSTEM = "You are a helpful assistant."  # test_e2e_core's system prompt, as instructions
HIT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


async def respond(client: openai.AsyncOpenAI, said: Any = None, **kw: Any) -> tuple[str, str, Any]:
    """(x-cache-status, the answer's text, the raw response) of a non-streamed request."""
    if said is not None:
        kw["input"] = said
    raw = await client.responses.with_raw_response.create(model="m", instructions=SYSTEM, **kw)
    return raw.headers.get("x-cache-status", ""), raw.parse().output_text, raw


async def respond_stream(client: openai.AsyncOpenAI, text: str, **kw: Any) -> tuple[str, str, list[Any]]:
    """(x-cache-status, the text of the deltas, the events) of a streamed request."""
    async with client.responses.with_streaming_response.create(
        model="m", instructions=SYSTEM, input=text, stream=True, **kw
    ) as resp:
        status = resp.headers.get("x-cache-status", "")
        events = [e async for e in await resp.parse()]
    return status, "".join(e.delta for e in events if e.type == "response.output_text.delta"), events


def session(name: str) -> dict[str, str]:
    return {"x-smartcache-session": name}


async def test_a_question_misses_then_is_served_as_a_response(proxy: Proxy, upstream: Upstream) -> None:
    status, first, raw = await respond(proxy.client(**session("r1")), "What is the tallest mountain in Europe?")
    assert (status, raw.headers["x-cache-reason"]) == ("miss", "no_candidate")
    assert first.endswith("to: What is the tallest mountain in Europe?")
    assert raw.parse().id.startswith("resp_up")  # the upstream's own response, relayed
    status, served, raw = await respond(proxy.client(**session("r1")), "what is the tallest mountain in europe")
    assert (status, served) == ("hit", first)
    response = raw.parse()
    assert response.id.startswith("resp_") and not response.id.startswith("resp_up")
    assert (response.status, response.object, response.model, response.instructions) == (
        "completed",
        "response",
        "m",
        SYSTEM,
    )
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None and (response.usage.input_tokens, response.usage.output_tokens) == (0, 0)
    assert raw.headers["x-cache-id"].startswith("sc-") and int(raw.headers["age"]) >= 0
    assert float(raw.headers["x-cache-similarity"]) > 0.9
    assert len(upstream.script.responses_calls) == 1 and upstream.script.calls == []


async def test_a_hit_streams_the_event_sequence_the_sdk_reads(proxy: Proxy, upstream: Upstream) -> None:
    status, first, events = await respond_stream(
        proxy.client(**session("s1")), "Give me three tips for sleeping better."
    )
    assert status == "miss" and first.endswith("to: Give me three tips for sleeping better.")
    assert events[-1].type == "response.completed"  # the upstream's stream, relayed as it came
    status, served, events = await respond_stream(proxy.client(**session("s1")), "give me 3 tips for sleeping better")
    assert (status, served) == ("hit", first)
    kinds = [e.type for e in events]
    assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == HIT_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == first and events[-1].response.status == "completed"
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
    # the SDK's stream helper accumulates it into the final response
    async with proxy.client(**session("s3")).responses.stream(
        model="m", instructions=SYSTEM, input="Give me three tips for sleeping better."
    ) as stream:
        final = await stream.get_final_response()
    assert final.output_text == first and final.status == "completed"
    assert len(upstream.script.responses_calls) == 1


async def test_an_answer_given_through_chat_is_served_through_responses_and_back(
    proxy: Proxy, upstream: Upstream
) -> None:
    status, by_chat, _ = await chat(proxy.client(**session("c1")), ask("What is the capital of Australia?"))
    assert status == "miss"
    status, served, _ = await respond(proxy.client(**session("c2")), "What is the capital of Australia?")
    assert (status, served) == ("hit", by_chat)
    status, by_responses, _ = await respond_stream(proxy.client(**session("c3")), "How many legs does a spider have?")
    assert status == "miss"
    status, again, _ = await chat(proxy.client(**session("c4")), ask("How many legs does a spider have?"))
    assert (status, again) == ("hit", by_responses)
    assert len(upstream.script.calls) == 1 and len(upstream.script.responses_calls) == 1
    # where what shapes the answer differs, it is another request: JSON mode here, prose there
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    status, _, _ = await respond(
        proxy.client(**session("c5")),
        "What is the capital of Australia?",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    )
    assert status == "miss"
    json_schema = {"name": "city", "schema": schema, "strict": True}
    status, _, _ = await chat(
        proxy.client(**session("c6")),
        ask("What is the capital of Australia?"),
        response_format={"type": "json_schema", "json_schema": json_schema},
    )
    assert status == "hit"  # the same schema asked through chat: the same pool


async def test_a_follow_up_by_previous_response_id_is_the_whole_conversation(proxy: Proxy, upstream: Upstream) -> None:
    first_q, follow_q = "What is the capital of Japan?", "And how many people live there?"
    _, first, raw = await respond(proxy.client(**session("f1")), first_q)
    status, follow, raw = await respond(proxy.client(**session("f1")), follow_q, previous_response_id=raw.parse().id)
    assert status == "miss" and follow.endswith(f"to: {follow_q}")
    sent = upstream.script.responses_calls[-1]
    assert sent["previous_response_id"] and sent["input"] == follow_q  # forwarded untouched
    # the same conversation through chat, in another session, is this very conversation again
    history = [{"role": "user", "content": first_q}, {"role": "assistant", "content": first}]
    status, served, _ = await chat(proxy.client(**session("f2")), ask(follow_q, history))
    assert (status, served) == ("hit", follow)
    # and continued through Responses from the first answer there too
    _, _, raw = await respond(proxy.client(**session("f3")), first_q)
    status, served, raw = await respond(proxy.client(**session("f3")), follow_q, previous_response_id=raw.parse().id)
    assert (status, served) == ("hit", follow)
    assert len(upstream.script.responses_calls) == 2


async def test_a_follow_up_of_a_served_response_goes_upstream_as_its_whole_conversation(
    proxy: Proxy, upstream: Upstream
) -> None:
    question = "What is the boiling point of water at sea level?"
    _, answer, _ = await respond(proxy.client(**session("w1")), question)
    status, _, raw = await respond(proxy.client(**session("w2")), question)
    assert status == "hit"  # its id is the proxy's: the upstream never saw it
    status, follow, _ = await respond_stream(
        proxy.client(**session("w2")), "Is it lower on a mountain?", previous_response_id=raw.parse().id
    )
    assert status == "miss" and follow.endswith("to: Is it lower on a mountain?")
    sent = upstream.script.responses_calls[-1]
    assert "previous_response_id" not in sent
    assert sent["input"] == [
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Is it lower on a mountain?"},
    ]
    assert sent["instructions"] == SYSTEM


async def test_a_previous_response_the_proxy_does_not_know_is_forwarded_untouched_and_never_cached(
    proxy: Proxy, upstream: Upstream
) -> None:
    # a response the upstream gave another client, or this proxy before a restart
    upstream.script.stored_responses["resp_elsewhere"] = [
        {"role": "user", "content": "Pick a colour."},
        {"role": "assistant", "content": "Blue."},
    ]
    for _ in range(2):
        status, _, raw = await respond(
            proxy.client(**session("u1")), "Why that one?", previous_response_id="resp_elsewhere"
        )
        assert (status, raw.headers["x-cache-reason"]) == ("bypass", "unknown_previous_response")
        assert upstream.script.responses_calls[-1]["previous_response_id"] == "resp_elsewhere"
    assert len(upstream.script.responses_calls) == 2
    # one the upstream does not know either: its error, relayed as it said it
    with pytest.raises(openai.NotFoundError) as caught:
        await respond(proxy.client(), "Why?", previous_response_id="resp_nowhere")
    assert caught.value.response.headers["x-smartcache-upstream-error"] == "1"
    assert caught.value.code == "previous_response_not_found"


FUNCTION = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
BYPASSES = [
    ("tools", {"input": "Weather in Oslo?", "tools": [FUNCTION]}),
    (
        "tools",
        {
            "input": [
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ]
        },
    ),
    (
        "non_text_content",
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is in this picture?"},
                        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
                    ],
                }
            ]
        },
    ),
    (
        "reasoning_items",
        {
            "input": [
                {"role": "user", "content": "Why is the sky blue?"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
            ]
        },
    ),
    ("reasoning_items", {"input": "Why is the sky blue?", "reasoning": {"effort": "low", "summary": "auto"}}),
    ("background", {"input": "Why is the sky blue?", "background": True}),
    ("stored_context", {"input": "Why is the sky blue?", "conversation": "conv_1"}),
    ("stored_context", {"input": [{"type": "item_reference", "id": "msg_1"}]}),
    ("logprobs", {"input": "Why is the sky blue?", "include": ["message.output_text.logprobs"]}),
    ("high_temperature", {"input": "Why is the sky blue?", "temperature": 1.5}),
    ("no_user_turn", {"input": [{"role": "assistant", "content": "Hello."}]}),
]


@pytest.mark.parametrize(("reason", "kw"), BYPASSES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BYPASSES)])
async def test_what_the_cache_cannot_judge_bypasses_it_with_its_reason(
    proxy: Proxy, upstream: Upstream, reason: str, kw: dict[str, Any]
) -> None:
    for _ in range(2):
        status, _, raw = await respond(proxy.client(**session("b1")), **kw)
        assert (status, raw.headers["x-cache-reason"]) == ("bypass", reason)
    assert len(upstream.script.responses_calls) == 2  # asked twice, answered twice: nothing kept


async def test_store_false_keeps_the_answer_nowhere(proxy: Proxy, upstream: Upstream) -> None:
    status, _, raw = await respond(proxy.client(**session("n1")), "Name a large ocean.", store=False)
    assert status == "miss"
    status, _, _ = await respond(proxy.client(**session("n2")), "Name a large ocean.")
    assert status == "miss"  # not written back
    kept_nowhere = raw.parse().id
    # nor remembered to continue: forwarded as it came, and the upstream kept it no more than we did
    with pytest.raises(openai.NotFoundError):
        await respond(proxy.client(**session("n1")), "And a small one?", previous_response_id=kept_nowhere)
    assert upstream.script.responses_calls[-1]["previous_response_id"] == kept_nowhere


BAD = [
    ({"input": 5}, "input"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 7}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}, "input[0].content[0].text"),
    ({"input": ["hi"]}, "input[0]"),
    ({"input": "hi", "instructions": 5}, "instructions"),
    ({"input": "hi", "max_output_tokens": -1}, "max_output_tokens"),
    ({"input": "hi", "text": {"format": "json"}}, "text.format"),
    ({"input": "hi", "reasoning": "high"}, "reasoning"),
    ({"input": "hi", "temperature": "hot"}, "temperature"),
    ({"input": "hi", "previous_response_id": 3}, "previous_response_id"),
    ({"input": "hi", "stream": "yes"}, "stream"),
]


@pytest.mark.parametrize(("kw", "param"), BAD, ids=[p for _, p in BAD])
async def test_a_malformed_request_is_a_400_naming_the_parameter(
    proxy: Proxy, upstream: Upstream, kw: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await proxy.client().responses.create(model="m", **kw)
    assert caught.value.param == param and caught.value.type == "invalid_request_error"
    assert upstream.script.responses_calls == []


async def test_an_upstream_tool_call_or_cut_answer_is_relayed_and_not_kept(proxy: Proxy, upstream: Upstream) -> None:
    upstream.script.mode = "toolcall"
    status, _, raw = await respond(proxy.client(**session("t1")), "What time is it in Oslo?")
    assert status == "miss" and raw.parse().output[0].type == "function_call"
    upstream.script.mode = "cut"
    _, _, events = await respond_stream(proxy.client(**session("t2")), "What time is it in Oslo?")
    assert events[-1].type == "error"  # the stream broke: said in-band, as the API does
    upstream.script.mode = "ok"
    status, _, _ = await respond(proxy.client(**session("t3")), "What time is it in Oslo?")
    assert status == "miss"
    assert len(upstream.script.responses_calls) == 3


async def test_a_reworded_question_is_served_on_the_judges_yes(
    make_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path
) -> None:
    proxy = await make_proxy(policy=judging_policy(tmp_path), judge=True)
    upstream.script.answers = {CAPITAL: PARIS, CAPITAL_REWORDED: PARIS}
    status, answer, _ = await respond(proxy.client(), CAPITAL)
    assert (status, answer) == ("miss", PARIS)
    assert await qualified(proxy)
    calls = len(upstream.script.responses_calls)
    status, served, raw = await respond(proxy.client(), CAPITAL_REWORDED)
    assert (status, served, raw.headers["x-cache-reason"]) == ("hit", PARIS, "judged")
    assert len(upstream.script.judge_calls) == 1
    assert len(upstream.script.responses_calls) <= calls + 1  # a raced forward, cancelled on the yes


async def test_a_follow_up_reaches_another_replica_over_one_redis_until_the_key_is_purged(
    make_proxy: ProxyFactory,
    tmp_path: Path,
    redis: RedisServer,  # noqa: F811
    upstream: Upstream,
) -> None:
    a, b = await replica(make_proxy, tmp_path, "a", redis), await replica(make_proxy, tmp_path, "b", redis)
    _, _, first = await respond(a.client(**session("x1")), "What is the capital of Japan?")
    status, _, follow = await respond(
        b.client(**session("x1")), "And how many people live there?", previous_response_id=first.parse().id
    )
    assert status == "miss" and follow.headers["x-cache-reason"] != "unknown_previous_response"  # read whole
    purged, said = await admin(a, "post", "/admin/tenants/purge", json={"api_key": "key-A"})
    assert purged == 200 and said["purged"] == 2  # the two answers; their chains go with them
    status, _, after = await respond(b.client(**session("x1")), "And its area?", previous_response_id=follow.parse().id)
    assert (status, after.headers["x-cache-reason"]) == ("bypass", "unknown_previous_response")
