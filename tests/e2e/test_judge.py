"""The model judge of the gray zone, end to end: the official SDK against the proxy, whose
scripted upstream answers judge requests as the replay harness's oracle does (right when the
cached answer is the one it gives the new request, with a seeded error rate per pair)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.http import keys
from proxy.settings import DEFAULT_POLICY
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat

CAPITAL = "What is the capital of France?"
CAPITAL_REWORDED = "Which city is the capital of France?"
PARIS = "The capital of France is Paris."
# a question of chit-chat, the same in other words, and its answer
JOKE, JOKE_AGAIN = "Tell me a joke about pirates.", "i need a pirates joke pls"
PIRATE = "Why couldn't the pirate play cards? He was standing on the deck."


def judging_policy(tmp_path: Path, **judge: Any) -> Path:
    """The shipped policy with every intent's gray zone judged as ``judge`` says."""
    data = yaml.safe_load(DEFAULT_POLICY.read_text(encoding="utf-8"))
    data["defaults"].update({"judge": "race", "judge_top": 2, "judge_floor": 0.6, **judge})
    for body in data["intents"].values():
        for key in ("judge", "judge_top", "judge_floor", "judge_deadline_ms"):
            (body or {}).pop(key, None)
    path = tmp_path / "judging.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


async def qualified(proxy: Proxy, model: str = "m") -> bool:
    """Wait for the judge's exam of ``model`` (started by its first request) to end."""
    judging = proxy.app[keys.CHAT].judging
    assert judging is not None
    for _ in range(200):
        standing = judging.qualification.standings().get(model)
        if standing in ("passed", "failed"):
            return standing == "passed"
        await asyncio.sleep(0.05)
    raise AssertionError("the exam never ended")


@pytest.fixture
async def judged_proxy(make_proxy: ProxyFactory, tmp_path: Path) -> Proxy:
    return await make_proxy(policy=judging_policy(tmp_path), judge=True)


async def test_a_reworded_question_is_served_on_the_judges_yes(judged_proxy: Proxy, upstream: Upstream) -> None:
    upstream.script.answers = {CAPITAL: PARIS, CAPITAL_REWORDED: PARIS}
    status, answer, _ = await chat(judged_proxy.client(), ask(CAPITAL))
    assert (status, answer) == ("miss", PARIS)
    assert await qualified(judged_proxy)
    calls = len(upstream.script.calls)
    status, served, raw = await chat(judged_proxy.client(), ask(CAPITAL_REWORDED))
    assert (status, served) == ("hit", PARIS)
    assert raw.headers.get("x-cache-id")
    assert len(upstream.script.judge_calls) == 1
    # the raced forward went out with the judge and was cancelled on its yes
    assert len(upstream.script.calls) <= calls + 1
    assert await judged_proxy.metric("smartcache_judge_calls_total", outcome="yes") == 1.0
    # the approved wording is an alias of the record now: asked again, no judge is called
    status, again, _ = await chat(judged_proxy.client(), ask(CAPITAL_REWORDED))
    assert (status, again) == ("hit", PARIS)
    assert len(upstream.script.judge_calls) == 1


async def test_a_no_is_forwarded_and_remembered(judged_proxy: Proxy, upstream: Upstream) -> None:
    await chat(judged_proxy.client(), ask(CAPITAL))
    assert await qualified(judged_proxy)
    # the script answers the reworded question otherwise: the judge says no
    status, answer, _ = await chat(
        judged_proxy.client(), ask(CAPITAL_REWORDED), extra_body={"cache": {"no_store": True}}
    )
    assert status != "hit" and answer.endswith(f"to: {CAPITAL_REWORDED}")
    asked = len(upstream.script.judge_calls)
    assert asked == 1
    status, _, _ = await chat(judged_proxy.client(), ask(CAPITAL_REWORDED), extra_body={"cache": {"no_store": True}})
    assert status != "hit"
    assert len(upstream.script.judge_calls) == asked  # that record is not offered again for this wording


