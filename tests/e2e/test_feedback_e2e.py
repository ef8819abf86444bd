"""The feedback loop through the proxy: corrections, regenerates and resets."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from proxy.http import keys
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import SYSTEM, chat

QUESTION = "What is the tallest mountain in Europe?"
REPEAT = "what is the tallest mountain in europe"


async def test_a_correction_after_a_hit_lowers_the_score_and_the_question_then_misses(
    proxy: Proxy, upstream: Upstream
) -> None:
    client = proxy.client(**{"x-smartcache-session": "fb-1"})
    _, first, _ = await chat(client, [SYSTEM, {"role": "user", "content": QUESTION}])
    status, served, raw = await chat(client, [SYSTEM, {"role": "user", "content": REPEAT}])
    assert (status, served) == ("hit", first)
    cache_id = raw.headers["x-cache-id"]
    store = proxy.app[keys.CACHE].store
    before = (await store.get(cache_id)).feedback_score
    history = [SYSTEM, {"role": "user", "content": REPEAT}, {"role": "assistant", "content": served}]
    status, _, _ = await chat(client, [*history, {"role": "user", "content": "That's wrong, not what I asked."}])
    assert status == "miss"
    after = (await store.get(cache_id)).feedback_score
    assert after < before and after < proxy.app[keys.POLICY_BOX].policy.for_intent("general").feedback_floor
    calls = len(upstream.script.calls)
    status, _, _ = await chat(client, [SYSTEM, {"role": "user", "content": QUESTION + " "}])
    assert status != "hit"
    assert len(upstream.script.calls) == calls + 1


async def test_a_chinese_correction_rejects_a_pending_answer(make_proxy: ProxyFactory, upstream: Upstream) -> None:
    proxy = await make_proxy(ready_after=30.0)
    client = proxy.client(**{"x-smartcache-session": "fb-2"})
    question = [SYSTEM, {"role": "user", "content": "推荐几家上海的咖啡馆"}]
    _, answer, _ = await chat(client, question)
    store = proxy.app[keys.CACHE].store
    (record,) = [r async for r in store.iter_live()]
    assert record.state == "pending"
    await chat(
        client, [*question, {"role": "assistant", "content": answer}, {"role": "user", "content": "不对，不是这个意思"}]
    )
    assert (await store.get(record.cache_id)).state == "rejected"


async def test_a_reset_phrase_makes_the_next_repeat_a_miss(proxy: Proxy, upstream: Upstream) -> None:
    """The session's own answers go with a reset (one naming someone is kept to the session; what
    it shared with the tenant stays, tests/e2e/test_widened_scopes.py)."""
    client = proxy.client(**{"x-smartcache-session": "fb-3"})
    private = "What is the tallest mountain my friend Alice climbed in Europe?"
    await chat(client, [SYSTEM, {"role": "user", "content": private}])
    status, _, _ = await chat(client, [SYSTEM, {"role": "user", "content": private.lower()}])
    assert status == "hit"
    status, _, _ = await chat(client, [SYSTEM, {"role": "user", "content": "Let's start over, forget everything."}])
    assert status == "bypass"
    assert [r async for r in proxy.app[keys.CACHE].store.iter_live()] == []
    status, _, _ = await chat(client, [SYSTEM, {"role": "user", "content": private.upper()}])
    assert status == "miss"


@pytest.mark.parametrize(
    ("question", "intent"),
    [
        ("今天杭州天气怎么样？", "realtime"),
        ("What's the AAPL stock price right now?", "realtime"),
        ("布洛芬一天最多能吃几片？", "medical"),
        ("What dose of ibuprofen is safe for a child?", "medical"),
    ],
)
async def test_realtime_and_medical_are_bypassed_with_the_reason_logged(
    proxy: Proxy, upstream: Upstream, question: str, intent: str
) -> None:
    client = proxy.client(**{"x-smartcache-session": f"bp-{intent}"})
    for _ in range(2):
        with capture_logs() as logs:
            status, _, _ = await chat(client, [SYSTEM, {"role": "user", "content": question}])
        (line,) = [e for e in logs if e["event"] == "chat.request"]
        assert status == "bypass"
        assert (line["status"], line["reason"], line["intent"]) == ("bypass", "intent_disabled", intent)
        question += " "  # not a regenerate: the second ask is bypassed for its intent too
    assert len(upstream.script.calls) == 2
    assert [r async for r in proxy.app[keys.CACHE].store.iter_live()] == []


async def test_a_correction_after_a_bypassed_answer_leaves_the_answer_before_it_alone(
    proxy: Proxy, upstream: Upstream
) -> None:
    """The correction is about the answer it follows, which the cache never held: the record of
    the turn before, which the user did not complain about, keeps its score and is served again."""
    client = proxy.client(**{"x-smartcache-session": "fb-rt"})
    question = [SYSTEM, {"role": "user", "content": QUESTION}]
    status, first, _ = await chat(client, question)
    assert status == "miss"
    store = proxy.app[keys.CACHE].store
    (record,) = [r async for r in store.iter_live()]
    realtime = [*question, {"role": "assistant", "content": first}, {"role": "user", "content": "今天杭州天气怎么样？"}]
    status, weather, raw = await chat(client, realtime)
    assert (status, raw.headers.get("x-cache-reason")) == ("bypass", "intent_disabled")
    await chat(client, [*realtime, {"role": "assistant", "content": weather}, {"role": "user", "content": "不对"}])
    assert (await store.get(record.cache_id)).feedback_score == record.feedback_score
    status, served, _ = await chat(proxy.client(**{"x-smartcache-session": "fb-rt-2"}), question)
    assert (status, served) == ("hit", first)


async def test_a_correction_after_a_bypassed_answer_does_not_judge_the_hit_before_it_corrected(
    proxy: Proxy, upstream: Upstream
) -> None:
    """The session went on from the hit (its next answer was another one): a correction of that
    later answer judges the hit accepted, not corrected."""
    question = [SYSTEM, {"role": "user", "content": QUESTION}]
    status, first, _ = await chat(proxy.client(**{"x-smartcache-session": "judge-a"}), question)
    assert status == "miss"
    client = proxy.client(**{"x-smartcache-session": "judge-b"})
    status, served, _ = await chat(client, question)
    assert (status, served) == ("hit", first)
    corrected = await proxy.metric("smartcache_hits_judged_total", outcome="corrected") or 0.0
    accepted = await proxy.metric("smartcache_hits_judged_total", outcome="accepted") or 0.0
    weather_now = {"role": "user", "content": "今天杭州天气怎么样？"}
    realtime = [*question, {"role": "assistant", "content": served}, weather_now]
    status, weather, _ = await chat(client, realtime)
    assert status == "bypass"
    await chat(client, [*realtime, {"role": "assistant", "content": weather}, {"role": "user", "content": "不对"}])
    assert (await proxy.metric("smartcache_hits_judged_total", outcome="corrected") or 0.0) == corrected
    assert (await proxy.metric("smartcache_hits_judged_total", outcome="accepted") or 0.0) == accepted + 1
