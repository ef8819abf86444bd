"""Two proxy replicas (two real apps, each with its own data_dir and HNSW index) sharing one real
redis-server: what one answers the other serves, feedback and invalidation through one reach the
other through the change stream within a measured bound, a restarted replica catches up, and a
Redis outage costs the cache (bypass), never a request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxy.core.model import Record
from proxy.http import keys
from proxy.settings import DEFAULT_POLICY, Settings
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat
from tests.e2e.test_judge import CAPITAL, CAPITAL_REWORDED, PARIS, judging_policy, qualified
from tests.e2e.test_lifecycle import TOKEN, admin
from tests.storage.redis_server import BINARY, RedisServer, free_port

PROPAGATION_BOUND_S = 2.0  # what the tests allow; the measured delays are printed


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    import shutil

    if shutil.which(BINARY) is None:
        pytest.skip(f"{BINARY} is not installed (Debian: apt-get install redis-server); .ci/run installs it")
    server = RedisServer(free_port(), tmp_path / "redis", appendonly=True)
    server.dir.mkdir()
    server.start()
    yield server
    server.stop()


async def replica(make_proxy: ProxyFactory, tmp_path: Path, name: str, redis: RedisServer) -> Proxy:
    # two replicas embed on one shared CPU here: no embedder deadline, where there is one
    patient = {"embed_timeout_ms": 60_000.0} if "embed_timeout_ms" in Settings.__dataclass_fields__ else {}
    return await make_proxy(store="redis", redis_url=redis.url, data_dir=tmp_path / name, admin_token=TOKEN, **patient)


async def until(check: Callable[[], bool], bound: float = PROPAGATION_BOUND_S) -> float:
    """Seconds until ``check`` holds; fails past ``bound``."""
    t0 = time.perf_counter()
    while not check():
        assert time.perf_counter() - t0 < bound, "not propagated within the bound"
        await asyncio.sleep(0.005)
    return time.perf_counter() - t0


async def only_record(proxy: Proxy) -> Record:
    (record,) = [r async for r in proxy.app[keys.CACHE].store.iter_live()]
    return record


async def test_a_turn_answered_through_one_replica_is_a_hit_through_the_other(
    make_proxy: ProxyFactory, tmp_path: Path, redis: RedisServer
) -> None:
    a, b = await replica(make_proxy, tmp_path, "a", redis), await replica(make_proxy, tmp_path, "b", redis)
    ca, cb = a.client(**{"x-smartcache-session": "s1"}), b.client(**{"x-smartcache-session": "s1"})
    question = ask("How do bees make honey?")
    assert (await chat(ca, question))[0] == "miss"
    record = await only_record(a)
    t0 = time.perf_counter()  # the write is in the store before the reply is sent
    await until(lambda: record.label in b.app[keys.CACHE].keys)
    seen = time.perf_counter() - t0
    status, answer, _ = await chat(cb, ask("how do bees make honey"))
    assert status == "hit" and answer == record.answer_text
    print(f"insert, from A's reply, reached B's index in {seen * 1000:.1f} ms")

    # a thumbs-down through B lowers the record A serves from
    code, body = await admin(b, "POST", "/admin/feedback", json={"cache_id": record.cache_id, "feedback": "negative"})
    assert code == 200
    after = await a.app[keys.CACHE].store.get(record.cache_id)
    assert after is not None and after.feedback_score == body["feedback_score"] < record.feedback_score

    # an invalidation through A stops hits on B within the bound
    t0 = time.perf_counter()
    code, body = await admin(a, "POST", "/admin/invalidate", json={"cache_id": record.cache_id, "apply": True})
    assert code == 200 and body["matched"] == 1
    await until(lambda: record.label not in b.app[keys.CACHE].keys)
    gone = time.perf_counter() - t0
    assert (await chat(cb, ask("how do bees make honey")))[0] != "hit"
    print(f"invalidation, from the admin call on A, left B's index in {gone * 1000:.1f} ms")
    await ca.close()
    await cb.close()


async def test_a_session_reset_through_one_replica_reaches_the_other(
    make_proxy: ProxyFactory, tmp_path: Path, redis: RedisServer
) -> None:
    a, b = await replica(make_proxy, tmp_path, "a", redis), await replica(make_proxy, tmp_path, "b", redis)
    ca = a.client(**{"x-smartcache-session": "s2"})
    await chat(ca, ask("Why is the ocean salty?"))
    record = await only_record(a)
    await until(lambda: record.label in b.app[keys.CACHE].keys)
    code, body = await admin(a, "POST", "/admin/sessions/s2/reset", json={"tenant": record.tenant})
    assert code == 200 and body["invalidated"] == 1
    await until(lambda: record.label not in b.app[keys.CACHE].keys)
    await ca.close()


@pytest.mark.slow
async def test_a_restarted_replica_catches_up(make_proxy: ProxyFactory, tmp_path: Path, redis: RedisServer) -> None:
    a, b = await replica(make_proxy, tmp_path, "a", redis), await replica(make_proxy, tmp_path, "b", redis)
    await b.stop()
    ca = a.client(**{"x-smartcache-session": "s3"})
    await chat(ca, ask("What causes earthquakes?"))
    record = await only_record(a)
    b = await replica(make_proxy, tmp_path, "b", redis)  # its snapshot predates the answer
    assert record.label in b.app[keys.CACHE].keys
    cb = b.client(**{"x-smartcache-session": "s3"})
    assert (await chat(cb, ask("what causes earthquakes")))[0] == "hit"
    await ca.close()
    await cb.close()


async def test_redis_down_means_bypass_never_an_error_and_nothing_ready_is_lost(
    make_proxy: ProxyFactory, tmp_path: Path, redis: RedisServer
) -> None:
    a = await replica(make_proxy, tmp_path, "a", redis)
    ca = a.client(**{"x-smartcache-session": "s4"})
    await chat(ca, ask("How do airplanes stay in the air?"))
    record = await only_record(a)
    redis.stop()
    for _ in range(3):
        status, answer, raw = await chat(ca, ask("how do airplanes stay in the air"))
        assert raw.http_response.status_code == 200 and status == "bypass" and answer
    status, _, _ = await chat(ca, ask("Why do cats purr?"))
    assert status == "bypass"
    redis.start()  # with its append-only file: the same records
    assert (await a.app[keys.CACHE].store.get(record.cache_id)) == record
    status, answer, _ = await chat(ca, ask("how do airplanes stay in the air"))
    assert status == "hit" and answer == record.answer_text
    await ca.close()


async def test_a_reload_to_a_new_policy_version_on_one_replica_leaves_the_others_answers(
    make_proxy: ProxyFactory, tmp_path: Path, redis: RedisServer
) -> None:
    """A rolling deploy by reload: B switches to the next version while A still serves the old one.
    B indexes only the new version's records and retires nothing A serves; A keeps its hits."""
    policy = tmp_path / "policy.yaml"
    text = DEFAULT_POLICY.read_text(encoding="utf-8")
    policy.write_text(text, encoding="utf-8")
    a = await replica(make_proxy, tmp_path, "a", redis)
    b = await make_proxy(store="redis", redis_url=redis.url, data_dir=tmp_path / "b", admin_token=TOKEN, policy=policy)
    ca, cb = a.client(**{"x-smartcache-session": "v1"}), b.client(**{"x-smartcache-session": "v1"})
    assert (await chat(ca, ask("How do bees make honey?")))[0] == "miss"
    record = await only_record(a)
    await until(lambda: record.label in b.app[keys.CACHE].keys)
    old = next(line for line in text.splitlines() if line.startswith("version: "))
    policy.write_text(text.replace(old, old + "-next"), encoding="utf-8")
    code, body = await admin(b, "POST", "/admin/policy/reload")
    assert code == 200 and body["version"].endswith("-next") and body["invalidated"] == 0
    assert record.label not in b.app[keys.CACHE].keys  # B serves the new version only
    kept = await a.app[keys.CACHE].store.get(record.cache_id)
    assert kept is not None and kept.state == "ready"
    assert (await chat(ca, ask("how do bees make honey")))[0] == "hit"  # A keeps its answer
    assert (await chat(cb, ask("how do bees make honey")))[0] != "hit"
    await ca.close()
    await cb.close()


