"""What a client that sends only an API key gets: the openai SDK, no session header, the shipped
policy. Its conversations are told apart by their openings (proxy/identity.py); a repeat of the
same conversation is a regenerate only within seconds (proxy/feedback.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from proxy.http import keys
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat

FAQ = "How do I reset my account password?"
FAQ_REWORDED = "What are the steps to reset the password of my account?"
READY_AFTER = 0.5  # the feedback window, small so the test need not wait a minute


async def _ready(proxy: Proxy) -> None:
    """Wait out the feedback window and the sweep that promotes pending answers."""
    await asyncio.sleep(READY_AFTER + 0.6)
    await proxy.app[keys.CACHE].store.promote_due(time.time())


async def _age_sessions(proxy: Proxy, seconds: float) -> None:
    """Move every session's last answer ``seconds`` into the past: the second conversation starts
    later, without the test sleeping for it."""
    store = proxy.app[keys.CACHE].store
    async for record in store.iter_live():
        last = await store.session_last(record.tenant, record.session)
        if last is not None:
            await store.set_session_last(record.tenant, record.session, replace(last, at=last.at - seconds))


@pytest.fixture
async def default_proxy(make_proxy: ProxyFactory) -> Proxy:
    return await make_proxy(ready_after=READY_AFTER)


async def test_a_later_conversation_opening_with_the_same_question_is_served(
    default_proxy: Proxy, upstream: Upstream
) -> None:
    first = default_proxy.client()
    status, answer, _ = await chat(first, ask(FAQ))
    assert status == "miss"
    await _ready(default_proxy)
    await _age_sessions(default_proxy, 120.0)
    calls = len(upstream.script.calls)
    status, served, _ = await chat(default_proxy.client(), ask(FAQ))
    assert (status, served) == ("hit", answer)
    assert len(upstream.script.calls) == calls
    (record,) = [r async for r in default_proxy.app[keys.CACHE].store.iter_live()]
    assert record.feedback_score >= 1.0  # not penalised as a regenerate


async def test_a_regenerate_is_never_served_and_its_answer_never_stored(
    default_proxy: Proxy, upstream: Upstream
) -> None:
    client = default_proxy.client()
    _, answer, _ = await chat(client, ask(FAQ))
    status, again, raw = await chat(client, ask(FAQ))
    assert (status, raw.headers.get("x-cache-reason")) == ("miss", "regenerate")
    assert again != answer and len(upstream.script.calls) == 2
    store = default_proxy.app[keys.CACHE].store
    assert [r async for r in store.iter_live()] == []  # the first was rejected, the second never written
    await _ready(default_proxy)
    await _age_sessions(default_proxy, 120.0)
    status, _, _ = await chat(default_proxy.client(), ask(FAQ))
    assert status == "miss"  # neither the rejected answer nor the regenerated one comes back


async def test_a_second_try_inside_the_feedback_window_says_pending(default_proxy: Proxy, upstream: Upstream) -> None:
    await chat(default_proxy.client(), ask(FAQ))
    await _age_sessions(default_proxy, 120.0)
    status, _, raw = await chat(default_proxy.client(), ask(FAQ))
    assert (status, raw.headers.get("x-cache-reason")) == ("miss", "pending")


@pytest.mark.xfail(
    strict=True,
    reason="measured: the shipped policy keeps general in the session until the pair verifier lands (widened, it "
    "served PAWS-X word swaps across sessions), so another conversation finds no candidate; and widened, the "
    "reworded FAQ scores 0.983 under e5-small and the reordered-words guard makes it a half-hit, while even "
    "'How can I reset my account password?' scores 0.998, under the 0.999 accept",
)
async def test_a_reworded_opening_in_another_conversation_is_served_once_the_first_is_ready(
    default_proxy: Proxy, upstream: Upstream
) -> None:
    _, answer, _ = await chat(default_proxy.client(), ask(FAQ))
    await _ready(default_proxy)
    status, served, _ = await chat(default_proxy.client(), ask(FAQ_REWORDED))
    assert (status, served) == ("hit", answer)
