"""Learned levels, kept: the labels each judged request leaves, written to the record store, and the
level each tenant's intent has earned, fitted from them (``proxy.core.learning``; docs/architecture.md,
"Learned levels").

The labels live in the store (``RecordStore.add_labels``), so a restart and every replica over a
shared store fit the same levels: a fit read here is refitted from the store every
``REFIT_SECONDS``, or sooner once this proxy has added ``REFIT_LABELS`` of its own. Reading and
writing labels only ever costs judge calls: a store that cannot answer knows of no level, and a
label it cannot keep is lost, never a request.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import structlog

from proxy.core.identity import Identity
from proxy.core.learning import Label, Level, Source, fit_level
from proxy.core.lru import LruDict
from proxy.core.policy import IntentPolicy
from proxy.storage.base import RecordStore

__all__ = ["LearnedLevels", "Standing", "user_of"]

REFIT_SECONDS: Final = 30.0
REFIT_LABELS: Final = 16
FITS_KEPT: Final = 4_096  # (tenant, intent) pairs whose fit is held in memory


def user_of(who: Identity) -> str:
    """Whose label it is: the end user where the request names one, else its session; hashed, so
    no id the client sent is stored."""
    who_key = f"u:{who.user}" if who.user is not None else f"s:{who.session}"
    return hashlib.blake2b(who_key.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class _Fit:
    level: Level | None
    labels: int
    at: float
    params: tuple[float, int, frozenset[Source]]


@dataclass(frozen=True, slots=True)
class Standing:
    """One intent's learned levels over the tenants fitted here, for metrics and ``stats``: labels
    read, the lowest level in force and the highest bound."""

    labels: int
    level: float | None
    bound: float | None


class LearnedLevels:
    def __init__(self, store: RecordStore, clock: Callable[[], float]) -> None:
        self.store, self.clock = store, clock
        self._fits: LruDict[tuple[str, str], _Fit] = LruDict(FITS_KEPT)
        self._fresh: Counter[tuple[str, str]] = Counter()  # labels added here since the last fit
        self._fitting: dict[tuple[str, str], asyncio.Task[Level | None]] = {}
        self.excluded: frozenset[Source] = frozenset()  # sources no longer trusted (a contradicted judge)
        self.saved: Counter[str] = Counter()  # intent -> judge calls a level saved
        self.added: Counter[str] = Counter()  # source -> labels kept

    async def level(self, tenant: str, policy: IntentPolicy) -> Level | None:
        """The level in force for ``tenant``'s ``policy`` intent; None where it learns nothing yet."""
        if policy.max_error is None:
            return None
        key = (tenant, policy.name)
        params = (policy.max_error, policy.labels_per_user, self.excluded)
        fit = self._fits.get(key)
        now = self.clock()
        if (
            fit is not None
            and fit.params == params
            and now - fit.at < REFIT_SECONDS
            and self._fresh[key] < REFIT_LABELS
        ):
            return fit.level
        running = self._fitting.get(key)
        if running is None:  # one read of the store however many requests find the fit stale
            running = self._fitting[key] = asyncio.ensure_future(self._fit(key, params, now))
            running.add_done_callback(lambda _: self._fitting.pop(key, None))
        return await asyncio.shield(running)

    async def _fit(
        self, key: tuple[str, str], params: tuple[float, int, frozenset[Source]], now: float
    ) -> Level | None:
        max_error, per_user, excluded = params
        try:
            labels = await self.store.labels(*key)
        except Exception as exc:  # no level is known: the judge is asked, as without learning
            structlog.get_logger("smartcache").warning("learning.labels_unread", error=repr(exc)[:200])
            return None
        level = fit_level(labels, max_error=max_error, per_user=per_user, exclude=excluded)
        self._fits.put(key, _Fit(level, len(labels), now, params))
        self._fresh[key] = 0
        return level

    async def add(self, tenant: str, labels: Sequence[Label]) -> None:
        if not labels:
            return
        try:
            await self.store.add_labels(tenant, labels)
        except Exception as exc:  # not kept: the level learns a little later, nothing else is lost
            structlog.get_logger("smartcache").warning("learning.labels_unkept", error=repr(exc)[:200])
            return
        for label in labels:
            self._fresh[(tenant, label.intent)] += 1
            self.added[label.source] += 1

    def distrust(self, source: Source) -> None:
        """Labels from ``source`` count no more (a judge whose yes was contradicted): every level is refitted."""
        self.excluded = self.excluded | {source}

    def standings(self) -> dict[str, Standing]:
        """Per intent, over the fits held here."""
        by_intent: dict[str, list[_Fit]] = {}
        for (_, intent), fit in self._fits.items():
            by_intent.setdefault(intent, []).append(fit)
        out: dict[str, Standing] = {}
        for intent, fits in by_intent.items():
            levels = [f.level for f in fits if f.level is not None]
            out[intent] = Standing(
                labels=sum(f.labels for f in fits),
                level=min((lv.score for lv in levels), default=None),
                bound=max((lv.bound for lv in levels), default=None),
            )
        return out
