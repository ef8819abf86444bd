"""The composition follows what a store backend declares, not its class: a backend declared
shared (a fake one registered here) gets the change feed, the policy-version register, the
vector-search probe and a feed checkpoint at shutdown; a store of one process gets saved keys.
Shutdown is one ordered sequence: the bookkeeping after replies, then the feed and version beat,
then the index save, then the prewarmer, the upstream client and last the store."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np
import pytest

import proxy.service.compose
import proxy.service.indexing
from proxy.core.policy import load_policy
from proxy.embedding.backends import Matrix, l2_normalise
from proxy.observability.metrics import Metrics
from proxy.service.compose import NOWHERE, open_parts
from proxy.service.indexing import checkpoint_path
from proxy.service.settling import Settling
from proxy.settings import DEFAULT_POLICY, Settings
from proxy.storage.backends import BACKENDS, Backend, Capabilities, Store, StoreSettings
from proxy.storage.keyfile import keys_path
from proxy.storage.redis_codec import Changes, StreamPosition
from proxy.storage.redis_probe import VectorSearch
from proxy.storage.sqlite import SqliteStore
from proxy.upstream.client import Upstream
from proxy.upstream.prewarm import Prewarmer

DIM = 16


class HashEmbedder:
    """A model-free embedder: a text's vector is drawn from its hash (the composition is under
    test here, not the answers)."""

    name, dim, max_tokens = "hash", DIM, 512

    def embed(self, texts: Sequence[str]) -> Matrix:
        rows = [np.random.default_rng(int(hashlib.md5(t.encode()).hexdigest()[:8], 16)).random(DIM) for t in texts]
        return l2_normalise(np.array(rows).reshape(len(texts), DIM))

    def count_tokens(self, text: str) -> int:
        return len(text.split())


class Versions:
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    async def beat(self, version: str) -> list[str]:
        self.seen.append(f"beat {version}")
        return []

    async def forget(self, version: str) -> bool:
        return False


class SharedSqlite(SqliteStore):
    """A SQLite store declared shared: an empty change stream, a register that retires nothing."""

    seen: list[str]

    def follow_policy(self, version: Callable[[], str]) -> None:
        self.seen.append(f"follow {version()}")

    def versions(self) -> Versions:
        return Versions(self.seen)

    async def vector_search(self) -> VectorSearch:
        self.seen.append("probe")
        return VectorSearch(False, "a fake")

    async def stream_position(self) -> StreamPosition:
        return StreamPosition("0-0", 0)

    async def changes(self, after: StreamPosition, *, block_ms: int = 1000, count: int = 1000) -> Changes:
        self.seen.append("changes")
        await asyncio.sleep(block_ms / 1000)
        return Changes((), after, trimmed=False)


def fake_shared(seen: list[str]) -> Backend:
    async def open_shared(s: StoreSettings) -> Store:
        store = await SharedSqlite.open(s.db_path)
        store.seen = seen
        return Store(store, shared=store)

    return Backend("fake", Capabilities(shared=True), open_shared)


def settings(tmp_path: Path, store: str) -> Settings:
    return Settings(data_dir=tmp_path, store=store, verify=False)


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.01)


def quiet() -> bool:
    """No change feed and no version beat is running (stopped, or never started)."""
    return not any(t.get_name() in ("change-feed", "policy-versions") for t in asyncio.all_tasks())


async def test_a_backend_declared_shared_gets_the_feed_path(tmp_path: Path) -> None:
    seen: list[str] = []
    s = settings(tmp_path, "fake")
    policy = load_policy(DEFAULT_POLICY)
    backends = {**BACKENDS, "fake": fake_shared(seen)}
    async with open_parts(
        s, upstream_url=NOWHERE, metrics=Metrics(), backend=HashEmbedder(), policy=policy, backends=backends
    ) as parts:
        assert parts.store.shared is parts.cache.store
        await until(lambda: "changes" in seen)  # the feed runs
        assert any(t.get_name() == "change-feed" for t in asyncio.all_tasks())
    assert seen[:3] == ["probe", f"follow {policy.version}", f"beat {policy.version}"]
    assert checkpoint_path(s).exists()  # the next start resumes the feed from it
    assert quiet()


async def test_a_store_of_one_process_gets_saved_keys_and_no_feed(tmp_path: Path) -> None:
    s = settings(tmp_path, "sqlite")
    async with open_parts(s, upstream_url=NOWHERE, metrics=Metrics(), backend=HashEmbedder()) as parts:
        assert parts.store.shared is None
        assert quiet()
    assert keys_path(s.index_snapshot_path).exists() and not checkpoint_path(s).exists()


@pytest.mark.parametrize("store", ["sqlite", "fake"])
async def test_shutdown_is_one_ordered_sequence(tmp_path: Path, store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []

    def noting(owner: object, name: str, what: str) -> None:
        real = getattr(owner, name)

        async def call(*args: object) -> object:
            saving = what.endswith("saved")
            order.append(f"{what} while the feed runs" if saving and not quiet() else what)
            return await real(*args)

        monkeypatch.setattr(owner, name, call)

    noting(proxy.service.indexing, "_save_snapshot", "index saved")
    noting(proxy.service.indexing, "_save_checkpoint", "checkpoint saved")
    noting(Settling, "close", "settled")
    noting(Prewarmer, "close", "prewarmer closed")
    noting(Upstream, "close", "upstream closed")
    noting(SqliteStore, "close", "store closed")
    backends = {**BACKENDS, "fake": fake_shared([])}
    s = settings(tmp_path, store)
    async with open_parts(s, upstream_url=NOWHERE, metrics=Metrics(), backend=HashEmbedder(), backends=backends):
        pass
    saves = ["index saved", "checkpoint saved"] if store == "fake" else ["index saved"]
    assert order == ["settled", *saves, "prewarmer closed", "upstream closed", "store closed"]


async def test_a_failed_start_closes_what_opened_and_saves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []
    real_close = SqliteStore.close

    async def close(self: SqliteStore) -> None:
        closed.append("store")
        await real_close(self)

    monkeypatch.setattr(SqliteStore, "close", close)
    monkeypatch.setattr(proxy.service.compose, "ContextSigner", _failing_signer)
    s = settings(tmp_path, "sqlite")
    with pytest.raises(RuntimeError, match="no signer"):
        async with open_parts(s, upstream_url=NOWHERE, metrics=Metrics(), backend=HashEmbedder()):
            pass
    assert closed == ["store"]
    assert not s.index_snapshot_path.exists() and not keys_path(s.index_snapshot_path).exists()


def _failing_signer(*args: object, **kwargs: object) -> NoReturn:
    """The start failing at a step after the cache opened its index (the signer is built then)."""
    raise RuntimeError("no signer")


def test_the_verifier_loads_for_the_judge_only_where_the_judge_runs() -> None:
    """The shipped policy has the pair verifier rank what its judge reads: it is loaded when the
    judge is on, and not when it is off (``judge: false``) and no intent verifies by itself."""
    from proxy.service.compose import wants_verifier

    policy = load_policy(DEFAULT_POLICY)
    assert policy.judges
    assert wants_verifier(Settings(), policy)
    assert not wants_verifier(Settings(judge=False), policy)
    assert not wants_verifier(Settings(verify=False), policy)


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (3, 1), (16, 8)])
def test_a_model_left_open_runs_on_half_the_cores_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch, cores: int, threads: int
) -> None:
    monkeypatch.setattr(proxy.service.compose.os, "sched_getaffinity", lambda _pid: set(range(cores)), raising=False)
    assert proxy.service.compose.model_threads() == threads
