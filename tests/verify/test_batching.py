"""The async verifier front: concurrent requests share one model call off the event loop, a full
queue or a late answer is refused at once, a failing batch fails only its own callers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from proxy.core.model import Candidate, CoarseTags, KeyFacts, Record, RecordTags, Signature
from proxy.core.text.entities import Entities
from proxy.verify import PairSide, Verifier
from proxy.verify.batching import BatchingVerifier, VerifierBusy, pairs_of, record_side, request_side


class FakeVerifier:
    """Scores a pair 0.9 when both questions are equal ignoring case, else 0.1."""

    name, version = "fake", "1"

    def __init__(self, *, delay: float = 0.0, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.delay, self.gate, self.fail = delay, gate, fail

    def score(self, pairs: Sequence[tuple[PairSide, PairSide]]) -> list[float]:
        if self.gate is not None:
            self.gate.wait(5)
        time.sleep(self.delay)
        self.calls.append(len(pairs))
        if self.fail:
            raise RuntimeError("model broke")
        return [0.9 if a.question.lower() == b.question.lower() else 0.1 for a, b in pairs]


def pair(a: str, b: str) -> tuple[PairSide, PairSide]:
    return PairSide(a), PairSide(b)


def test_the_fake_is_a_verifier() -> None:
    assert isinstance(FakeVerifier(), Verifier)


async def test_concurrent_requests_share_one_model_call() -> None:
    fake = FakeVerifier(delay=0.05)
    front = BatchingVerifier(fake, max_batch=16, max_wait_s=0.01)
    try:
        results = await asyncio.gather(*(front.score([pair(f"q{i}", f"Q{i}"), pair("a", "b")]) for i in range(6)))
    finally:
        await front.close()
    assert results == [[0.9, 0.1]] * 6
    assert sum(fake.calls) == 12 and len(fake.calls) <= 2  # the first may go alone while the rest gather


async def test_batches_stay_under_max_batch() -> None:
    fake = FakeVerifier(delay=0.02)
    front = BatchingVerifier(fake, max_batch=4, max_wait_s=0.01)
    try:
        await asyncio.gather(*(front.score([pair("a", "a")]) for _ in range(10)))
    finally:
        await front.close()
    assert sum(fake.calls) == 10 and max(fake.calls) <= 4


async def test_the_event_loop_runs_while_the_model_does() -> None:
    fake = FakeVerifier(delay=0.2)
    front = BatchingVerifier(fake)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        await front.score([pair("a", "a")])
    finally:
        ticker.cancel()
        await front.close()
    assert ticks >= 10


async def test_a_full_queue_is_refused_at_once() -> None:
    gate = threading.Event()
    front = BatchingVerifier(FakeVerifier(gate=gate), max_batch=1, max_wait_s=0.0, max_pending=1, timeout_s=5)
    try:
        running = asyncio.create_task(front.score([pair("a", "a")]))  # taken by the worker, blocked in the model
        await asyncio.sleep(0.05)
        queued = asyncio.create_task(front.score([pair("b", "b")]))  # fills the one queue place
        await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        with pytest.raises(VerifierBusy, match="already waiting"):
            await front.score([pair("c", "c")])
        assert time.perf_counter() - t0 < 0.1
        gate.set()
        assert await running == [0.9] and await queued == [0.9]
    finally:
        gate.set()
        await front.close()


async def test_a_late_answer_is_refused_and_its_pairs_skipped() -> None:
    gate = threading.Event()
    fake = FakeVerifier(gate=gate)
    front = BatchingVerifier(fake, max_batch=1, max_wait_s=0.0, timeout_s=0.05)
    try:
        with pytest.raises(VerifierBusy, match="no answer within"):
            await front.score([pair("a", "a")])
        gate.set()
        assert await front.score([pair("b", "c")]) == [0.1]
    finally:
        gate.set()
        await front.close()


async def test_a_failing_batch_fails_its_callers_and_the_next_one_works() -> None:
    fake = FakeVerifier(fail=True)
    front = BatchingVerifier(fake)
    try:
        with pytest.raises(RuntimeError, match="model broke"):
            await front.score([pair("a", "a")])
        fake.fail = False
        assert await front.score([pair("a", "A")]) == [0.9]
        assert await front.score([]) == []
    finally:
        await front.close()


def signature(question_raw: str = "", previous_question: str = "", previous_reply_head: str = "") -> Signature:
    vector = np.zeros(2, dtype=np.float32)
    tags = CoarseTags(intent="general", entities=Entities(), change_instruction=False, context_switch=False)
    return Signature(vector=vector, question_vector=vector, tags=tags, system_prompt_version="", context_fingerprint="",
                     request_hash="", current_text="normalised question", view_text="",
                     question_raw=question_raw, previous_question=previous_question,
                     previous_reply_head=previous_reply_head)  # fmt: skip


def record(cache_id: str, **tags: str) -> Record:
    """A record whose tags are stored as ``tags`` (their JSON form, as an older version wrote them)."""
    return Record(cache_id=cache_id, tenant="t", user=None, scope="session", session="s", namespace="",
                  context_fingerprint="", intent="general", coarse_tags=RecordTags.from_json(tags), vector=b"",
                  qvector=b"", answer_text="", key_facts=KeyFacts(), model="m", system_prompt_version="",
                  policy_version="", request_hash="")  # fmt: skip


def test_sides_read_the_context_and_fall_back_for_old_records() -> None:
    sig = signature(
        question_raw="那家酒店的早餐怎么样", previous_question="杭州住哪", previous_reply_head="西湖边的酒店"
    )
    assert request_side(sig) == PairSide("那家酒店的早餐怎么样", "杭州住哪", "西湖边的酒店")
    assert request_side(signature()) == PairSide("normalised question")
    new = record("a", question_raw="Q", previous_question="P", previous_reply_head="R", question="q")
    assert record_side(new) == PairSide("Q", "P", "R")
    # written before the verifier: the normalised question and reply the lexical guards keep
    assert record_side(record("b", question="q", previous_reply="r")) == PairSide("q", "", "r")


async def test_verdicts_name_each_candidate_by_cache_id() -> None:
    front = BatchingVerifier(FakeVerifier())
    sig = signature(question_raw="Where is it?")
    same, other = record("same", question_raw="where is it?"), record("other", question_raw="when is it?")
    try:
        verdicts = await front.verdicts([Candidate(same, 0.9, 0.9), Candidate(other, 0.9, 0.9)], sig)
        assert await front.verdicts([], sig) == {}
    finally:
        await front.close()
    assert verdicts == {"same": 0.9, "other": 0.1}


def test_a_question_asked_again_after_other_turns_is_read_alone() -> None:
    """The session moved on between the answer and the request: the sides' previous turns differ
    by construction, so the verifier compares the questions; a turn that leans on its context, or
    the very next turn, keeps its context."""
    sig = signature(
        question_raw="说一个关于蜜蜂的冷知识", previous_question="怎么增强记忆力？", previous_reply_head="多睡觉"
    )
    earlier = record("bees", question_raw="讲点蜜蜂的小知识", previous_question="你好", previous_reply_head="你好！")
    assert pairs_of(sig, [Candidate(earlier, 0.8, 0.8, same_session=True, turn_gap=3)])[0] == (
        PairSide("说一个关于蜜蜂的冷知识"),
        PairSide("讲点蜜蜂的小知识"),
    )
    # the very next turn: the record's own exchange is the request's context
    assert pairs_of(sig, [Candidate(earlier, 0.8, 0.8, same_session=True, turn_gap=1)])[0] == (
        request_side(sig),
        record_side(earlier),
    )
    # another session's record: its context is another conversation's
    assert pairs_of(sig, [Candidate(earlier, 0.8, 0.8)])[0][0] == request_side(sig)
    # "give me an example" after other turns asks about whatever the last reply was
    leaning = signature(question_raw="能举个具体的例子吗", previous_question="二分查找是什么", previous_reply_head="…")
    example = record("ex", question_raw="能举个具体的例子吗", previous_question="快速排序是什么")
    assert pairs_of(leaning, [Candidate(example, 0.9, 1.0, same_session=True, turn_gap=3)])[0][1] == record_side(
        example
    )
