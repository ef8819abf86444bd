"""The registry of store backends: names, declared capabilities, the settings checked against it,
and a backend whose store does not match its declaration refused at open."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.settings import Settings, SettingsError, load_settings
from proxy.storage.backends import (
    BACKENDS,
    Backend,
    BackendMislabelled,
    Capabilities,
    Store,
    StoreSettings,
    UnknownStore,
    backend,
    open_store,
)
from proxy.storage.sqlite import SqliteStore


def test_each_backend_declares_whether_replicas_share_it() -> None:
    assert {name: b.capabilities.shared for name, b in BACKENDS.items()} == {"sqlite": False, "redis": True}
    assert all(b.name == name for name, b in BACKENDS.items())


def test_the_registry_cannot_be_changed() -> None:
    with pytest.raises(TypeError):
        BACKENDS["other"] = BACKENDS["sqlite"]  # type: ignore[index]


def test_an_unknown_name_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(UnknownStore, match="'mongo' is no store backend; choose one of sqlite, redis"):
        backend("mongo")


def test_the_settings_check_the_name_against_the_registry() -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(environ={"SMARTCACHE_STORE": "mongo"})
    assert err.value.key == "store" and "one of sqlite, redis" in err.value.reason
    assert load_settings(environ={"SMARTCACHE_STORE": "redis"}).store == "redis"


async def test_the_sqlite_backend_opens_a_store_of_one_replica(tmp_path: Path) -> None:
    store = await open_store("sqlite", Settings(data_dir=tmp_path))
    try:
        assert isinstance(store.records, SqliteStore) and store.shared is None
        assert (tmp_path / "cache.sqlite3").exists()
    finally:
        await store.records.close()


@pytest.mark.parametrize("declared", [True, False])
async def test_a_backend_whose_store_belies_its_declaration_is_refused(tmp_path: Path, declared: bool) -> None:
    closed: list[bool] = []

    async def opener(s: StoreSettings) -> Store:
        store = await SqliteStore.open(s.db_path)
        real_close = store.close

        async def close() -> None:
            closed.append(True)
            await real_close()

        store.close = close  # type: ignore[method-assign]
        # declared shared, it gives no shared face; declared local, it gives one (a fake, typed loosely)
        return Store(store, shared=None if declared else store)  # type: ignore[arg-type]

    backends = {"liar": Backend("liar", Capabilities(shared=declared), opener)}
    with pytest.raises(BackendMislabelled, match="'liar' declares shared="):
        await open_store("liar", Settings(data_dir=tmp_path), backends)
    assert closed == [True]  # what it opened is not left open
