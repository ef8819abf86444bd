"""The cache's lifecycle through the real proxy: capacity eviction, TTL, index hygiene and
compaction, invalidation by admin call and by policy version. The sweeper is driven by calling
``Lifecycle.tick()`` on the app's own instance, never by sleeping until it runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from proxy.core.identity import tenant_of
from proxy.core.model import Record
from proxy.http import keys
from proxy.http.app import LIFECYCLE
from proxy.service.lifecycle import Capacity
from proxy.settings import DEFAULT_POLICY
from proxy.storage.hnsw import HnswIndex
from tests.conftest import Proxy, ProxyFactory

TOKEN = "admin-s3cret"
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
QUESTIONS = [
    "How do bees make honey?",
    "Why do cats purr?",
    "How does a refrigerator keep food cold?",
    "What causes earthquakes?",
    "How do airplanes stay in the air?",
    "Why is the ocean salty?",
    "How do vaccines train the immune system?",
]


def write_policy(path: Path, *, version: str = "test-1", **intents: dict[str, Any]) -> Path:
    """The shipped policy with some intents' settings replaced (scope, widen_to, ttl, keywords...)."""
    data = yaml.safe_load(DEFAULT_POLICY.read_text(encoding="utf-8"))
    data["version"] = version
    for name, changes in intents.items():
        data["intents"][name].update(changes)
    # a keyword-forced intent stands apart: the loader refuses it as another intent's neighbour
    forced = {name for name, body in data["intents"].items() if body.get("force")}
    for body in data["intents"].values():
        if "neighbours" in body:
            body["neighbours"] = [n for n in body["neighbours"] if n not in forced]
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


async def admin(
    proxy: Proxy, method: str, path: str, *, json: Any = None, authorization: str | None = f"Bearer {TOKEN}"
) -> tuple[int, Any]:
    headers = {} if authorization is None else {"Authorization": authorization}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, str(proxy.server.make_url(path)), json=json, headers=headers) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def ask(client: openai.AsyncOpenAI, text: str, **kw: Any) -> tuple[str, str]:
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=[SYSTEM, {"role": "user", "content": text}], **kw
    )
    return raw.headers.get("x-cache-status", ""), raw.parse().choices[0].message.content or ""


Clients = Callable[..., openai.AsyncOpenAI]


@pytest.fixture
async def client() -> AsyncIterator[Clients]:
    """``client(proxy, key="key-A", session=None, **headers)``: an SDK client, closed after the test."""
    made: list[openai.AsyncOpenAI] = []

    def make(proxy: Proxy, key: str = "key-A", *, session: str | None = None, **headers: str) -> openai.AsyncOpenAI:
        made.append(proxy.client(key, **headers, **({"x-smartcache-session": session} if session else {})))
        return made[-1]

    yield make
    for c in made:
        await c.close()


async def live_records(proxy: Proxy) -> list[Record]:
    return [r async for r in proxy.app[keys.CACHE].store.iter_live()]


async def record_with(proxy: Proxy, answer: str) -> Record:
    (record,) = [r for r in await live_records(proxy) if r.answer_text == answer]
    return record


async def fill(proxy: Proxy, client: openai.AsyncOpenAI, questions: list[str]) -> list[str]:
    answers = []
    for q in questions:
        status, answer = await ask(client, q)
        assert status == "miss", q
        answers.append(answer)
    return answers


def test_capacity_is_a_high_water_mark_and_eviction_goes_to_the_low_one() -> None:
    cap = Capacity(max_records=100, max_answer_bytes=1000)
    assert not cap.exceeded(100, 1000)
    assert cap.exceeded(101, 0) and cap.exceeded(0, 1001)
    assert cap.targets() == (95, 950)


async def test_capacity_eviction_keeps_hot_records_and_drops_cold_ones(
    make_proxy: ProxyFactory, client: Clients
) -> None:
    proxy = await make_proxy(max_records=4)  # over it, eviction goes down to 95 %: 3 records
    chat = client(proxy, session="evict")
    questions = QUESTIONS[:5]
    answers = await fill(proxy, chat, questions)
    for q, a in [*zip(questions[:2], answers[:2], strict=True)] * 2:  # the two oldest become the hot ones
        assert await ask(chat, q) == ("hit", a)
    lifecycle, cache = proxy.app[LIFECYCLE], proxy.app[keys.CACHE]
    assert len(cache.index) == 5
    result = await lifecycle.tick()
    assert result["evicted"] == 2
    assert sorted(r.answer_text for r in await live_records(proxy)) == sorted([answers[0], answers[1], answers[4]])
    assert len(cache.index) == 3 and set(cache.keys) == {r.label for r in await live_records(proxy)}

    # the byte budget, kept in memory so a sweep need not read every answer: one byte short of the
    # three answers evicts the coldest of them
    budget = await cache.store.answer_bytes()
    assert cache.pools.answer_bytes == budget
    lifecycle.capacity = Capacity(max_records=100, max_answer_bytes=budget - 1)
    assert (await lifecycle.tick())["evicted"] == 1
    assert sorted(r.answer_text for r in await live_records(proxy)) == sorted(answers[:2])
    assert cache.pools.answer_bytes == await cache.store.answer_bytes()

    lifecycle.capacity = Capacity(max_records=100, max_answer_bytes=10**9)
    assert await ask(chat, questions[0]) == ("hit", answers[0])
    for q, a in zip(questions[2:], answers[2:], strict=True):
        status, text = await ask(chat, q)
        assert status == "miss" and text != a


