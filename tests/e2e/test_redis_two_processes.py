"""Two proxy processes (``python -m proxy serve``, each with its own data dir and HNSW index) in front
of one scripted upstream, sharing one real redis-server, driven through the official openai SDK:
what one answers the other serves, a correction through one lowers the record for the other, a
reset or an invalidation through one stops hits on the other within a measured bound, a replica
killed mid-traffic catches up when it comes back, and a Redis outage costs bypasses, never an error
or a ready record."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from proxy.settings import DEFAULT_POLICY
from tests.conftest import Upstream
from tests.e2e.test_e2e_core import ask, chat
from tests.storage.redis_server import BINARY, RedisServer, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "admin-s3cret"
# the bound the tests assert for a change made through one replica to leave the other's index:
# the feed wakes on the event (a blocking XREAD), so it is a few ms; the rest is headroom for a
# shared two-core machine running two proxies and their models
PROPAGATION_BOUND_S = 1.5
START_TIMEOUT_S = 180.0


@dataclass
class Replica:
    """One ``python -m proxy serve`` process on a loopback port."""

    name: str
    data_dir: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None
    sdk: openai.AsyncOpenAI | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.name}.log"

    def log(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    async def start(self, upstream: str) -> None:
        with self.log_path.open("a", encoding="utf-8") as out:
            self.process = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "proxy", "serve", "--upstream", upstream),
                *("--host", "127.0.0.1", "--port", str(self.port), "--data-dir", str(self.data_dir)),
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.returncode is None, self.log_path.read_text()[-3000:]
            with contextlib.suppress(aiohttp.ClientError, OSError):
                if await self.health():
                    return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{self.name} did not start: {self.log_path.read_text()[-3000:]}")

    async def health(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.get(f"{self.root}/healthz") as resp:
            return dict(await resp.json()) if resp.status == 200 else {}

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as http, http.get(f"{self.root}/metrics") as resp:
            return await resp.text()

    async def indexed(self) -> int:
        return int((await self.health())["records_indexed"])

    async def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            aiohttp.ClientSession() as http,
            http.request(method, self.root + path, json=body, headers=headers) as resp,
        ):
            return resp.status, await resp.json(content_type=None)

    async def say(self, session: str, text: str, history: list[dict[str, str]] | None = None) -> tuple[str, str, Any]:
        """One user turn in ``session`` through the openai SDK: (x-cache-status, answer, raw response)."""
        if self.sdk is None:
            self.sdk = openai.AsyncOpenAI(base_url=f"{self.root}/v1", api_key="key-A", max_retries=0, timeout=60)
        return await chat(self.sdk, ask(text, history), extra_headers={"x-smartcache-session": session})

    async def end(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(sig)
            await asyncio.wait_for(self.process.wait(), timeout=60)
        self.process = None
        if self.sdk is not None:
            await self.sdk.close()
            self.sdk = None


@dataclass
class Cluster:
    redis: RedisServer
    upstream: Upstream
    a: Replica
    b: Replica


def session_pools(tmp_path: Path) -> Path:
    """The shipped policy with every answer kept to its session: the checks here (a user's reset
    through one replica, one record per session's question) read the session's own answers, and
    sharing across sessions has tests of its own (tests/e2e/test_widened_scopes.py)."""
    data = yaml.safe_load(DEFAULT_POLICY.read_text(encoding="utf-8"))
    for intent in [data["defaults"], *data["intents"].values()]:
        intent["widen_to"] = intent["repeats_widen_to"] = "session"
    path = tmp_path / "session-pools.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def proxy_env(model_home: Path, redis_url: str, policy: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMARTCACHE_")}
    return {
        **env,
        **({"SMARTCACHE_POLICY": str(policy)} if policy else {}),
        "SMARTCACHE_MODEL_HOME": str(model_home),
        "SMARTCACHE_STORE": "redis",
        "SMARTCACHE_REDIS_URL": redis_url,
        "SMARTCACHE_READY_AFTER": "0",
        "SMARTCACHE_ADMIN_TOKEN": TOKEN,
        # two proxies embed on one shared CPU here: no embedder deadline, one thread each
        "SMARTCACHE_EMBED_TIMEOUT_MS": "60000",
        "SMARTCACHE_EMBED_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
async def cluster(tmp_path: Path, model_home: Path, upstream: Upstream) -> AsyncIterator[Cluster]:
    if shutil.which(BINARY) is None:
        pytest.skip(f"{BINARY} is not installed (Debian: apt-get install redis-server); .ci/run installs it")
    redis = RedisServer(free_port(), tmp_path / "redis", appendonly=True)
    redis.dir.mkdir()
    redis.start()
    env = proxy_env(model_home, redis.url, session_pools(tmp_path))
    a, b = Replica("a", tmp_path / "a", env), Replica("b", tmp_path / "b", env)
    try:
        await asyncio.gather(a.start(upstream.url), b.start(upstream.url))
        yield Cluster(redis, upstream, a, b)
    finally:
        await asyncio.gather(a.end(), b.end(), return_exceptions=True)
        redis.stop()


async def within(check: Callable[[], Awaitable[bool]], bound: float = PROPAGATION_BOUND_S) -> float:
    """Seconds until ``check`` holds; fails past ``bound``."""
    t0 = time.perf_counter()
    while not await check():
        assert time.perf_counter() - t0 < bound, f"not propagated within {bound} s"
        await asyncio.sleep(0.005)
    return time.perf_counter() - t0


async def record_of(replica: Replica, cache_id: str) -> dict[str, Any]:
    code, body = await replica.admin("GET", "/admin/records?limit=1000")
    assert code == 200
    (found,) = [r for r in body["records"] if r["cache_id"] == cache_id]
    return dict(found)


async def written(replica: Replica, session: str) -> dict[str, Any]:
    """The one record of ``session``, read through ``replica``'s admin API."""
    code, body = await replica.admin("GET", f"/admin/records?session={session}")
    assert code == 200
    (record,) = body["records"]
    return dict(record)


async def ready_ids(replica: Replica) -> set[str]:
    code, body = await replica.admin("GET", "/admin/records?state=ready&limit=1000")
    assert code == 200
    return {r["cache_id"] for r in body["records"]}


async def grows(replica: Replica, before: int, by: int = 1) -> float:
    """Seconds until ``replica``'s index holds ``by`` more records than ``before`` (fewer when negative)."""

    async def check() -> bool:
        return await replica.indexed() == before + by

    return await within(check)


async def test_a_hit_across_replicas_and_feedback_reset_and_invalidation_through_the_other(
    cluster: Cluster,
) -> None:
    a, b = cluster.a, cluster.b
    status, answer, _ = await a.say("s1", "How do bees make honey?")
    assert status == "miss"
    cache_id = (await written(a, "s1"))["cache_id"]
    seen = await grows(b, 0)
    status, again, raw = await b.say("s1", "how do bees make honey")
    assert status == "hit" and again == answer and raw.headers["x-cache-id"] == cache_id
    print(f"insert, from A's reply to B's index: {seen * 1000:.1f} ms")

    # the user tells B its answer was wrong: the record A reads loses score and A stops serving it
    before = (await record_of(a, cache_id))["feedback_score"]
    history = [{"role": "user", "content": "how do bees make honey"}, {"role": "assistant", "content": again}]
    assert (await b.say("s1", "that's wrong", history))[0] == "miss"
    assert (await record_of(a, cache_id))["feedback_score"] < before
    assert (await a.say("s1", "How do bees make honey?"))[0] != "hit"

    # an invalidation through A leaves B's index within the bound, and B serves it no more
    await a.say("s2", "Why do cats purr?")
    purr = (await written(a, "s2"))["cache_id"]
    await within(lambda: same_index(a, b))
    assert (await b.say("s2", "why do cats purr"))[0] == "hit"
    indexed = await b.indexed()
    code, body = await a.admin("POST", "/admin/invalidate", {"cache_id": purr, "apply": True})
    assert code == 200 and body["matched"] == 1
    gone = await grows(b, indexed, -1)
    assert (await b.say("s2", "why do cats purr"))[0] != "hit"
    print(f"invalidation, from A's admin reply to B's index: {gone * 1000:.1f} ms")

    # a session reset said through A: B stops serving the session's answers within the bound
    await a.say("s3", "Why is the ocean salty?")
    await within(lambda: same_index(a, b))
    assert (await b.say("s3", "why is the ocean salty"))[0] == "hit"
    indexed = await b.indexed()
    assert (await a.say("s3", "Let's start over."))[0] == "bypass"
    reset = await grows(b, indexed, -1)
    assert (await b.say("s3", "why is the ocean salty"))[0] != "hit"
    print(f"session reset, from A's reply to B's index: {reset * 1000:.1f} ms")


async def same_index(a: Replica, b: Replica) -> bool:
    return await a.indexed() == await b.indexed()


QUESTIONS = [
    "What causes earthquakes?",
    "How do airplanes stay in the air?",
    "How does a refrigerator keep food cold?",
    "How do vaccines train the immune system?",
    "Why is the sky blue?",
    "How do volcanoes form?",
    "What makes a rainbow appear?",
    "How do magnets work?",
    "Why do leaves change colour in autumn?",
    "How does the moon cause tides?",
]


async def test_a_replica_killed_mid_traffic_catches_up_from_the_stream(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    await a.say("gone", "How do bees make honey?")
    tenant = (await written(a, "gone"))["tenant"]
    await within(lambda: same_index(a, b))
    answered: list[tuple[str, str]] = []
    back = asyncio.Event()

    async def traffic() -> None:  # A answers new questions, each in a session of its own, throughout
        i = 0
        while not back.is_set():
            question = QUESTIONS[i % len(QUESTIONS)]
            _, _, raw = await a.say(f"t{i}", question)
            assert raw.http_response.status_code == 200
            answered.append((f"t{i}", question))
            i += 1
            await asyncio.sleep(0.1)

    running = asyncio.create_task(traffic())
    await asyncio.sleep(0.5)
    await b.end(signal.SIGKILL)  # no shutdown at all: nothing saved
    code, body = await a.admin("POST", "/admin/sessions/gone/reset", {"tenant": tenant})
    assert code == 200 and body["invalidated"] == 1
    await b.start(cluster.upstream.url)
    await asyncio.sleep(0.5)  # and some traffic after it is back
    back.set()
    await running
    assert len(answered) >= 5
    await within(lambda: same_index(a, b))
    assert await b.indexed() == len(answered)
    # each once: the same words again in a session are a regenerate, which is never served
    for session, question in dict.fromkeys(answered[:: max(1, len(answered) // 6)] + answered[-1:]):
        assert (await b.say(session, question.lower().rstrip("?")))[0] == "hit", (session, question)
    assert (await b.say("gone", "how do bees make honey"))[0] != "hit"


async def test_redis_stopped_and_restarted_means_bypasses_no_errors_and_no_lost_ready_records(
    cluster: Cluster,
) -> None:
    a, b, redis = cluster.a, cluster.b, cluster.redis
    ids = set()
    for i, question in enumerate(QUESTIONS[:4]):
        await a.say(f"r{i}", question)
        ids.add((await written(a, f"r{i}"))["cache_id"])
    await within(lambda: same_index(a, b))
    assert await ready_ids(a) == ids
    redis.stop()
    outage = []
    for i, question in enumerate(QUESTIONS[:4]):
        for replica in (a, b):
            status, answer, raw = await replica.say(f"r{i}", question.lower().rstrip("?"))
            outage.append((raw.http_response.status_code, status, bool(answer)))
    status, answer, raw = await b.say("new", "Why do cats purr?")
    outage.append((raw.http_response.status_code, status, bool(answer)))
    assert outage == [(200, "bypass", True)] * 9
    redis.start()  # with its append-only file: the same records
    assert await ready_ids(a) == ids == await ready_ids(b)
    # one turn per session: the same request twice in a session would be a regenerate
    for i, question in enumerate(QUESTIONS[:4]):
        assert (await (a, b)[i % 2].say(f"r{i}", question.lower().rstrip("?")))[0] == "hit"
    # both feeds follow the stream again: a new answer through B reaches A
    indexed = await a.indexed()
    await b.say("after", "Why do cats purr?")
    await grows(a, indexed)


async def test_a_replica_stopped_and_started_again_resumes_from_its_saved_stream_position(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    for i, question in enumerate(QUESTIONS[:3]):
        await a.say(f"k{i}", question)
    await within(lambda: same_index(a, b))
    tenant = (await written(a, "k0"))["tenant"]
    await b.end()  # a clean stop: B saves its index and the stream position it reflects
    assert (b.data_dir / "index.hnsw.feed").is_file()
    for i, question in enumerate(QUESTIONS[3:5], start=3):
        await a.say(f"k{i}", question)
    code, body = await a.admin("POST", "/admin/sessions/k0/reset", {"tenant": tenant})
    assert code == 200 and body["invalidated"] == 1
    await b.start(cluster.upstream.url)
    (resumed,) = [e for e in b.log() if e["event"] == "feed.resumed"]
    # only what it missed: two answers in, one out; none of the records read again
    assert (resumed["added"], resumed["forgotten"], resumed["rebuilt"], resumed["records"]) == (2, 1, False, 4)
    assert await b.indexed() == await a.indexed() == 4
    for i, question in enumerate(QUESTIONS[1:5], start=1):
        assert (await b.say(f"k{i}", question.lower().rstrip("?")))[0] == "hit", question
    assert (await b.say("k0", QUESTIONS[0].lower().rstrip("?")))[0] != "hit"
    metrics = await b.metrics()
    assert "smartcache_feed_lag_events 0.0" in metrics and "smartcache_store_vector_search 0.0" in metrics
    assert [e for e in b.log() if e["event"] == "store.vector_search"][-1]["available"] is False

    # killed this time: the next start goes on from the older checkpoint, so it must apply
    # everything since, B's own writes included
    await b.say("k5", QUESTIONS[5])
    await within(lambda: same_index(a, b))
    code, body = await a.admin("POST", "/admin/sessions/k1/reset", {"tenant": tenant})
    assert code == 200 and body["invalidated"] == 1
    await b.end(signal.SIGKILL)
    await b.start(cluster.upstream.url)
    resumed = [e for e in b.log() if e["event"] == "feed.resumed"][-1]
    # since the first checkpoint (k0-k2): k3 and k4 through A, k0's fresh answer (its miss above)
    # and k5 through B in; k0's and k1's first answers out
    assert (resumed["added"], resumed["forgotten"], resumed["records"]) == (4, 2, 5)
    assert await b.indexed() == await a.indexed() == 5
    assert (await b.say("k5", QUESTIONS[5].lower().rstrip("?")))[0] == "hit"
    assert (await b.say("k1", QUESTIONS[1].lower().rstrip("?")))[0] != "hit"


async def test_replicas_on_two_policy_versions_neither_serve_nor_wipe_each_others_records(
    cluster: Cluster, tmp_path: Path
) -> None:
    a, b = cluster.a, cluster.b
    await a.say("v0", QUESTIONS[0])
    await within(lambda: same_index(a, b))
    # a rolling deploy: B comes back with the next policy version while A still runs the old one
    shipped = ROOT / "policies" / "default.yaml"
    text = shipped.read_text(encoding="utf-8")
    old = next(line for line in text.splitlines() if line.startswith("version: "))
    newer = tmp_path / "next.yaml"
    newer.write_text(text.replace(old, old + "-next"), encoding="utf-8")
    await b.end()
    b.env = {**b.env, "SMARTCACHE_POLICY": str(newer)}
    await b.start(cluster.upstream.url)
    assert (await b.health())["policy_version"] == old.removeprefix("version: ") + "-next"
    # its saved checkpoint names the old version: B reads the records of its own version instead
    assert [e["reason"] for e in b.log() if e["event"] == "feed.checkpoint_not_used"] == ["another policy version"]
    assert await b.indexed() == 0 and await a.indexed() == 1  # B indexes none of A's; A's are not wiped
    assert len(await ready_ids(a)) == 1
    await a.say("v1", QUESTIONS[1])
    await b.say("v2", QUESTIONS[2])
    await asyncio.sleep(0.3)  # time for either feed to (wrongly) take the other's record
    assert (await a.indexed(), await b.indexed()) == (2, 1)
    assert (await b.say("v1", QUESTIONS[1].lower().rstrip("?")))[0] != "hit"
    assert (await a.say("v2", QUESTIONS[2].lower().rstrip("?")))[0] != "hit"
    assert (await a.say("v0", QUESTIONS[0].lower().rstrip("?")))[0] == "hit"
