"""The RecordStore contract: what every backend must do, as one set of tests.

A backend's test module subclasses ``RecordStoreContract`` and provides a ``store`` fixture that
yields a fresh, empty store; every test here then runs against it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from proxy.core.learning import Label, Source
from proxy.core.model import LIVE_STATES, KeyFacts, Record, RecordState, RecordTags, SessionLast
from proxy.core.text.entities import Entities
from proxy.core.text.normalize import NormalText
from proxy.core.text.numbers import NumericConstraint
from proxy.storage.base import (
    LABELS_KEPT,
    REFUSALS_PER_WORDING,
    Count,
    RecordStore,
    Ref,
    Selector,
    StoreMismatch,
    Usage,
)
from tests import factories
from tests.factories import unit_vector

DIM = 4
# every field set, so that a read back equal to what was written shows the backend kept each one
TAGS = RecordTags(
    intent="general",
    entities=Entities(places=frozenset({"巴黎"}), numbers=(NumericConstraint("budget", 8000.0, "EUR", "<="),)),
    question=NormalText("巴黎3天"),
    previous_reply="好的",
    turn=2,
    question_raw="巴黎三天",
    previous_question="我想去巴黎",
    previous_reply_head="好的，",
    history="h",
    cut_at=64,
)
FACTS = KeyFacts(money=((7999.0, "EUR"),), dates=(20261205,), list_items=3, places=frozenset({"巴黎"}))
NOW = 1_000_000.0


def vector(seed: int) -> bytes:
    return unit_vector(DIM, seed)


def make_record(n: int = 0, **changes: Any) -> Record:
    """Record ``n`` of tenant t1, session s1: its own id, vectors and request hash."""
    fields: dict[str, Any] = {
        "cache_id": f"sc-{n:04d}",
        "tenant": "t1",
        "session": "s1",
        "coarse_tags": TAGS,
        "vector": vector(n),
        "qvector": vector(n + 1000),
        "answer_text": f"answer {n} — 答案",
        "key_facts": FACTS,
        "system_prompt_version": "sp1",
        "policy_version": "p1",
        "request_hash": f"h{n}",
        "created_at": NOW,
        "ready_at": NOW,
        "expires_at": NOW + 3600,
    }
    return factories.make_record(**{**fields, **changes})


def make_label(n: int = 0, **changes: Any) -> Label:
    """Label ``n`` of intent general: its own score, user, record and time (later for a higher ``n``)."""
    fields: dict[str, Any] = {
        "intent": "general",
        "score": 0.9 + n / 100_000,
        "right": n % 3 != 0,
        "source": (Source.JUDGE, Source.AGREEMENT, Source.FEEDBACK)[n % 3],
        "user": f"u{n % 7}",
        "cache_id": f"sc-{n:04d}",
        "at": NOW + n + 0.125,
    }
    return Label(**{**fields, **changes})


async def served(store: RecordStore, cache_id: str, now: float) -> None:
    """A hit as the cache counts it, in a session of its own."""
    await store.record_served(cache_id, now, "t-hits", "s-hits", SessionLast(cache_id, True, "h", now))


async def put(store: RecordStore, n: int = 0, **changes: Any) -> Record:
    record = make_record(n, **changes)
    return dataclasses.replace(record, label=await store.insert(record))


class RecordStoreContract:
    """Subclass with a ``store`` fixture yielding a fresh store."""

    async def test_insert_mints_increasing_labels_and_reads_back_every_field(self, store: RecordStore) -> None:
        a = await put(store, 1, user="u1", state="pending")
        b = await put(store, 2)
        assert a.label is not None and b.label is not None and b.label > a.label
        assert await store.get(a.cache_id) == a
        assert sorted(await store.get_many([b.label, a.label, 987654]), key=lambda r: r.label or 0) == [a, b]
        assert await store.get("sc-missing") is None
        assert await store.get_many([]) == []

    async def test_find_matches_every_set_field_newest_first(self, store: RecordStore) -> None:
        a = await put(store, 1)
        b = await put(store, 2, tenant="t2", session="s2", intent="travel", user="u2", namespace="ns", scope="tenant")
        c = await put(store, 3, model="m2", system_prompt_version="sp2", policy_version="p2", context_fingerprint="x")
        d = await put(store, 4, state="invalid")
        assert [r.cache_id for r in await store.find(Selector())] == [c.cache_id, b.cache_id, a.cache_id]
        assert (await store.find(Selector(states=None)))[0].cache_id == d.cache_id
        assert [r.cache_id for r in await store.find(Selector(), limit=2)] == [c.cache_id, b.cache_id]
        cases: list[tuple[Selector, list[Record]]] = [
            (Selector(tenant="t2"), [b]),
            (Selector(tenant="t1", session="s1"), [c, a]),
            (Selector(user="u2"), [b]),
            (Selector(namespace="ns"), [b]),
            (Selector(intent="travel"), [b]),
            (Selector(model="m2"), [c]),
            (Selector(system_prompt_version="sp2"), [c]),
            (Selector(policy_version="p2"), [c]),
            (Selector(other_policy_version="p2"), [b, a]),
            (Selector(context_fingerprint="x"), [c]),
            (Selector(request_hash="h2"), [b]),
            (Selector(cache_ids=(a.cache_id, d.cache_id)), [a]),
            (Selector(cache_ids=(a.cache_id, d.cache_id), states=None), [d, a]),
            (Selector(cache_ids=()), []),
            (Selector(labels=(b.label or 0,)), [b]),
            (Selector(states=(RecordState.INVALID,)), [d]),
            (Selector(tenant="t1", intent="travel"), []),
            (Selector(scopes=("tenant",)), [b]),
            (Selector(scopes=("session", "user")), [c, a]),
            (Selector(tenant="t2", session="s2", scopes=("session",)), []),
            (Selector(scopes=()), []),
        ]
        for selector, want in cases:
            assert await store.find(selector) == want, selector
            assert sorted(await store.refs(selector)) == sorted(Ref(r.label or 0, r.cache_id) for r in want)
            assert all(selector.matches(r) for r in want)

    async def test_time_bounds_select_expired_old_and_due_records(self, store: RecordStore) -> None:
        old = await put(store, 1, expires_at=NOW - 1, created_at=NOW - 100, ready_at=NOW - 50)
        await put(store, 2, expires_at=NOW + 1, created_at=NOW, ready_at=NOW + 50)
        assert await store.refs(Selector(expired_before=NOW)) == [Ref(old.label or 0, old.cache_id)]
        assert await store.refs(Selector(created_before=NOW - 10)) == [Ref(old.label or 0, old.cache_id)]
        assert await store.refs(Selector(ready_before=NOW)) == [Ref(old.label or 0, old.cache_id)]

    async def test_set_state_is_conditional_on_the_states_it_starts_from(self, store: RecordStore) -> None:
        r = await put(store, 1, state="pending")
        pending = Selector(cache_ids=(r.cache_id,), states=(RecordState.PENDING,))
        assert await store.set_state(pending, RecordState.REJECTED) == [Ref(r.label or 0, r.cache_id)]
        assert await store.set_state(pending, RecordState.READY) == []  # rejected stays rejected
        got = await store.get(r.cache_id)
        assert got is not None and got.state == RecordState.REJECTED == "rejected"
        # invalidation selects live records only by default: dead ones are not counted again
        assert await store.set_state(Selector(tenant="t1"), RecordState.INVALID) == []

    async def test_promotion_and_rejection_race_and_exactly_one_wins(self, store: RecordStore) -> None:
        records = [await put(store, n, state="pending", ready_at=NOW - 1) for n in range(20)]
        rejections = [
            store.set_state(Selector(cache_ids=(r.cache_id,), states=(RecordState.PENDING,)), RecordState.REJECTED)
            for r in records[::2]
        ]
        results = await asyncio.gather(store.promote_due(NOW), store.promote_due(NOW), *rejections)
        promoted = results[0] + results[1]
        rejected = [ref for refs in results[2:] for ref in refs]
        assert len(promoted) + len(rejected) == 20
        assert {ref.cache_id for ref in promoted}.isdisjoint(ref.cache_id for ref in rejected)
        states = {r.cache_id: r.state for r in await store.find(Selector(states=None))}
        assert sorted(states[ref.cache_id] for ref in promoted) == ["ready"] * len(promoted)
        assert sorted(states[ref.cache_id] for ref in rejected) == ["rejected"] * len(rejected)
        assert await store.promote_due(NOW) == []

    async def test_promote_due_waits_for_the_feedback_window(self, store: RecordStore) -> None:
        due = await put(store, 1, state="pending", ready_at=NOW - 1)
        await put(store, 2, state="pending", ready_at=NOW + 60)
        assert await store.promote_due(NOW) == [Ref(due.label or 0, due.cache_id)]
        assert [r.state for r in await store.find(Selector(), limit=None)] == ["pending", "ready"]

    async def test_delete_returns_what_it_removed(self, store: RecordStore) -> None:
        a = await put(store, 1)
        b = await put(store, 2, state="rejected")
        removed = await store.delete(Selector(cache_ids=(a.cache_id, b.cache_id), states=None))
        assert sorted(removed) == [Ref(a.label or 0, a.cache_id), Ref(b.label or 0, b.cache_id)]
        assert await store.get(a.cache_id) is None and await store.get(b.cache_id) is None
        assert await store.delete(Selector(cache_ids=(a.cache_id,), states=None)) == []
        assert [r async for r in store.iter_live()] == []

    async def test_many_ids_in_one_selector(self, store: RecordStore) -> None:
        records = [await put(store, n) for n in range(1200)]
        selector = Selector(labels=tuple(r.label or 0 for r in records[:1100]))
        assert len(await store.set_state(selector, RecordState.INVALID)) == 1100
        assert len(await store.delete(Selector(cache_ids=tuple(r.cache_id for r in records), states=None))) == 1200

    async def test_hits_and_feedback_are_counted_and_clamped(self, store: RecordStore) -> None:
        r = await put(store, 1)
        await asyncio.gather(*(served(store, r.cache_id, NOW + 10) for _ in range(5)))
        assert await store.add_feedback(r.cache_id, -0.5) == pytest.approx(0.5)
        await asyncio.gather(*(store.add_feedback(r.cache_id, 0.01) for _ in range(10)))
        got = await store.get(r.cache_id)
        assert got is not None and got.hit_count == 5 and got.last_hit_at == NOW + 10
        assert got.feedback_score == pytest.approx(0.6)
        assert await store.add_feedback(r.cache_id, 5.0) == pytest.approx(1.0)
        assert await store.add_feedback(r.cache_id, -5.0) == pytest.approx(0.0)
        assert await store.add_feedback("sc-missing", 0.1) is None
        await served(store, "sc-missing", NOW)  # a record deleted meanwhile: nothing happens

    async def test_session_last_is_kept_per_session_and_purged_when_idle(self, store: RecordStore) -> None:
        assert await store.session_last("t1", "s1") is None
        await store.set_session_last("t1", "s1", SessionLast("sc-1", False, "h1", NOW))
        await store.set_session_last("t1", "s1", SessionLast("sc-2", True, "h2", NOW + 5))
        await store.set_session_last("t2", "s1", SessionLast("", False, "h3", NOW - 100))
        assert await store.session_last("t1", "s1") == SessionLast("sc-2", True, "h2", NOW + 5)
        assert await store.purge_session_last(NOW) == 1
        assert await store.session_last("t2", "s1") is None
        assert await store.session_last("t1", "s1") is not None

    async def test_a_hit_served_counts_the_hit_and_sets_the_sessions_last_answer(self, store: RecordStore) -> None:
        r = await put(store, 1)
        served = [SessionLast(r.cache_id, True, f"h{n}", NOW + n) for n in range(4)]
        await asyncio.gather(*(store.record_served(r.cache_id, NOW + 10, "t1", f"s{n}", served[n]) for n in range(4)))
        got = await store.get(r.cache_id)
        assert got is not None and got.hit_count == 4 and got.last_hit_at == NOW + 10
        assert [await store.session_last("t1", f"s{n}") for n in range(4)] == served
        assert await store.session_last("t2", "s0") is None
        # a record deleted since the lookup: the session still knows what it was served
        await store.record_served("sc-missing", NOW, "t1", "s9", SessionLast("sc-missing", True, "h9", NOW))
        assert await store.session_last("t1", "s9") == SessionLast("sc-missing", True, "h9", NOW)

    async def test_iteration_reads_live_records_in_label_order(self, store: RecordStore) -> None:
        a = await put(store, 1, state="pending", user="u")
        await put(store, 2, state="invalid")
        c = await put(store, 3)
        assert [r async for r in store.iter_live()] == [a, c]
        rows = [row async for row in store.iter_index_rows()]
        assert [row.label for row in rows] == [a.label, c.label]
        assert rows[0].vector == a.vector and rows[0].key.user == "u"
        assert rows[0].key.answer_bytes == len(a.answer_text.encode())
        key = rows[1].key
        assert (key.tenant, key.session, key.scope, key.model, key.system_prompt_version, key.namespace) == (
            "t1",
            "s1",
            "session",
            "m",
            "sp1",
            "",
        )
        assert [row.vector async for row in store.iter_index_rows(vectors=False)] == [None, None]
        assert await store.vectors_of([c.label or 0, a.label or 0]) == [(a.label, a.vector), (c.label, c.vector)]

    async def test_live_labels_and_the_index_rows_of_chosen_labels(self, store: RecordStore) -> None:
        a = await put(store, 1, state="pending", user="u")
        dead = await put(store, 2, state="invalid")
        c = await put(store, 3, scope="tenant")
        assert sorted(await store.live_labels()) == [a.label, c.label]
        wanted = [c.label or 0, dead.label or 0, 999, a.label or 0]
        rows = sorted(await store.index_rows(wanted, vectors=False))
        assert [row.label for row in rows] == [a.label, c.label]  # the live ones
        assert [row.vector for row in rows] == [None, None]
        assert [row.key for row in rows] == [row.key async for row in store.iter_index_rows(vectors=False)]
        assert rows[0].key.user == "u" and rows[1].key.scope == "tenant"
        assert [row.vector for row in await store.index_rows([c.label or 0])] == [c.vector]
        assert await store.index_rows([]) == []

    async def test_concurrent_writes_of_every_kind_all_land(self, store: RecordStore) -> None:
        """Requests write at once (answers stored, hits counted, feedback, invalidations), each
        with statements and a commit of its own; none of them may fail for another's sake."""
        base = [await put(store, n) for n in range(20)]
        writes = []
        for n, r in enumerate(base):
            writes += [
                store.insert(make_record(100 + n)),
                served(store, r.cache_id, NOW),
                store.add_feedback(r.cache_id, -0.01),
                store.set_session_last("t1", f"s-{n}", SessionLast(r.cache_id, True, "h", NOW)),
            ]
            if n % 5 == 0:
                writes.append(store.set_state(Selector(cache_ids=(r.cache_id,)), RecordState.INVALID))
        await asyncio.gather(*writes)
        live = {r.cache_id: r for r in await store.find(Selector(states=None))}
        assert len(live) == 40
        assert all(live[r.cache_id].hit_count == 1 for r in base)
        assert sum(live[r.cache_id].state == RecordState.INVALID for r in base) == 4

    async def test_usage_counts_and_bytes_describe_the_live_records(self, store: RecordStore) -> None:
        a = await put(store, 1, created_at=NOW - 100)
        await served(store, a.cache_id, NOW)
        b = await put(store, 2, intent="travel", scope="tenant")
        await put(store, 3, state="rejected")
        assert sorted(await store.usage()) == [
            Usage(a.label or 0, a.cache_id, NOW, 1, len(a.answer_text.encode())),
            Usage(b.label or 0, b.cache_id, NOW, 0, len(b.answer_text.encode())),
        ]
        assert sorted(await store.counts()) == [
            Count("ready", "session", "general", 1),
            Count("ready", "tenant", "travel", 1),
            Count("rejected", "session", "general", 1),
        ]
        assert await store.answer_bytes() == len(a.answer_text.encode()) + len(b.answer_text.encode())

    async def test_identity_and_embedding_stamp(self, store: RecordStore) -> None:
        minted = await store.store_id()
        assert minted and await store.store_id() == minted
        await store.claim_embedding("model-a", DIM)
        await store.claim_embedding("model-b", DIM)  # empty: re-stamped, nothing to compare
        await put(store, 1)
        await store.claim_embedding("model-b", DIM)
        with pytest.raises(StoreMismatch):
            await store.claim_embedding("model-a", DIM)

    async def test_tenant_salt_is_one_per_store(self, store: RecordStore) -> None:
        first = await store.tenant_salt("salt-a")
        assert first == "salt-a" and await store.tenant_salt("salt-a") == "salt-a"

    async def test_a_refusal_is_kept_per_tenant_and_wording(self, store: RecordStore) -> None:
        a, b = await put(store, 1), await put(store, 2, scope="global")
        assert await store.refused("t1", "w1") == frozenset()
        await store.refuse("t1", "w1", [a.cache_id], NOW)
        await store.refuse("t1", "w1", {b.cache_id, a.cache_id}, NOW + 1)
        assert await store.refused("t1", "w1") == {a.cache_id, b.cache_id}
        # another wording, and another tenant asking in the same words, know of none
        assert await store.refused("t1", "w2") == frozenset()
        assert await store.refused("t2", "w1") == frozenset()
        await store.refuse("t2", "w1", [b.cache_id], NOW)
        assert await store.refused("t2", "w1") == {b.cache_id}
        assert await store.refused("t1", "w1") == {a.cache_id, b.cache_id}

    async def test_a_refusal_goes_with_its_record(self, store: RecordStore) -> None:
        kept, retired, expired = [await put(store, n) for n in range(3)]
        pending = await put(store, 3, state="pending")
        ids = [kept.cache_id, retired.cache_id, expired.cache_id, pending.cache_id]
        await store.refuse("t1", "w1", ids, NOW)
        await store.refuse("t2", "w9", [retired.cache_id], NOW)
        await store.set_state(Selector(cache_ids=(retired.cache_id,)), RecordState.INVALID)
        await store.delete(Selector(cache_ids=(expired.cache_id,)))
        assert await store.refused("t1", "w1") == {kept.cache_id, pending.cache_id}
        assert await store.refused("t2", "w9") == frozenset()
        # a record that is not live, or not there, leaves no refusal
        await store.refuse("t1", "w2", [retired.cache_id, "sc-missing"], NOW)
        assert await store.refused("t1", "w2") == frozenset()

    async def test_a_wording_keeps_its_newest_refusals(self, store: RecordStore) -> None:
        records = [await put(store, n) for n in range(REFUSALS_PER_WORDING + 3)]
        for n, record in enumerate(records):
            await store.refuse("t1", "w1", [record.cache_id], NOW + n)
        kept = await store.refused("t1", "w1")
        assert kept == {r.cache_id for r in records[3:]}

    async def test_a_purged_tenant_leaves_no_refusal(self, store: RecordStore) -> None:
        mine, shared = await put(store, 1, tenant="t1"), await put(store, 2, tenant="t2", scope="global")
        await store.refuse("t1", "w1", [mine.cache_id, shared.cache_id], NOW)
        await store.refuse("t2", "w1", [shared.cache_id], NOW)
        await store.delete(Selector(tenant="t1", states=None))
        assert await store.refused("t1", "w1") == frozenset()
        assert await store.refused("t2", "w1") == {shared.cache_id}

    async def test_labels_read_back_whole_and_oldest_first(self, store: RecordStore) -> None:
        assert await store.labels("t1", "general") == []
        await store.add_labels("t1", [])
        first = [make_label(n) for n in range(3)]
        later = [make_label(n, user="用户", cache_id="sc-é") for n in range(3, 6)]
        await store.add_labels("t1", [*first[1:], first[0]])  # written out of their order
        await store.add_labels("t1", later)
        # every field as written: the score and time exactly, the source as its enum
        got = await store.labels("t1", "general")
        assert got == [*first, *later]
        assert all(type(label.source) is Source for label in got)

    async def test_labels_are_kept_per_tenant_and_intent(self, store: RecordStore) -> None:
        await store.add_labels("t1", [make_label(1), make_label(2, intent="code")])
        await store.add_labels("t2", [make_label(3)])
        assert await store.labels("t1", "general") == [make_label(1)]
        assert await store.labels("t1", "code") == [make_label(2, intent="code")]
        assert await store.labels("t2", "general") == [make_label(3)]
        assert await store.labels("t2", "code") == []
        assert await store.labels("t1", "travel") == []

    async def test_an_intent_keeps_its_newest_labels(self, store: RecordStore) -> None:
        labels = [make_label(n) for n in range(LABELS_KEPT + 3)]
        await store.add_labels("t1", labels[:LABELS_KEPT])
        await store.add_labels("t1", [make_label(0, intent="code")])
        assert await store.labels("t1", "general") == labels[:LABELS_KEPT]
        # past the bound, the oldest go, of that intent only
        await store.add_labels("t1", labels[LABELS_KEPT:])
        assert await store.labels("t1", "general") == labels[3:]
        assert await store.labels("t1", "code") == [make_label(0, intent="code")]
        # and one call writing past it keeps its newest too
        await store.add_labels("t2", labels)
        assert await store.labels("t2", "general") == labels[3:]

    async def test_labels_outlive_their_records_and_a_purge_forgets_them(self, store: RecordStore) -> None:
        record = await put(store, 1)
        await store.add_labels("t1", [make_label(1, cache_id=record.cache_id), make_label(2, intent="code")])
        await store.add_labels("t2", [make_label(3)])
        await store.delete(Selector(cache_ids=(record.cache_id,), states=None))
        await store.delete(Selector(tenant="t1", session="s9", states=None))  # a session's delete: no purge
        assert await store.labels("t1", "general") == [make_label(1, cache_id=record.cache_id)]
        await store.delete(Selector(tenant="t1", states=None))
        assert await store.labels("t1", "general") == []
        assert await store.labels("t1", "code") == []
        assert await store.labels("t2", "general") == [make_label(3)]
        # a purged tenant labels afresh
        await store.add_labels("t1", [make_label(4)])
        assert await store.labels("t1", "general") == [make_label(4)]

    def test_live_states_are_the_default_selection(self) -> None:
        assert Selector().states == LIVE_STATES
