"""The mirror's keys saved at shutdown stand in for reading every live record's key at the next
start: the keys come back exactly, a file of another store or format is not used, a damaged one is
refused, and a stale one still gives exactly the store's live records (written since: read from the
store; died since: dropped)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from proxy.core.model import RecordState
from proxy.service.cache import SemanticCache
from proxy.storage.base import IndexKey, Selector
from proxy.storage.hnsw import HnswIndex
from proxy.storage.keyfile import load_keys, save_keys
from proxy.storage.sqlite import SqliteStore
from tests.storage.contract import DIM, make_record

STAMP = "m dim=4 store=a"


def keys_of(n: int) -> dict[int, IndexKey]:
    return {
        label: IndexKey.interned(
            label * 7,
            f"t{label % 3}",
            f"s{label // 4}",
            None if label % 2 else f"u{label % 5}",
            ("session", "user", "tenant", "global")[label % 4],
            "m",
            f"v{label % 2}",
            "" if label % 3 else "ns — 名字",
            ("general", "faq")[label % 2],
        )
        for label in range(1, n + 1)
    }


def test_keys_round_trip_with_users_none_and_unicode(tmp_path: Path) -> None:
    keys = keys_of(50)
    save_keys(tmp_path / "k", keys, stamp=STAMP)
    loaded = load_keys(tmp_path / "k", stamp=STAMP)
    assert loaded == keys
    assert loaded is not None and all(type(k) is IndexKey for k in loaded.values())
    # interned: the same string is one object across keys, as keys read from the store are
    assert loaded[2].model is loaded[3].model and loaded[1].tenant is loaded[4].tenant
    save_keys(tmp_path / "empty", {}, stamp=STAMP)
    assert load_keys(tmp_path / "empty", stamp=STAMP) == {}


def test_keys_of_another_store_or_format_or_none_saved_are_not_used(tmp_path: Path) -> None:
    save_keys(tmp_path / "k", keys_of(5), stamp=STAMP)
    assert load_keys(tmp_path / "k", stamp="m dim=4 store=b") is None
    assert load_keys(tmp_path / "missing", stamp=STAMP) is None
    raw = (tmp_path / "k").read_bytes()
    (tmp_path / "k2").write_bytes(raw.replace(b'"format": 1', b'"format": 9'))
    assert load_keys(tmp_path / "k2", stamp=STAMP) is None


def test_a_damaged_keys_file_is_refused(tmp_path: Path) -> None:
    save_keys(tmp_path / "k", keys_of(20), stamp=STAMP)
    raw = (tmp_path / "k").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-3])
    with pytest.raises(ValueError, match="bytes of keys"):
        load_keys(tmp_path / "short", stamp=STAMP)
    (tmp_path / "header").write_bytes(raw[:8] + b"\xff" * (len(raw) - 8))
    with pytest.raises(ValueError, match="header"):
        load_keys(tmp_path / "header", stamp=STAMP)
    # a tenant code past the tenants named: never a key of some other string
    size = int.from_bytes(raw[:8], "little")
    at = 8 + size + 8 * 20  # the first tenant code
    bad = raw[:at] + (99).to_bytes(4, "little") + raw[at + 4 :]
    (tmp_path / "code").write_bytes(bad)
    with pytest.raises(ValueError, match="tenant code"):
        load_keys(tmp_path / "code", stamp=STAMP)
    negative = raw[:at] + (-1).to_bytes(4, "little", signed=True) + raw[at + 4 :]
    (tmp_path / "negative").write_bytes(negative)
    with pytest.raises(ValueError, match="tenant code"):
        load_keys(tmp_path / "negative", stamp=STAMP)


async def test_a_start_from_stale_saved_keys_holds_exactly_the_live_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await SqliteStore.open(tmp_path / "cache.sqlite3")
    try:
        first = SemanticCache(store, HnswIndex(DIM), ready_after=0.0, top_k=4)
        for n in range(1, 7):
            record = make_record(n, session=f"s{n % 2}", user=None if n % 2 else "u", scope="session")
            await store.insert(record)
        await first.load()
        saved = dict(first.keys)
        snapshot = tmp_path / "index.hnsw"
        first.index.save(snapshot, stamp=STAMP)
        save_keys(tmp_path / "keys", saved, stamp=STAMP)
        # after the save: two records die, two are written
        await store.set_state(Selector(labels=(2, 5)), RecordState.INVALID)
        for n in (7, 8):
            await store.insert(make_record(n, session="s9", scope="tenant"))

        reference = SemanticCache(store, HnswIndex(DIM), ready_after=0.0, top_k=4)
        await reference.load()

        async def no_full_read(self: SqliteStore, *, vectors: bool = True) -> None:
            raise AssertionError("every key was read from the store instead of the saved ones")

        monkeypatch.setattr(SqliteStore, "iter_index_rows", no_full_read)
        restarted = SemanticCache(store, HnswIndex(DIM), ready_after=0.0, top_k=4)
        keys = load_keys(tmp_path / "keys", stamp=STAMP)
        loaded = await restarted.load(snapshot=HnswIndex.from_snapshot(snapshot, dim=DIM, stamp=STAMP), saved_keys=keys)
        assert loaded == 6 and set(restarted.keys) == {1, 3, 4, 6, 7, 8}
        assert restarted.keys == reference.keys
        assert restarted.pools.sessions == reference.pools.sessions
        assert restarted.pools.answer_bytes == reference.pools.answer_bytes
        assert restarted.index.labels() == {1, 3, 4, 6, 7, 8}
        query = np.frombuffer(make_record(7).vector, dtype=np.float32)
        assert restarted.index.search(query, 1)[0][0] == 7
    finally:
        await store.close()
