"""The one write-back rule, read by the proxy and by replay: what becomes a record, what becomes
only the session's last answer, and what leaves no trace, over a real SQLite store and index."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.core.conversation import request_hash
from proxy.core.identity import Identity
from proxy.core.model import Reason, SessionLast, Status
from proxy.core.openai.request import ChatRequest, parse_chat_request
from proxy.core.policy import load_policy
from proxy.service.cache import SemanticCache
from proxy.service.planner import Plan, PolicyBox
from proxy.service.writeback import WriteBack, record_vector
from proxy.settings import DEFAULT_POLICY
from proxy.storage.base import StoreUnavailable
from proxy.storage.hnsw import HnswIndex
from proxy.storage.sqlite import SqliteStore
from tests.factories import make_signature

WHO = Identity(tenant="t", session="s", user=None, session_explicit=True)
POLICY = load_policy(DEFAULT_POLICY)
SIG = make_signature(request_hash="asked")
MISS = Plan(Status.MISS, Reason.BELOW_CANDIDATE, SIG, POLICY.for_intent("general"))
USAGE = {"prompt_tokens": 12, "completion_tokens": 5}


def request(**body: Any) -> ChatRequest:
    return parse_chat_request(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi?"}], **body}))


@pytest.fixture
async def cache(tmp_path: Path) -> AsyncIterator[SemanticCache]:
    store = await SqliteStore.open(tmp_path / "cache.sqlite3")
    try:
        yield SemanticCache(store, HnswIndex(4), ready_after=0.0, top_k=4)
    finally:
        await store.close()


@pytest.fixture
def write_back(cache: SemanticCache) -> WriteBack:
    return WriteBack(cache, PolicyBox(POLICY, classifier=None))  # type: ignore[arg-type]  # only the version is read


async def live(cache: SemanticCache) -> list[str]:
    return [r.answer_text async for r in cache.store.iter_live()]


async def last(cache: SemanticCache) -> SessionLast | None:
    return await cache.store.session_last(WHO.tenant, WHO.session)


async def test_a_whole_answer_is_written_under_the_policy_in_force(cache: SemanticCache, write_back: WriteBack) -> None:
    kept = await write_back.keep(request(), WHO, MISS, "Hello.", USAGE)
    assert kept.record is not None and not kept.failed
    assert (kept.record.answer_text, kept.record.policy_version) == ("Hello.", POLICY.version)
    assert (kept.record.prompt_tokens, kept.record.completion_tokens, kept.record.cut_at) == (12, 5, None)
    assert await live(cache) == ["Hello."]
    session_last = await last(cache)
    assert session_last is not None and session_last.cache_id == kept.record.cache_id


async def test_a_cut_answer_is_kept_at_the_limit_the_request_set(cache: SemanticCache, write_back: WriteBack) -> None:
    kept = await write_back.keep(request(max_tokens=16), WHO, MISS, "Hel", USAGE, cut=True)
    assert kept.record is not None and kept.record.cut_at == 16


@pytest.mark.parametrize(
    ("req", "answer", "cut"),
    [
        (request(), "Hel", True),  # cut at a limit the request never set: the engine's own
        (request(cache={"no_store": True}), "Hello.", False),
        (request(), None, False),  # nothing came back whole (an error in-band, a stream cut, a client gone)
    ],
    ids=["cut-without-a-limit", "no_store", "no-whole-answer"],
)
async def test_an_answer_not_stored_is_still_the_sessions_last(
    cache: SemanticCache, write_back: WriteBack, req: ChatRequest, answer: str | None, cut: bool
) -> None:
    kept = await write_back.keep(req, WHO, MISS, answer, USAGE, cut=cut)
    assert (kept.record, kept.failed) == (None, False)
    assert await live(cache) == []
    session_last = await last(cache)
    assert session_last is not None and (session_last.cache_id, session_last.request_hash) == ("", "asked")


@pytest.mark.parametrize("reason", [Reason.REGENERATE, Reason.CORRECTION])
async def test_the_answer_to_a_regenerate_or_a_correction_is_never_stored(
    cache: SemanticCache, write_back: WriteBack, reason: Reason
) -> None:
    kept = await write_back.keep(request(), WHO, Plan(Status.MISS, reason, SIG), "Hello.", USAGE)
    assert kept.record is None and await live(cache) == []
    session_last = await last(cache)
    assert session_last is not None and (session_last.cache_id, session_last.request_hash) == ("", "asked")


@pytest.mark.parametrize(
    "plan",
    [Plan(Status.BYPASS, Reason.INTENT_DISABLED, SIG), Plan(Status.BYPASS, Reason.OVERLOADED)],
    ids=["intent-disabled", "unsigned-bypass"],
)
async def test_a_bypassed_answer_is_the_sessions_last_held_by_no_record(
    cache: SemanticCache, write_back: WriteBack, plan: Plan
) -> None:
    """A correction sent after it is about it: the record of the turn before must not pay for it."""
    req = request()
    kept = await write_back.keep(req, WHO, plan, "Hello.", USAGE)
    assert kept.record is None and await live(cache) == [] and record_vector(plan) is None
    said = "asked" if plan.signature is not None else request_hash(req)
    session_last = await last(cache)
    assert session_last is not None and (session_last.cache_id, session_last.request_hash) == ("", said)


async def test_a_request_planned_with_the_store_down_leaves_no_trace(
    cache: SemanticCache, write_back: WriteBack
) -> None:
    plan = Plan(Status.BYPASS, Reason.STORE_UNAVAILABLE)
    kept = await write_back.keep(request(), WHO, plan, "Hello.", USAGE)
    assert kept.record is None and await live(cache) == [] and await last(cache) is None


async def test_a_failing_store_costs_the_keeping_not_the_caller(
    cache: SemanticCache, write_back: WriteBack, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(*_: object) -> int:
        raise StoreUnavailable("gone")

    monkeypatch.setattr(cache.store, "insert", down)
    assert (await write_back.keep(request(), WHO, MISS, "Hello.", USAGE)).failed

    async def broken(*_: object) -> int:
        raise RuntimeError("a store's own failure")

    monkeypatch.setattr(cache.store, "insert", broken)
    assert (await write_back.keep(request(), WHO, MISS, "Hello.", USAGE)).failed


def test_a_storable_plan_indexes_its_record_by_the_conversation_vector() -> None:
    vector = record_vector(MISS)
    assert vector is not None and vector.tolist() == SIG.vector.tolist()