async def test_a_judge_that_fails_its_exam_decides_nothing(judged_proxy: Proxy, upstream: Upstream) -> None:
    upstream.script.answers = {CAPITAL: PARIS, CAPITAL_REWORDED: PARIS}
    upstream.script.judge_error = 0.5  # a judge at chance says yes to half the wrong answers
    await chat(judged_proxy.client(), ask(CAPITAL))
    assert not await qualified(judged_proxy)
    assert upstream.script.exam_calls > 0
    status, _, _ = await chat(judged_proxy.client(), ask(CAPITAL_REWORDED))
    assert status != "hit"
    assert upstream.script.judge_calls == []
    async with aiohttp.ClientSession() as http, http.get(judged_proxy.server.make_url("/readyz")) as resp:
        assert (await resp.json())["judge"] == {"m": "failed"}


async def test_no_cache_and_another_tenant_never_reach_the_judge(judged_proxy: Proxy, upstream: Upstream) -> None:
    upstream.script.answers = {CAPITAL: PARIS, CAPITAL_REWORDED: PARIS}
    await chat(judged_proxy.client(), ask(CAPITAL))
    assert await qualified(judged_proxy)
    status, _, _ = await chat(judged_proxy.client(), ask(CAPITAL_REWORDED), extra_headers={"Cache-Control": "no-cache"})
    assert status == "miss"
    status, _, _ = await chat(judged_proxy.client("key-B"), ask(CAPITAL_REWORDED))
    assert status != "hit"
    assert upstream.script.judge_calls == []


