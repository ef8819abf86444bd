"""A restart loads the HNSW graph and the mirror's keys saved at shutdown instead of reading and
rebuilding them from SQLite, then brings them level with SQLite: what was written after the snapshot
is added, what died is dropped, and a snapshot of another database, or a damaged one, costs a
rebuild, never a wrong neighbour (proxy.service.cache, storage.hnsw, storage.keyfile)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proxy.core.model import RecordState
from proxy.http import keys
from proxy.storage.base import Selector
from proxy.storage.hnsw import HnswIndex
from proxy.storage.sqlite import SqliteStore
from tests.conftest import ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat


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
