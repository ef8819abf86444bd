"""An answer the engine cut at the request's own token limit (finish_reason "length") is kept for
that very request at that limit: the same conversation asked again with the same ``max_tokens``
gets it back, cut as it was; another limit, another wording or no limit at all never does."""

from __future__ import annotations

from proxy.http import keys
from tests.conftest import Proxy, Upstream
from tests.e2e.test_e2e_core import ask, chat, chat_stream

QUESTION = "Describe the water cycle in detail, step by step."


async def test_a_cut_answer_serves_the_same_request_at_the_same_limit_cut_as_it_was(
    proxy: Proxy, upstream: Upstream
) -> None:
    upstream.script.mode = "length"
    status, answer, raw = await chat(proxy.client(**{"x-smartcache-session": "cut-1"}), ask(QUESTION), max_tokens=16)
    assert (status, raw.parse().choices[0].finish_reason) == ("miss", "length")
    (record,) = [r async for r in proxy.app[keys.CACHE].store.iter_live()]
    assert record.cut_at == 16 and record.answer_text == answer
    calls = len(upstream.script.calls)
    status, served, raw = await chat(proxy.client(**{"x-smartcache-session": "cut-2"}), ask(QUESTION), max_tokens=16)
    assert (status, served, raw.parse().choices[0].finish_reason) == ("hit", answer, "length")
    status, streamed, chunks = await chat_stream(
        proxy.client(**{"x-smartcache-session": "cut-3"}), ask(QUESTION), max_tokens=16
    )
    assert (status, streamed) == ("hit", answer)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert len(upstream.script.calls) == calls


async def test_a_cut_answer_never_serves_another_limit_another_wording_or_no_limit(
    proxy: Proxy, upstream: Upstream
) -> None:
    upstream.script.mode = "length"
    await chat(proxy.client(**{"x-smartcache-session": "lim-1"}), ask(QUESTION), max_tokens=16)
    for session, messages, limit in (
        ("lim-2", ask(QUESTION), {"max_tokens": 32}),
        ("lim-3", ask(QUESTION), {}),
        ("lim-4", ask(QUESTION.lower()), {"max_tokens": 16}),  # the same words in another case
    ):
        calls = len(upstream.script.calls)
        status, _, _ = await chat(proxy.client(**{"x-smartcache-session": session}), messages, **limit)
        assert (status, len(upstream.script.calls)) == ("miss", calls + 1), session
    # max_completion_tokens is the same limit by its newer name
    await chat(proxy.client(**{"x-smartcache-session": "lim-5"}), ask("Name every river."), max_completion_tokens=8)
    status, _, _ = await chat(
        proxy.client(**{"x-smartcache-session": "lim-6"}), ask("Name every river."), max_completion_tokens=8
    )
    assert status == "hit"


async def test_an_answer_cut_without_a_limit_of_the_requests_own_is_never_kept(
    proxy: Proxy, upstream: Upstream
) -> None:
    upstream.script.mode = "length"  # the engine's context ran out: nothing says it would end there again
    await chat(proxy.client(**{"x-smartcache-session": "ctx-1"}), ask(QUESTION))
    await chat_stream(proxy.client(**{"x-smartcache-session": "ctx-2"}), ask(QUESTION))
    assert [r async for r in proxy.app[keys.CACHE].store.iter_live()] == []