async def test_deletes_leave_the_index_and_compaction_follows_the_deleted_fraction(
    make_proxy: ProxyFactory, client: Clients
) -> None:
    proxy = await make_proxy(admin_token=TOKEN)
    chat = client(proxy, session="compact")
    answers = await fill(proxy, chat, QUESTIONS)
    cache, lifecycle = proxy.app[keys.CACHE], proxy.app[LIFECYCLE]
    records = [await record_with(proxy, a) for a in answers]

    async def delete(record: Record) -> None:
        assert await admin(proxy, "DELETE", f"/admin/records/{record.cache_id}") == (200, {"deleted": record.cache_id})

    # a small tenant's records are rows searched exactly: a delete drops its row at once
    await delete(records[0])
    assert len(cache.index) == 6 and cache.index.deleted_fraction == 0.0
    # one whose tenant has outgrown exact search is walked as a graph, where deletes leave tombstones
    cache.index = HnswIndex(cache.index.dim, exact_limit=2)
    assert await cache.load() == 6
    assert cache.index.partitions() == {records[1].tenant: (6, True)}
    await delete(records[1])
    assert len(cache.index) == 5 and abs(cache.index.deleted_fraction - 1 / 6) < 1e-9
    found = {label for label, _ in cache.index.search(records[0].vector_array(), 7)}
    assert found == {r.label for r in records[2:]}  # deleted labels are gone from the graph
    await lifecycle.tick()
    assert abs(cache.index.deleted_fraction - 1 / 6) < 1e-9  # under the 0.3 threshold: no compaction yet
    await delete(records[2])
    assert abs(cache.index.deleted_fraction - 2 / 6) < 1e-9
    await lifecycle.tick()
    assert cache.index.deleted_fraction == 0.0 and len(cache.index) == 4
    for q, a in zip(QUESTIONS[3:], answers[3:], strict=True):
        assert await ask(chat, q) == ("hit", a)
    status, _ = await ask(chat, QUESTIONS[0])
    assert status == "miss"


@dataclass
class Gate:
    """Holds a call in its thread until opened; ``entered`` says a call is waiting."""

    entered: threading.Event = field(default_factory=threading.Event)
    opened: threading.Event = field(default_factory=threading.Event)

    def hold(self, monkeypatch: pytest.MonkeyPatch, index: HnswIndex) -> None:
        """``index.add`` waits for the gate, and every add goes through it, off the loop, as it does
        when the index is busy (``add_now`` declines)."""
        add = index.add
        monkeypatch.setattr(index, "add_now", lambda *_: False)

        def held_add(*args: Any) -> None:
            self.entered.set()
            self.opened.wait(10)
            add(*args)

        monkeypatch.setattr(index, "add", held_add)

    def hold_rebuilds(self, monkeypatch: pytest.MonkeyPatch, index: HnswIndex) -> None:
        """A rebuild's new graph (``index.fresh``) takes its first batch of rows only once opened:
        the rebuild is then under way off the loop, its store read done."""
        fresh = index.fresh

        def held_fresh() -> HnswIndex:
            new = fresh()
            self.hold(monkeypatch, new)
            return new

        monkeypatch.setattr(index, "fresh", held_fresh)


