"""What a hit must match besides the conversation: the request parameters that shape the answer
(proxy/core/openai/params.py, the README's "What a hit must match"). Through the openai SDK against
the real proxy and a scripted upstream: a JSON-mode client is never served the prose answer, a
request allowed fewer tokens never gets a longer answer, and a bad limit is refused before it
reaches anyone."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from proxy.http import keys
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat, chat_stream

QUESTION = "List the three primary colors."
SCHEMA = {
    "name": "colors",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {"colors": {"type": "array", "items": {"type": "string"}}},
        "required": ["colors"],
        "additionalProperties": False,
    },
}

# each asks for another answer than the plain request: a miss after it, then a hit of its own
SHAPED: list[tuple[str, dict[str, Any]]] = [
    ("json_object", {"response_format": {"type": "json_object"}}),
    ("json_schema", {"response_format": {"type": "json_schema", "json_schema": SCHEMA}}),
    ("stop", {"stop": ["red"]}),
    ("seed", {"temperature": 0.7, "seed": 7}),
    ("reasoning_effort", {"reasoning_effort": "high"}),
    ("logit_bias", {"logit_bias": {"50256": -100}}),
    ("presence_penalty", {"presence_penalty": 1.0}),
    ("tool_choice", {"tool_choice": "none"}),
    ("vendor-extra", {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}),
]


async def _plain(proxy: Proxy, upstream: Upstream) -> str:
    status, answer, _ = await chat(proxy.client(**{"x-smartcache-session": "plain"}), ask(QUESTION))
    assert status == "miss"
    upstream.script.answers[QUESTION] = '{"colors": ["red", "yellow", "blue"]}'  # what a shaped ask gets
    return answer


async def _records(proxy: Proxy) -> int:
    return len([r async for r in proxy.app[keys.CACHE].store.iter_live()])


@pytest.mark.parametrize(("name", "params"), SHAPED, ids=[n for n, _ in SHAPED])
async def test_a_plain_answer_is_never_served_to_a_request_that_shapes_it_otherwise(
    proxy: Proxy, upstream: Upstream, name: str, params: dict[str, Any]
) -> None:
    plain = await _plain(proxy, upstream)
    calls = len(upstream.script.calls)
    status, shaped, _ = await chat(proxy.client(**{"x-smartcache-session": f"{name}-1"}), ask(QUESTION), **params)
    assert (status, len(upstream.script.calls)) == ("miss", calls + 1)
    assert shaped != plain
    # the shaped answer has a pool of its own: the same shaped request again is served from it
    status, again, _ = await chat(proxy.client(**{"x-smartcache-session": f"{name}-2"}), ask(QUESTION), **params)
    assert (status, again) == ("hit", shaped)
    # and the plain pool still holds the plain answer
    status, served, _ = await chat(proxy.client(**{"x-smartcache-session": f"{name}-3"}), ask(QUESTION))
    assert (status, served) == ("hit", plain)
    assert len(upstream.script.calls) == calls + 1


async def test_delivery_sampling_and_spelled_out_defaults_are_served_the_plain_answer(
    proxy: Proxy, upstream: Upstream
) -> None:
    plain = await _plain(proxy, upstream)
    calls = len(upstream.script.calls)
    for i, params in enumerate(
        (
            {"temperature": 0.2, "top_p": 0.9},
            {"temperature": 1.0, "user": "someone", "metadata": {"app": "x"}, "store": False},
            {"response_format": {"type": "text"}, "stop": [], "n": 1, "logprobs": False},
            {"max_tokens": 1000, "frequency_penalty": 0, "modalities": ["text"]},
        )
    ):
        status, served, _ = await chat(proxy.client(**{"x-smartcache-session": f"same-{i}"}), ask(QUESTION), **params)
        assert (status, served) == ("hit", plain), params
    status, streamed, _ = await chat_stream(
        proxy.client(**{"x-smartcache-session": "same-stream"}), ask(QUESTION), temperature=0
    )
    assert (status, streamed) == ("hit", plain)
    assert len(upstream.script.calls) == calls


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"temperature": 1.5}, "high_temperature"),
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio_output"),
        ({"web_search_options": {}}, "web_search"),
    ],
    ids=["temperature above 1", "audio output", "web search"],
)
async def test_a_request_for_variety_audio_or_the_web_bypasses_the_cache(
    make_proxy: ProxyFactory, upstream: Upstream, params: dict[str, Any], reason: str
) -> None:
    proxy = await make_proxy(debug_headers=True)
    await _plain(proxy, upstream)
    for i in range(2):  # neither served nor stored: the second is forwarded too
        calls = len(upstream.script.calls)
        client = proxy.client(**{"x-smartcache-session": f"bypass-{i}", "x-smartcache-debug": "1"})
        status, _, raw = await chat(client, ask(QUESTION), **params)
        assert (status, raw.headers["x-smartcache-reason"]) == ("bypass", reason)
        assert len(upstream.script.calls) == calls + 1
    assert await _records(proxy) == 1


async def test_a_whole_answer_longer_than_the_request_allows_is_not_served_to_it(
    proxy: Proxy, upstream: Upstream
) -> None:
    plain = await _plain(proxy, upstream)
    (record,) = [r async for r in proxy.app[keys.CACHE].store.iter_live()]
    assert record.completion_tokens > 2
    calls = len(upstream.script.calls)
    # the engine would have cut it at 2 tokens: not the answer this request asked for
    status, _, _ = await chat(proxy.client(**{"x-smartcache-session": "short"}), ask(QUESTION), max_tokens=2)
    assert (status, len(upstream.script.calls)) == ("miss", calls + 1)
    status, served, _ = await chat(
        proxy.client(**{"x-smartcache-session": "room"}), ask(QUESTION), max_tokens=record.completion_tokens
    )
    assert (status, served) == ("hit", plain)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"max_tokens": -5}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"response_format": {"schema": {}}}, "response_format"),
        ({"extra_body": {"cache": {"namespace": "a\nb"}}}, "cache.namespace"),
    ],
)
async def test_a_bad_parameter_is_an_openai_error_and_reaches_nobody(
    proxy: Proxy, upstream: Upstream, params: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await chat(proxy.client(**{"x-smartcache-session": "bad"}), ask(QUESTION), **params)
    assert info.value.body["type"] == "invalid_request_error"
    assert info.value.body["param"] == param
    assert upstream.script.calls == []
    assert await _records(proxy) == 0


async def test_a_limit_refused_is_never_cached_for_a_later_valid_limit(proxy: Proxy, upstream: Upstream) -> None:
    """The issue's case: an answer asked for under ``max_tokens: -5`` was served to ``max_tokens: 20``."""
    with pytest.raises(openai.BadRequestError):
        await chat(proxy.client(**{"x-smartcache-session": "neg"}), ask(QUESTION), max_tokens=-5)
    status, _, _ = await chat(proxy.client(**{"x-smartcache-session": "pos"}), ask(QUESTION), max_tokens=20)
    assert (status, len(upstream.script.calls)) == ("miss", 1)


async def test_a_shaped_ask_in_the_same_session_is_not_a_regenerate_of_the_plain_one(
    proxy: Proxy, upstream: Upstream
) -> None:
    client = proxy.client(**{"x-smartcache-session": "one"})
    await chat(client, ask(QUESTION))
    status, _, _ = await chat(client, ask(QUESTION), response_format={"type": "json_object"})
    assert status == "miss"
    records = [r async for r in proxy.app[keys.CACHE].store.iter_live()]
    assert len(records) == 2  # the JSON answer is kept: a new request, not a regenerate
    assert all(r.feedback_score >= 1.0 for r in records)  # the plain answer was not penalised


async def test_an_upstream_failure_under_json_mode_is_never_cached(proxy: Proxy, upstream: Upstream) -> None:
    upstream.script.mode = "error500"
    client = proxy.client(**{"x-smartcache-session": "fail"})
    with pytest.raises(openai.InternalServerError):
        await chat(client, ask(QUESTION), response_format={"type": "json_object"})
    assert await _records(proxy) == 0
