"""The store backends by name, each with what it offers: the one place a backend is chosen.

An entry opens its store from the settings and declares its capabilities, so the composition asks
"is this store shared by replicas?" of the declaration, never of the store's class, and a new
backend is a module and one entry here. ``settings.store`` is checked against these names at load.

This module is read by the settings, before anything is served: it imports no backend. Each
entry's opener imports its own backend when it is chosen (SQLite's and Redis's clients, and the
record model under them, are not what a settings check should load).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from proxy.core.errors import ConfigError

if TYPE_CHECKING:
    from proxy.storage.base import RecordStore
    from proxy.storage.chains import ResponseChains
    from proxy.storage.shared import SharedRecordStore


class StoreSettings(Protocol):
    """What an opener reads of ``proxy.settings.Settings``."""

    @property
    def db_path(self) -> Path: ...

    @property
    def redis_url(self) -> str: ...


class UnknownStore(ConfigError, ValueError):
    """A store name no backend answers to."""


class BackendMislabelled(ConfigError, TypeError):
    """A backend whose store does not match what it declares (a programming error, found at open)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend offers, read by the composition in place of the store's class.

    ``shared``: other replicas write to the store too. The replica's index then follows the store's
    change feed (and resumes from a checkpoint, not from saved keys), serves only its own policy
    version's records and retires only versions no replica serves; a store one process alone
    writes is what that process wrote, so its index starts from the keys it saved."""

    shared: bool


def _own_chains() -> ResponseChains:
    from proxy.storage.chains import MemoryChains  # read only once a store opens

    return MemoryChains()


@dataclass(frozen=True, slots=True)
class Store:
    """An open store as the composition holds it: its records and, for a shared backend, the same
    store's shared face (None otherwise); ``chains``: the conversations Responses requests
    continue, kept where the records are, so replicas that share the records share them too."""

    records: RecordStore
    shared: SharedRecordStore | None = None
    chains: ResponseChains = field(default_factory=_own_chains)


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    capabilities: Capabilities
    open: Callable[[StoreSettings], Awaitable[Store]]


async def _open_sqlite(s: StoreSettings) -> Store:
    from proxy.storage.sqlite import SqliteStore  # chosen: see the module's docstring

    return Store(await SqliteStore.open(s.db_path))


async def _open_redis(s: StoreSettings) -> Store:
    from proxy.storage.base import StoreUnavailable  # chosen: see the module's docstring
    from proxy.storage.redis import RedisStore
    from proxy.storage.redis_chains import RedisChains

    try:
        store = await RedisStore.open(s.redis_url)
    except StoreUnavailable as exc:
        raise StoreUnavailable(f"store: redis at {s.redis_url} cannot be reached at start ({exc})") from exc
    return Store(store, shared=store, chains=await RedisChains.open(s.redis_url))


BACKENDS: Mapping[str, Backend] = MappingProxyType(
    {
        "sqlite": Backend("sqlite", Capabilities(shared=False), _open_sqlite),  # data_dir, one replica
        "redis": Backend("redis", Capabilities(shared=True), _open_redis),  # redis_url, shared by replicas
    }
)


def backend(name: str, backends: Mapping[str, Backend] = BACKENDS) -> Backend:
    try:
        return backends[name]
    except KeyError:
        raise UnknownStore(f"store: {name!r} is no store backend; choose one of {', '.join(backends)}") from None


async def open_store(name: str, s: StoreSettings, backends: Mapping[str, Backend] = BACKENDS) -> Store:
    """The store ``name`` opened from ``s``; its shared face present exactly when its backend
    declares the store shared."""
    chosen = backend(name, backends)
    store = await chosen.open(s)
    if (store.shared is not None) != chosen.capabilities.shared:
        await store.chains.close()
        await store.records.close()
        raise BackendMislabelled(
            f"store backend {chosen.name!r} declares shared={chosen.capabilities.shared}, "
            f"but its opener {'gave' if store.shared is not None else 'gave no'} shared face"
        )
    return store