async def test_a_late_verdict_forwards_and_is_still_remembered(
    make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await make_proxy(policy=judging_policy(tmp_path, judge_deadline_ms=50), judge=True)
    upstream.script.answers = {CAPITAL: PARIS, CAPITAL_REWORDED: PARIS}
    await chat(proxy.client(), ask(CAPITAL))
    assert await qualified(proxy)
    upstream.script.judge_delay = 0.4
    status, _, _ = await chat(proxy.client(), ask(CAPITAL_REWORDED))
    assert status != "hit"
    await asyncio.sleep(0.6)  # the verdict lands after the reply: its yes made the wording an alias
    records = [r async for r in proxy.app[keys.CACHE].store.iter_live()]
    (original,) = [r for r in records if r.coarse_tags.question_raw == CAPITAL]
    aliases = [r for r in records if r.coarse_tags.alias_of == original.cache_id]
    assert [a.answer_text for a in aliases] == [PARIS]
    assert aliases[0].expires_at <= original.expires_at


async def test_async_forwards_and_its_yes_makes_the_wording_an_alias(
    make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await make_proxy(policy=judging_policy(tmp_path, judge="async"), judge=True)
    upstream.script.answers = {CAPITAL: PARIS, CAPITAL_REWORDED: PARIS}
    await chat(proxy.client(), ask(CAPITAL))
    assert await qualified(proxy)
    calls = len(upstream.script.calls)
    status, answer, _ = await chat(proxy.client(), ask(CAPITAL_REWORDED), extra_body={"cache": {"no_store": True}})
    assert (status, answer) == ("miss", PARIS) and len(upstream.script.calls) == calls + 1  # forwarded
    for _ in range(100):  # the verdict comes after the reply
        if upstream.script.judge_calls:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    records = [r async for r in proxy.app[keys.CACHE].store.iter_live()]
    # no_store: the forwarded answer is not kept, and neither is an alias of it
    assert [r.coarse_tags.alias_of for r in records] == [None]
    status, _, _ = await chat(proxy.client(), ask(CAPITAL_REWORDED))
    assert status == "miss"  # async never serves on the request it judges
    await proxy.settled()
    await asyncio.sleep(0.3)
    records = [r async for r in proxy.app[keys.CACHE].store.iter_live()]
    original = next(r for r in records if r.coarse_tags.question_raw == CAPITAL)
    assert any(r.coarse_tags.alias_of == original.cache_id for r in records)


async def test_a_no_is_remembered_across_a_restart(
    make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream
) -> None:
    """The refusal is a row of the data directory's SQLite file: the proxy started again over it
    does not offer that record to the judge again for those words."""
    policy = judging_policy(tmp_path)
    first = await make_proxy(policy=policy, judge=True)
    await chat(first.client(), ask(CAPITAL))
    assert await qualified(first)
    no_store = {"cache": {"no_store": True}}
    status, _, _ = await chat(first.client(), ask(CAPITAL_REWORDED), extra_body=no_store)
    assert status != "hit" and len(upstream.script.judge_calls) == 1
    await first.stop()  # lets the verdicts under way land (Judging.close)
    second = await make_proxy(policy=policy, judge=True)
    assert (await chat(second.client(), ask(CAPITAL)))[0] == "hit"  # the record is still served
    assert await qualified(second)
    status, _, _ = await chat(second.client(), ask(CAPITAL_REWORDED), extra_body=no_store)
    assert status != "hit"
    assert len(upstream.script.judge_calls) == 1


async def test_a_yes_counts_only_for_a_candidate_the_verifier_keeps(
    make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream
) -> None:
    """The judge reads the nearest candidate while the verifier ranks: where the verifier drops it,
    the judge's yes serves nothing and makes no alias, and no refusal is said or kept."""
    # no question similarity admits it either (judge_near, and an opening's judge_near_opening)
    policy = judging_policy(tmp_path, judge_verify=1.0, judge_near=None, judge_near_again=None, judge_near_opening=None)
    proxy = await make_proxy(policy=policy, judge=True)
    upstream.script.answers = {CAPITAL: PARIS, CAPITAL_REWORDED: PARIS}
    await chat(proxy.client(), ask(CAPITAL))
    assert await qualified(proxy)
    status, _, raw = await chat(proxy.client(), ask(CAPITAL_REWORDED), extra_body={"cache": {"no_store": True}})
    assert status != "hit"
    assert raw.headers.get("x-cache-reason") not in ("judged", "judge_refused", "judge_late")
    await proxy.app[keys.CHAT].judging.landed()
    records = [r async for r in proxy.app[keys.CACHE].store.iter_live()]
    assert [r.coarse_tags.alias_of for r in records] == [None]
    assert set(proxy.app[keys.CHAT].judging.decided.values()) == {0}


async def test_a_question_of_an_earlier_topic_asked_again_is_the_judges_to_read(
    judged_proxy: Proxy, upstream: Upstream
) -> None:
    """A turn that leaves the topic before it (a refund) for one the session had earlier (a joke):
    the scores read nothing but this very conversation's records then, since its signature lost
    the history it left; the judge, which reads the conversation whole, reads the session's own
    earlier answers."""
    joke, joke_again, pirate = JOKE, JOKE_AGAIN, PIRATE
    refund = "How long does a refund take to reach my bank card?"
    upstream.script.answers = {joke: pirate, joke_again: pirate, refund: "Three to five working days."}
    client = judged_proxy.client(**{"x-smartcache-session": "s-topics"})
    history: list[dict[str, str]] = []
    for text in (joke, refund):
        status, answer, _ = await chat(client, ask(text, history))
        assert status == "miss"
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        assert await qualified(judged_proxy)
    status, served, raw = await chat(client, ask(joke_again, history))
    assert (status, served, raw.headers["x-cache-reason"]) == ("hit", pirate, "judged")
    assert len(upstream.script.judge_calls) == 1
    # another session's conversation ending in the same turns: its history is not this one's
    other = judged_proxy.client(**{"x-smartcache-session": "s-other"})
    elsewhere = [{"role": "user", "content": refund}, {"role": "assistant", "content": "Three to five days."}]
    status, _, _ = await chat(other, ask(joke_again, elsewhere))
    assert status != "hit"


OWLS = "Tell me a fun fact about owls."


async def served_elsewhere_then_asked_on(proxy: Proxy, upstream: Upstream) -> tuple[Any, list[dict[str, str]]]:
    """Session s-first asks the joke; s-second opens with the same words (served s-first's answer,
    an exact repeat), then asks about owls. Returns s-second's client and conversation."""
    upstream.script.answers = {JOKE: PIRATE, JOKE_AGAIN: PIRATE, OWLS: "Owls cannot move their eyes."}
    status, _, _ = await chat(proxy.client(**{"x-smartcache-session": "s-first"}), ask(JOKE))
    assert status == "miss"
    assert await qualified(proxy)
    client = proxy.client(**{"x-smartcache-session": "s-second"})
    history: list[dict[str, str]] = []
    for text, expected in ((JOKE, "hit"), (OWLS, "miss")):
        status, answer, _ = await chat(client, ask(text, history))
        assert status == expected, text
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
    return client, history


async def test_an_answer_served_from_another_session_is_the_sessions_own_when_asked_again(
    judged_proxy: Proxy, upstream: Upstream
) -> None:
    """A session served another conversation's answer (an exact repeat of its opening) keeps it as
    a turn of its own: asked again in other words after other turns, the judge reads it, though
    the other conversation's record, after another history, is not the judge's to read."""
    client, history = await served_elsewhere_then_asked_on(judged_proxy, upstream)
    status, served, raw = await chat(client, ask(JOKE_AGAIN, history))
    assert (status, served, raw.headers["x-cache-reason"]) == ("hit", PIRATE, "judged")
    records = [r async for r in judged_proxy.app[keys.CACHE].store.iter_live()]
    (original,) = [r for r in records if r.coarse_tags.question_raw == JOKE and r.session == "s-first"]
    (own,) = [r for r in records if r.coarse_tags.question_raw == JOKE and r.session == "s-second"]
    assert (own.coarse_tags.alias_of, own.scope, own.answer_text) == (original.cache_id, "session", PIRATE)
    # the approved wording points at the record itself, never at the copy
    (approved,) = [r for r in records if r.coarse_tags.question_raw == JOKE_AGAIN]
    assert approved.coarse_tags.alias_of == original.cache_id


async def test_an_alias_stands_as_its_record_does(judged_proxy: Proxy, upstream: Upstream) -> None:
    """A record penalised under the feedback floor (a regenerate, a correction) takes its aliases
    with it: the session's own copy of another conversation's answer is read no more (the flow of
    the test above, which serves it)."""
    client, history = await served_elsewhere_then_asked_on(judged_proxy, upstream)
    store = judged_proxy.app[keys.CACHE].store
    (original,) = [r async for r in store.iter_live() if r.session == "s-first"]
    await store.add_feedback(original.cache_id, -5.0)
    status, _, _ = await chat(client, ask(JOKE_AGAIN, history))
    assert status != "hit"
    assert upstream.script.judge_calls == []


REVERSE = "Write a Python function to reverse a linked list."
REVERSE_REWORDED = "python code that reverses a linked list?"
REVERSED = (
    "def reverse(head):\n    prev = None\n    while head:\n"
    "        head.next, prev, head = prev, head, head.next\n    return prev"
)


async def test_a_code_answer_reaches_another_session_only_on_the_judges_yes(
    judged_proxy: Proxy, upstream: Upstream
) -> None:
    """code shares its answers with the tenant ``widen_by: judge``: another session is served the
    same conversation byte for byte, and a rewording once the judge has read the answer."""
    upstream.script.answers = {REVERSE: REVERSED, REVERSE_REWORDED: REVERSED}
    status, _, _ = await chat(judged_proxy.client(**{"x-smartcache-session": "s-a"}), ask(REVERSE))
    assert status == "miss"
    assert await qualified(judged_proxy)
    status, served, raw = await chat(judged_proxy.client(**{"x-smartcache-session": "s-b"}), ask(REVERSE))
    assert (status, served, raw.headers["x-cache-reason"]) == ("hit", REVERSED, "exact_repeat")
    assert upstream.script.judge_calls == []
    status, served, raw = await chat(judged_proxy.client(**{"x-smartcache-session": "s-c"}), ask(REVERSE_REWORDED))
    assert (status, served, raw.headers["x-cache-reason"]) == ("hit", REVERSED, "judged")
    assert len(upstream.script.judge_calls) == 1


async def test_without_a_judge_another_sessions_code_answer_serves_only_its_exact_repeat(
    make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await make_proxy(policy=judging_policy(tmp_path, judge="off"), judge=True)
    upstream.script.answers = {REVERSE: REVERSED}
    await chat(proxy.client(**{"x-smartcache-session": "s-a"}), ask(REVERSE))
    # the same words in other case: the scores would serve it in s-a, not here
    status, _, raw = await chat(proxy.client(**{"x-smartcache-session": "s-b"}), ask(REVERSE.upper()))
    assert status != "hit" and raw.headers["x-cache-reason"] == "judge_only"
    status, _, _ = await chat(proxy.client(**{"x-smartcache-session": "s-b"}), ask(REVERSE))
    assert status == "hit"