async def test_a_rebuild_loses_no_write_and_revives_no_delete(
    make_proxy: ProxyFactory, client: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes and deletes that land while the index is rebuilt off the loop survive the swap."""
    proxy = await make_proxy(admin_token=TOKEN)
    chat = client(proxy, session="rebuild")
    answers = await fill(proxy, chat, QUESTIONS[:3])
    cache = proxy.app[keys.CACHE]
    doomed = await record_with(proxy, answers[0])
    gate = Gate()
    gate.hold_rebuilds(monkeypatch, cache.index)
    task = asyncio.create_task(cache.load())
    assert await asyncio.to_thread(gate.entered.wait, 10)
    status, fresh = await ask(chat, QUESTIONS[3])  # written while the new graph is being built
    assert status == "miss"
    assert (await admin(proxy, "DELETE", f"/admin/records/{doomed.cache_id}"))[0] == 200
    gate.opened.set()
    assert await task == 3
    assert len(cache.index) == 3 and doomed.label not in cache.keys
    assert (await record_with(proxy, fresh)).label in cache.keys
    assert await ask(chat, QUESTIONS[3].lower()) == ("hit", fresh)
    status, _ = await ask(chat, QUESTIONS[0])
    assert status == "miss"


async def test_a_write_whose_index_add_straddles_a_rebuilds_swap_is_in_the_new_graph(
    make_proxy: ProxyFactory, client: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuild reads the store before the answer is written, and swaps in its new graph while
    the write's add to the old one is still off the loop: the new graph must get the record too."""
    proxy = await make_proxy(admin_token=TOKEN)
    await fill(proxy, client(proxy, session="straddle"), QUESTIONS[:3])
    cache = proxy.app[keys.CACHE]
    build, add = Gate(), Gate()
    old = cache.index
    build.hold_rebuilds(monkeypatch, old)
    rebuild = asyncio.create_task(cache.load())
    assert await asyncio.to_thread(build.entered.wait, 10)  # the store is read: the answer below comes after
    add.hold(monkeypatch, old)
    status, written = await ask(proxy.client(settled=False, **{"x-smartcache-session": "straddle"}), QUESTIONS[3])
    assert status == "miss"
    assert await asyncio.to_thread(add.entered.wait, 10)  # the write's add is off the loop, on the old graph
    build.opened.set()
    assert await rebuild == 3  # swapped in, its log replayed, before the write's add returned
    assert cache.index is not old
    add.opened.set()
    await proxy.settled()
    label = (await record_with(proxy, written)).label
    assert label in cache.keys and label in cache.index.labels()
    assert await ask(client(proxy, session="straddle"), QUESTIONS[3].lower()) == ("hit", written)


async def test_an_expired_record_is_never_served_even_before_the_sweeper(
    make_proxy: ProxyFactory, client: Clients
) -> None:
    proxy = await make_proxy()  # the sweeper runs every 30 s: it will not run during this test
    chat = client(proxy, session="ttl")
    short_q, long_q = QUESTIONS[0], QUESTIONS[1]
    _, short = await ask(chat, short_q, extra_body={"cache": {"ttl": 1}})
    _, long = await ask(chat, long_q)
    assert await ask(chat, short_q) == ("hit", short)
    short_record = await record_with(proxy, short)
    await asyncio.sleep(1.2)
    status, text = await ask(chat, short_q.lower())  # respelled: the identical request is a regenerate
    assert status == "miss" and text != short
    assert (await proxy.app[keys.CACHE].store.get(short_record.cache_id)).state == "ready"  # not swept yet
    # a request's own max-age bounds the age of what it is served, not only what it stores
    status, text = await ask(chat, long_q, extra_headers={"Cache-Control": "max-age=1"})
    assert status == "miss" and text != long
    status, served = await ask(chat, long_q.lower())
    assert status == "hit" and served in (long, text)
    lifecycle, cache = proxy.app[LIFECYCLE], proxy.app[keys.CACHE]
    result = await lifecycle.tick()
    assert result["expired"] == 1
    assert await cache.store.get(short_record.cache_id) is None
    assert short_record.label not in cache.keys

    # a week later every ttl has passed, and the session's last answer is forgotten too
    tenant = tenant_of("Bearer key-A", salt=proxy.app[keys.TENANT_SALT])
    assert await cache.store.session_last(tenant, "ttl") is not None
    live = len(await live_records(proxy))
    lifecycle.clock = lambda: time.time() + 8 * 86400
    assert (await lifecycle.tick())["expired"] == live
    assert await live_records(proxy) == [] and len(cache.index) == 0
    assert await cache.store.session_last(tenant, "ttl") is None


async def test_request_ttls_only_shorten_the_policy_ttl(
    make_proxy: ProxyFactory, client: Clients, tmp_path: Path
) -> None:
    policy = write_policy(
        tmp_path / "policy.yaml", general={"ttl": 30}, chitchat={"force": True, "keywords": ["joke"], "ttl": 7200}
    )
    proxy = await make_proxy(policy=policy)
    default = client(proxy, session="ttl-bounds")
    cases = [  # (question, extra request arguments, the ttl the record must get)
        (QUESTIONS[0], {"extra_body": {"cache": {"ttl": 10**6}}}, 30),
        (QUESTIONS[1], {"extra_headers": {"Cache-Control": "max-age=1000000"}}, 30),
        (QUESTIONS[2], {"extra_body": {"cache": {"ttl": 10}}}, 10),
        (QUESTIONS[3], {"extra_body": {"cache": {"ttl": 20}}, "extra_headers": {"Cache-Control": "max-age=5"}}, 5),
        (QUESTIONS[4], {}, 30),
        ("Tell me a joke about frogs.", {}, 7200),
        # chitchat is shared tenant-wide with a loose threshold: ask the second joke as another tenant
        ("Tell me a joke about owls.", {"extra_body": {"cache": {"ttl": 10**6}}, "key": "key-B"}, 7200),
    ]
    for question, extra, ttl in cases:
        asker = client(proxy, str(extra.pop("key")), session="ttl-bounds") if "key" in extra else default
        status, answer = await ask(asker, question, **extra)
        assert status == "miss"
        record = await record_with(proxy, answer)
        assert abs(record.expires_at - record.created_at - ttl) < 1e-3, question


@pytest.mark.slow
async def test_a_policy_version_bump_invalidates_old_records_and_a_bad_file_is_refused(
    make_proxy: ProxyFactory, client: Clients, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "policy.yaml", version="v1")
    proxy = await make_proxy(policy=policy, admin_token=TOKEN)
    chat = client(proxy, session="reload")
    answers = await fill(proxy, chat, QUESTIONS[:2])
    ids = [(await record_with(proxy, a)).cache_id for a in answers]
    assert {r.policy_version for r in await live_records(proxy)} == {"v1"}

    write_policy(policy, version="v2")
    assert await admin(proxy, "POST", "/admin/policy/reload") == (
        200,
        {"version": "v2", "previous": "v1", "invalidated": 2},
    )
    store = proxy.app[keys.CACHE].store
    assert [(await store.get(i)).state for i in ids] == ["invalid", "invalid"]
    assert len(proxy.app[keys.CACHE].index) == 0
    status, fresh = await ask(chat, QUESTIONS[0])
    assert status == "miss" and fresh != answers[0]
    assert (await record_with(proxy, fresh)).policy_version == "v2"
    assert (await admin(proxy, "POST", "/admin/policy/reload"))[1]["invalidated"] == 0  # same version

    bad_files = [
        ({"general": {"accept": 1.5}}, "intents.general.accept"),
        ({"travel": {"scpoe": "tenant"}}, "intents.travel.scpoe"),
    ]
    for n, (changes, key) in enumerate(bad_files):
        write_policy(policy, version="v3", **changes)
        status, body = await admin(proxy, "POST", "/admin/policy/reload")
        assert status == 400 and key in body["error"]["message"], body
        _, stats = await admin(proxy, "GET", "/admin/stats")
        assert stats["policy_version"] == "v2"
        respelled = (QUESTIONS[0].lower(), QUESTIONS[0].upper())[n]
        assert await ask(chat, respelled) == ("hit", fresh)  # the running policy still serves


async def test_invalidate_is_a_dry_run_unless_applied(
    make_proxy: ProxyFactory, client: Clients, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "policy.yaml", chitchat={"force": True, "keywords": ["joke"]})
    proxy = await make_proxy(admin_token=TOKEN, policy=policy)
    v1 = client(proxy, session="inv", **{"x-smartcache-system-version": "sp-1"})
    v2 = client(proxy, session="inv", **{"x-smartcache-system-version": "sp-2"})
    a1 = await fill(proxy, v1, QUESTIONS[:2])
    a2 = await fill(proxy, v2, [QUESTIONS[2], "Tell me a joke about frogs."])
    cache = proxy.app[keys.CACHE]

    async def states() -> list[str]:
        return sorted(r.state for r in [await cache.store.get((await record_with(proxy, a)).cache_id) for a in a1 + a2])

    selector = {"system_prompt_version": "sp-1"}
    assert await admin(proxy, "POST", "/admin/invalidate", json=selector) == (200, {"matched": 2, "applied": False})
    assert await states() == ["ready"] * 4 and len(cache.index) == 4
    assert await ask(v1, QUESTIONS[0]) == ("hit", a1[0])

    assert await admin(proxy, "POST", "/admin/invalidate", json={**selector, "apply": True}) == (
        200,
        {"matched": 2, "applied": True},
    )
    assert sorted(r.answer_text for r in await live_records(proxy)) == sorted(a2)
    assert len(cache.index) == 2
    assert await ask(v2, QUESTIONS[2]) == ("hit", a2[0])

    by_intent = {"intent": "chitchat"}
    assert await admin(proxy, "POST", "/admin/invalidate", json=by_intent) == (200, {"matched": 1, "applied": False})
    assert await admin(proxy, "POST", "/admin/invalidate", json={**by_intent, "apply": True}) == (
        200,
        {"matched": 1, "applied": True},
    )
    assert [r.answer_text for r in await live_records(proxy)] == [a2[0]]
    status, _ = await ask(v2, "Tell me a joke about frogs.")
    assert status == "miss"
    for bad in ({}, {"apply": True}, {"bogus": "x"}, {"intent": 3}):
        status, body = await admin(proxy, "POST", "/admin/invalidate", json=bad)
        assert status == 400 and body["error"]["type"] == "invalid_request_error", bad
