"""The lookup path: the real signer, store, index and decision, and a fake verifier.

A policy that sets verify_accept gets the verifier wired in at start; its probability, read with
both requests' context, decides hit vs half-hit; off, busy or absent, nothing is served."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from proxy.core.identity import Identity
from proxy.core.model import Reason, Status
from proxy.core.openai.request import parse_chat_request
from proxy.embedding.backends import SyncEmbedder
from proxy.observability.metrics import Metrics
from proxy.service.compose import Parts, open_parts
from proxy.settings import DEFAULT_POLICY, load_settings
from proxy.verify import PairSide, VerifierError, load_verifier
from proxy.verify.batching import BatchingVerifier

ASK = "How do I reset my home router to factory settings?"
REPHRASED = "How can I reset my home router back to factory settings?"
ANSWER = "Hold the reset button on the back for ten seconds, then wait for the lights to blink."
WHO = Identity(tenant="t", session="s1", user=None, session_explicit=True)


class FakeVerifier:
    name, version = "fake", "1"

    def __init__(self, p: float, gate: threading.Event | None = None) -> None:
        self.p, self.gate = p, gate
        self.pairs: list[tuple[PairSide, PairSide]] = []

    def score(self, pairs: Sequence[tuple[PairSide, PairSide]]) -> list[float]:
        if self.gate is not None:
            self.gate.wait(5)
        self.pairs.extend(pairs)
        return [self.p] * len(pairs)


def policy_file(tmp_path: Path, verify_accept: float | None, verify_previous: float | None = None) -> Path:
    data = yaml.safe_load(DEFAULT_POLICY.read_text(encoding="utf-8"))
    if verify_accept is not None:
        data["defaults"]["verify_accept"] = verify_accept
    if verify_previous is not None:
        data["defaults"]["verify_previous"] = verify_previous
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


@asynccontextmanager
async def parts_with(
    tmp_path: Path,
    embedder: SyncEmbedder,
    home: Path,
    verifier: FakeVerifier | None,
    *,
    verify_accept: float | None = 0.8,
    verify_previous: float | None = None,
    **settings: Any,
) -> AsyncIterator[Parts]:
    s = load_settings(
        environ={},
        overrides={
            "data_dir": tmp_path,
            "model_home": home,
            "ready_after": 0.0,
            "upstream": "http://127.0.0.1:9/v1",
            "policy": policy_file(tmp_path, verify_accept, verify_previous),
            **settings,
        },
    )
    async with open_parts(
        s, upstream_url="http://127.0.0.1:9/v1", metrics=Metrics(), backend=embedder, verifier=verifier
    ) as parts:
        yield parts


async def ask_again(parts: Parts, stages: dict[str, float] | None = None) -> Any:
    """The first question answered and written back, then the rephrased one in the same conversation."""
    first = parse_chat_request(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": ASK}]}))
    plan = await parts.planner.plan(first, WHO)
    assert plan.signature is not None and plan.policy is not None
    await parts.cache.write(
        request=first, who=WHO, sig=plan.signature, policy=plan.policy, policy_version="v", answer=ANSWER, usage={}
    )
    msgs = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": REPHRASED},
    ]
    return await parts.planner.plan(
        parse_chat_request(orjson.dumps({"model": "m", "messages": msgs})), WHO, stages=stages
    )


async def test_a_verified_candidate_is_served_and_both_sides_carry_their_context(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    fake = FakeVerifier(0.95)
    stages: dict[str, float] = {}
    async with parts_with(tmp_path, sync_embedder, model_home, fake) as parts:
        assert isinstance(parts.verifier, BatchingVerifier)
        plan = await ask_again(parts, stages)
    assert (plan.status, plan.reason) == (Status.HIT, Reason.VERIFIED)
    assert plan.decision.verified == 0.95 and plan.decision.stage == "hit"
    assert "verify" in stages
    [(request, cached)] = fake.pairs
    assert request == PairSide(REPHRASED, ASK, ANSWER[:160])
    assert cached == PairSide(ASK, "", "")  # the record opened its conversation


async def test_a_rejected_candidate_is_a_half_hit(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    async with parts_with(tmp_path, sync_embedder, model_home, FakeVerifier(0.2)) as parts:
        plan = await ask_again(parts)
    assert (plan.status, plan.reason, plan.decision.verified) == (Status.HALF_HIT, Reason.VERIFIER_REJECTED, 0.2)
    assert plan.decision.stage == "verification"


async def test_with_the_verifier_off_nothing_verified_is_served(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    fake = FakeVerifier(0.95)
    async with parts_with(tmp_path, sync_embedder, model_home, fake, verify=False) as parts:
        assert parts.verifier is None
        plan = await ask_again(parts)
    assert (plan.status, plan.reason) == (Status.HALF_HIT, Reason.VERIFIER_UNAVAILABLE) and not fake.pairs


async def test_a_busy_verifier_makes_a_half_hit_not_a_wait(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    gate = threading.Event()
    try:
        async with parts_with(
            tmp_path, sync_embedder, model_home, FakeVerifier(0.95, gate), verify_timeout_ms=50
        ) as parts:
            plan = await ask_again(parts)
            gate.set()
    finally:
        gate.set()
    assert (plan.status, plan.reason) == (Status.HALF_HIT, Reason.VERIFIER_UNAVAILABLE)


async def test_a_policy_without_verify_accept_loads_no_verifier(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    fake = FakeVerifier(0.0)
    # judge off: the shipped policy's judge has the verifier rank what it reads (tests/service/test_compose.py)
    async with parts_with(tmp_path, sync_embedder, model_home, fake, verify_accept=None, judge=False) as parts:
        assert parts.verifier is None
        plan = await ask_again(parts)
    assert plan.reason not in {Reason.VERIFIED, Reason.VERIFIER_REJECTED, Reason.VERIFIER_UNAVAILABLE}
    assert plan.decision.verified is None and not fake.pairs


async def test_a_policy_that_verifies_fails_at_start_without_the_verifier_files(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import proxy.service.compose

    def no_weights(**kwargs: Any) -> Any:
        return load_verifier(tmp_path / "no-weights", **kwargs)

    monkeypatch.setattr(proxy.service.compose, "load_verifier", no_weights)
    s = load_settings(environ={}, overrides={"data_dir": tmp_path, "model_home": model_home,
                                             "policy": policy_file(tmp_path, 0.9)})  # fmt: skip
    with pytest.raises(VerifierError, match=r"sets verify_accept.*verify: false"):
        async with open_parts(s, upstream_url="http://127.0.0.1:9/v1", metrics=Metrics(), backend=sync_embedder):
            pass


async def test_the_shipped_verifier_is_loaded_at_start_and_asked(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    async with parts_with(tmp_path, sync_embedder, model_home, None) as parts:
        assert parts.verifier is not None and parts.verifier.verifier.name
        plan = await ask_again(parts)
        assert parts.verifier.model_calls == 1
    assert plan.reason in {Reason.VERIFIED, Reason.VERIFIER_REJECTED}
    assert plan.decision.verified is not None and 0.0 <= plan.decision.verified <= 1.0


async def test_the_previous_turn_asked_again_is_served_on_the_verifiers_word(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    fake = FakeVerifier(0.97)
    async with parts_with(tmp_path, sync_embedder, model_home, fake, verify_accept=None, verify_previous=0.9) as parts:
        assert parts.verifier is not None  # verify_previous alone loads it
        plan = await ask_again(parts)
    assert (plan.status, plan.reason, plan.decision.verified) == (Status.HIT, Reason.VERIFIED_PREVIOUS, 0.97)
    assert plan.decision.record is not None and plan.decision.record.answer_text == ANSWER
    [(request, cached)] = fake.pairs
    assert request == PairSide(REPHRASED, ASK, ANSWER[:160]) and cached == PairSide(ASK, "", "")


async def test_the_previous_turn_below_verify_previous_is_not_served_by_it(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    async with parts_with(
        tmp_path, sync_embedder, model_home, FakeVerifier(0.5), verify_accept=None, verify_previous=0.9
    ) as parts:
        plan = await ask_again(parts)
    assert plan.reason is not Reason.VERIFIED_PREVIOUS and plan.decision.verified is None


def chat_of(*turns: str) -> Any:
    roles = ["user", "assistant"]
    msgs = [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
    return parse_chat_request(orjson.dumps({"model": "m", "messages": msgs}))


async def test_a_turn_that_left_its_topic_is_served_only_its_own_reframed_answer(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    """A topic switch reads nothing but this very request: asked again in another session, or
    re-sent in its own with its courtesy framing edited (decision.context.same_request)."""
    opening = ("Can you recommend a hotel in Lisbon?", "Try the Memmo Alfama.")
    async with parts_with(tmp_path, sync_embedder, model_home, None, verify_accept=None) as parts:
        first = chat_of(*opening, "Why do cats purr?")
        plan = await parts.planner.plan(first, WHO)
        assert plan.signature is not None and plan.policy is not None
        await parts.cache.write(
            request=first, who=WHO, sig=plan.signature, policy=plan.policy, policy_version="v", answer=ANSWER, usage={}
        )

        async def lookup(text: str, who: Identity = WHO) -> Any:
            request = chat_of(*opening, text)
            sig = await parts.signer.sign(request)
            policy = parts.policy_box.policy.for_intent(plan.signature.tags.intent if plan.signature else "")
            return (await parts.cache.lookup(sig, request, who, policy, repeats_only=True)).decision

        edited = await lookup("Quick question: why do cats purr?")
        assert (edited.status, edited.reason) == (Status.HIT, Reason.COURTESY_VARIANT)
        assert (await lookup("Why do cats meow?")).status is not Status.HIT  # near, but another request
        elsewhere = Identity(tenant="t", session="s2", user=None, session_explicit=True)
        assert (await lookup("Quick question: why do cats purr?", elsewhere)).status is not Status.HIT
        assert (await lookup("Why do cats purr?", elsewhere)).reason is Reason.EXACT_REPEAT
