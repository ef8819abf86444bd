"""Learned levels end to end (proxy.core.learning, proxy.service.learning): the official SDK against
proxies whose scripted upstream judges as the replay harness's oracle does. Where a tenant's labels
bound the wrong answers under the intent's ``max_error``, a reworded question is served without a
judge call; a replica over the same Redis serves at the same level without asking; one end user's
labels, however many, change nothing another user is served."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from rich.console import Console

from proxy.core.identity import Identity
from proxy.core.learning import Label, Source
from proxy.http import keys
from proxy.service.learning import LearnedLevels, user_of
from proxy.tools.stats import parse_metrics, print_stats
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat
from tests.e2e.test_judge import CAPITAL, CAPITAL_REWORDED, PARIS, judging_policy, qualified
from tests.e2e.test_redis_replicas import (
    only_record,
    redis,  # noqa: F401 (the fixture)
    until,
)
from tests.storage.redis_server import RedisServer

CAPITAL_AGAIN = "Tell me which city is the capital of France."


def right_labels(count: int, *, user: str | None = None, intent: str = "general") -> list[Label]:
    """``count`` right labels spread evenly over the verifier's upper scores, each from its own user
    unless ``user`` names one."""
    return [
        Label(intent, 0.5 + 0.499 * i / count, True, Source.JUDGE, user or f"user-{i}", f"sc-{i}", float(i))
        for i in range(count)
    ]


def levels_of(proxy: Proxy) -> LearnedLevels:
    judging = proxy.app[keys.CHAT].judging
    assert judging is not None and judging.levels is not None
    return judging.levels


async def tenant_and_intent(proxy: Proxy) -> tuple[str, str]:
    (record,) = [r async for r in proxy.app[keys.CACHE].store.iter_live()]
    return record.tenant, record.coarse_tags.intent


async def learned_proxy(make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream, audit_rate: float = 0.0) -> Proxy:
    """``audit_rate``: none by default, so that a level's serve is never this wording's audit"""
    upstream.script.answers = {CAPITAL: PARIS, CAPITAL_REWORDED: PARIS, CAPITAL_AGAIN: PARIS}
    policy = judging_policy(tmp_path, max_error=0.005, audit_rate=audit_rate)
    proxy = await make_proxy(policy=policy, judge=True)
    assert (await chat(proxy.client(), ask(CAPITAL)))[0] == "miss"
    assert await qualified(proxy)
    return proxy


async def test_without_a_level_the_judge_is_asked(make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream) -> None:
    proxy = await learned_proxy(make_proxy, tmp_path, upstream)
    status, served, raw = await chat(proxy.client(), ask(CAPITAL_REWORDED))
    assert (status, served, raw.headers.get("x-cache-reason")) == ("hit", PARIS, "judged")
    assert len(upstream.script.judge_calls) == 1
    await proxy.settled()
    await proxy.app[keys.CHAT].judging.landed()
    # the verdict was kept as a label of this tenant's intent
    tenant, intent = await tenant_and_intent_of_original(proxy)
    (label,) = await proxy.app[keys.CACHE].store.labels(tenant, intent)
    assert label.right and label.source is Source.JUDGE and 0.5 <= label.score <= 1.0


async def tenant_and_intent_of_original(proxy: Proxy) -> tuple[str, str]:
    records = [r async for r in proxy.app[keys.CACHE].store.iter_live() if r.coarse_tags.alias_of is None]
    return records[0].tenant, records[0].coarse_tags.intent


async def test_a_level_earned_serves_without_asking(
    make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await learned_proxy(make_proxy, tmp_path, upstream)
    tenant, intent = await tenant_and_intent(proxy)
    await levels_of(proxy).add(tenant, right_labels(700, intent=intent))
    status, served, raw = await chat(proxy.client(), ask(CAPITAL_REWORDED))
    assert (status, served, raw.headers.get("x-cache-reason")) == ("hit", PARIS, "learned")
    assert upstream.script.judge_calls == []
    assert await proxy.metric("smartcache_judge_saved_total", intent=intent) == 1.0
    assert await proxy.metric("smartcache_learned_level", intent=intent) == 0.5
    # another tenant has learnt nothing: its own records would be judged, never served by this level
    other = await levels_of(proxy).level("t-other", proxy.app[keys.CHAT].planner.policy_box.policy.for_intent(intent))
    assert other is None
    # `smartcache stats` shows the level in force per intent, its bound and the calls it saved
    async with aiohttp.ClientSession() as http, http.get(proxy.server.make_url("/metrics")) as resp:
        snap = parse_metrics(await resp.text())
    assert snap.learned[intent]["level"] == 0.5 and snap.learned[intent]["saved"] == 1
    assert 0 < snap.learned[intent]["bound"] <= 0.005 and snap.learned[intent]["labels"] == 700
    console = Console(record=True, width=200)
    print_stats(snap, console)
    assert "Learned levels" in console.export_text()


async def test_an_audited_request_is_judged_even_above_the_level(
    make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await learned_proxy(make_proxy, tmp_path, upstream, audit_rate=1.0)
    tenant, intent = await tenant_and_intent(proxy)
    await levels_of(proxy).add(tenant, right_labels(700, intent=intent))
    # every serve a level would make is judged instead, and every yes forwarded and compared
    status, served, raw = await chat(proxy.client(), ask(CAPITAL_REWORDED))
    assert (status, served, raw.headers.get("x-cache-reason")) == ("miss", PARIS, "judge_audit")
    assert len(upstream.script.judge_calls) == 1
    await proxy.settled()
    await proxy.app[keys.CHAT].judging.landed()
    judging = proxy.app[keys.CHAT].judging
    assert judging.audits["m"].checked == 1 and judging.audits["m"].contradicted == 0


async def test_one_users_labels_change_nothing_another_user_is_served(
    make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await learned_proxy(make_proxy, tmp_path, upstream)
    tenant, intent = await tenant_and_intent(proxy)
    mallory = user_of(Identity(tenant, "s-mallory", "mallory", False))
    # 540 users' labels: short of the 598 a level at 0.5 % needs; then mallory's 1,000 crafted yes
    await levels_of(proxy).add(tenant, right_labels(540, intent=intent))
    await levels_of(proxy).add(tenant, right_labels(1000, user=mallory, intent=intent))
    status, served, raw = await chat(proxy.client(), ask(CAPITAL_REWORDED), extra_body={"user": "bob"})
    assert (status, served, raw.headers.get("x-cache-reason")) == ("hit", PARIS, "judged")
    assert len(upstream.script.judge_calls) == 1  # bob's request was judged, as without mallory
    assert await proxy.metric("smartcache_learned_level", intent=intent) is None


async def test_a_replica_over_one_redis_serves_at_the_level_without_asking(
    make_proxy: ProxyFactory,
    tmp_path: Path,
    redis: RedisServer,  # noqa: F811
    upstream: Upstream,
) -> None:
    upstream.script.answers = {CAPITAL: PARIS, CAPITAL_REWORDED: PARIS, CAPITAL_AGAIN: PARIS}
    policy = judging_policy(tmp_path, max_error=0.005, audit_rate=0.0)
    a = await make_proxy(store="redis", redis_url=redis.url, data_dir=tmp_path / "a", policy=policy, judge=True)
    assert (await chat(a.client(), ask(CAPITAL)))[0] == "miss"
    assert await qualified(a)
    await a.settled()
    tenant, intent = await tenant_and_intent(a)
    original = await only_record(a)
    await levels_of(a).add(tenant, right_labels(700, intent=intent))
    # a replica started after the labels were learnt, over the same Redis
    b = await make_proxy(store="redis", redis_url=redis.url, data_dir=tmp_path / "b", policy=policy, judge=True)
    await chat(b.client(), ask("What is the capital of Italy?"))  # its exam starts with its first request
    assert await qualified(b)
    await until(lambda: original.label in b.app[keys.CACHE].keys)
    judged = len(upstream.script.judge_calls)
    status, served, raw = await chat(b.client(), ask(CAPITAL_REWORDED))
    assert (status, served, raw.headers.get("x-cache-reason")) == ("hit", PARIS, "learned")
    assert len(upstream.script.judge_calls) == judged


async def test_a_judged_hit_the_user_regenerates_is_a_wrong_label_and_counts_against_the_judge(
    make_proxy: ProxyFactory, tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await learned_proxy(make_proxy, tmp_path, upstream)
    client = proxy.client(**{"x-smartcache-session": "regen-1"})
    status, _, raw = await chat(client, ask(CAPITAL_REWORDED))
    assert (status, raw.headers.get("x-cache-reason")) == ("hit", "judged")
    await proxy.settled()
    # the same conversation re-sent by the same session at once: a regenerate of the judged hit
    status, _, raw = await chat(client, ask(CAPITAL_REWORDED))
    assert (status, raw.headers.get("x-cache-reason")) == ("miss", "regenerate")
    await proxy.settled()
    judging = proxy.app[keys.CHAT].judging
    await judging.landed()
    tenant, intent = await tenant_and_intent_of_original(proxy)
    labels = await proxy.app[keys.CACHE].store.labels(tenant, intent)
    assert [(lb.right, lb.source) for lb in labels] == [(True, Source.JUDGE), (False, Source.FEEDBACK)]
    assert judging.audits["m"].contradicted == 1
