"""The HNSW graph and the mirror's keys are saved at shutdown and loaded at start instead of read
and rebuilt from SQLite, then brought level with SQLite: what was written after the snapshot is
added, what died is dropped, and a snapshot of another database, model or shape, or a damaged one,
costs a rebuild, never a wrong neighbour."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from proxy.http import keys
from proxy.model import RecordState
from proxy.storage.base import IndexKey, Selector
from proxy.storage.hnsw import HnswIndex
from proxy.storage.sqlite import SqliteStore
from tests.conftest import ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


KEY = IndexKey.interned(10, "t", "s", None, "tenant", "m", "v", "", "general")


def test_snapshot_round_trip_keeps_graph_live_labels_and_deletions(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    index = HnswIndex(32, exact_limit=100)
    vectors = unit(rng, 300, 32)
    index.add(list(range(1, 301)), vectors, [KEY] * 300)
    index.delete([5, 6, 7])
    path = tmp_path / "index.hnsw"
    index.save(path, stamp="m dim=32 store=a")
    loaded = HnswIndex.from_snapshot(path, dim=32, stamp="m dim=32 store=a")
    assert loaded is not None
    assert loaded.labels() == index.labels() and len(loaded) == 297
    assert loaded.deleted_fraction == pytest.approx(index.deleted_fraction)
    for q in unit(rng, 20, 32):
        assert loaded.search(q, 5) == index.search(q, 5)
    assert all(lab not in (5, 6, 7) for lab, _ in loaded.search(vectors[5], 10))
    loaded.add([301], unit(rng, 1, 32), [KEY])  # still growable after loading
    assert 301 in loaded.labels()


@pytest.mark.parametrize(
    ("dim", "stamp"), [(32, "other-model dim=32 store=a"), (32, "m dim=32 store=b"), (16, "m dim=32 store=a")]
)
def test_a_snapshot_of_another_model_store_or_shape_is_not_used(tmp_path: Path, dim: int, stamp: str) -> None:
    index = HnswIndex(32)
    index.add([1, 2], unit(np.random.default_rng(1), 2, 32), [KEY, KEY])
    index.save(tmp_path / "index.hnsw", stamp="m dim=32 store=a")
    assert HnswIndex.from_snapshot(tmp_path / "index.hnsw", dim=dim, stamp=stamp) is None
    assert HnswIndex.from_snapshot(tmp_path / "missing.hnsw", dim=32, stamp="m dim=32 store=a") is None


@pytest.mark.slow
async def test_restart_loads_the_snapshot_and_levels_it_with_sqlite(
    make_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    first = await make_proxy()
    client = first.client(**{"x-smartcache-session": "s"})
    assert (await chat(client, ask("What is the tallest mountain in Europe?")))[0] == "miss"
    await first.stop()
    snapshot = data / "index.hnsw"
    assert snapshot.is_file() and Path(f"{snapshot}.json").is_file() and Path(f"{snapshot}.keys").is_file()
    old = tmp_path / "old"
    old.mkdir()
    for f in (snapshot, Path(f"{snapshot}.json"), Path(f"{snapshot}.keys")):
        shutil.copy(f, old / f.name)

    second = await make_proxy()
    client = second.client(**{"x-smartcache-session": "s"})
    assert (await chat(client, ask("How long is the river Danube?")))[0] == "miss"
    await second.stop()
    # a stale snapshot and stale keys (from before the Danube answer), the Elbrus answer invalidated since
    for f in old.iterdir():
        shutil.copy(f, data / f.name)
    store = await SqliteStore.open(data / "cache.sqlite3")
    await store.set_state(Selector(labels=(1,)), RecordState.INVALID)  # the Elbrus answer
    await store.close()

    def no_rebuild(self: HnswIndex) -> HnswIndex:
        raise AssertionError("the index was rebuilt instead of loaded")

    async def no_full_read(self: SqliteStore, *, vectors: bool = True) -> None:
        raise AssertionError("every key was read from the store instead of the saved ones")

    monkeypatch.setattr(HnswIndex, "fresh", no_rebuild)
    monkeypatch.setattr(SqliteStore, "iter_index_rows", no_full_read)
    third = await make_proxy()
    assert third.app[keys.CACHE].index.labels() == {2}
    client = third.client(**{"x-smartcache-session": "s"})
    assert (await chat(client, ask("how long is the river danube")))[0] == "hit"
    assert (await chat(client, ask("what is the tallest mountain in europe")))[0] == "miss"
    await third.stop()


@pytest.mark.slow
async def test_a_recreated_database_or_a_damaged_snapshot_or_keys_file_means_a_rebuild(
    make_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    first = await make_proxy()
    client = first.client(**{"x-smartcache-session": "s"})
    await chat(client, ask("What is the tallest mountain in Europe?"))
    await first.stop()
    for f in data.glob("cache.sqlite3*"):
        f.unlink()  # its labels restart at 1: the old graph must not be adopted
    second = await make_proxy()
    assert len(second.app[keys.CACHE].index) == 0
    client = second.client(**{"x-smartcache-session": "s"})
    assert (await chat(client, ask("what is the tallest mountain in europe")))[0] == "miss"
    await second.stop()
    (data / "index.hnsw").write_bytes(b"not a graph")
    third = await make_proxy()
    assert third.app[keys.CACHE].index.labels() == {1}
    client = third.client(**{"x-smartcache-session": "s"})
    assert (await chat(client, ask("What is the tallest mountain in Europe ?")))[0] == "hit"
    await third.stop()
    (data / "index.hnsw.keys").write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00junk")  # the graph is whole
    fourth = await make_proxy()
    assert set(fourth.app[keys.CACHE].keys) == {1} and fourth.app[keys.CACHE].index.labels() == {1}
    client = fourth.client(**{"x-smartcache-session": "s"})
    assert (await chat(client, ask("what is the tallest mountain in Europe")))[0] == "hit"
    await fourth.stop()