async def test_an_alias_the_judge_approved_on_one_replica_is_the_others_hit(
    make_proxy: ProxyFactory, tmp_path: Path, redis: RedisServer, upstream: Upstream
) -> None:
    """Replica A's judge says yes to a reworded question: the alias it writes reaches B through the
    store's stream, and B serves that wording with no judge call of its own."""
    upstream.script.answers = {CAPITAL: PARIS, CAPITAL_REWORDED: PARIS}
    policy = judging_policy(tmp_path)
    a = await make_proxy(store="redis", redis_url=redis.url, data_dir=tmp_path / "a", policy=policy, judge=True)
    b = await make_proxy(store="redis", redis_url=redis.url, data_dir=tmp_path / "b", policy=policy, judge=True)
    assert (await chat(a.client(), ask(CAPITAL)))[0] == "miss"
    assert await qualified(a)
    status, served, _ = await chat(a.client(), ask(CAPITAL_REWORDED))
    assert (status, served) == ("hit", PARIS)
    await a.settled()
    alias = next(r for r in [r async for r in a.app[keys.CACHE].store.iter_live()] if r.coarse_tags.alias_of)
    await until(lambda: alias.label in b.app[keys.CACHE].keys)
    judged = len(upstream.script.judge_calls)
    status, served, raw = await chat(b.client(), ask(CAPITAL_REWORDED))
    assert (status, served, raw.headers.get("x-cache-reason")) == ("hit", PARIS, "exact_repeat")
    assert len(upstream.script.judge_calls) == judged


async def test_a_no_the_judge_said_on_one_replica_is_not_asked_again_on_the_other(
    make_proxy: ProxyFactory, tmp_path: Path, redis: RedisServer, upstream: Upstream
) -> None:
    """Replica A's judge says no to a reworded question about A's record: the refusal is in the
    shared store, so B, whose judge is qualified too, does not offer that record to the judge for
    the same words."""
    policy = judging_policy(tmp_path)
    a = await make_proxy(store="redis", redis_url=redis.url, data_dir=tmp_path / "a", policy=policy, judge=True)
    b = await make_proxy(store="redis", redis_url=redis.url, data_dir=tmp_path / "b", policy=policy, judge=True)
    assert (await chat(a.client(), ask(CAPITAL)))[0] == "miss"
    record = await only_record(a)
    await until(lambda: record.label in b.app[keys.CACHE].keys)
    assert (await chat(b.client(), ask(CAPITAL)))[0] == "hit"  # and B's judge takes its exam
    assert await qualified(a) and await qualified(b)
    no_store = {"cache": {"no_store": True}}  # the reworded answer is not a record of its own
    # the script answers the reworded question otherwise: A's judge says no
    status, _, _ = await chat(a.client(), ask(CAPITAL_REWORDED), extra_body=no_store)
    assert status != "hit" and len(upstream.script.judge_calls) == 1
    judging = a.app[keys.CHAT].judging
    assert judging is not None
    await judging.landed()
    status, _, _ = await chat(b.client(), ask(CAPITAL_REWORDED), extra_body=no_store)
    assert status != "hit"
    assert len(upstream.script.judge_calls) == 1
