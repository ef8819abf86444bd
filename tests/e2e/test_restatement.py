"""Restatements: a spelled-out question right after its elliptical version is the same request,
served by the previous turn's answer; anything new makes it another. The signer flags it
(restates_previous), decide serves the restated turn, the cache keeps that turn a candidate and the
proxy answers it, under a policy that reads restatements (the lexical rule itself:
tests/core/text/test_lexical.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import yaml

from proxy.core.decision.decide import decide
from proxy.core.identity import Identity
from proxy.core.model import Candidate, Status
from proxy.core.openai.request import ChatRequest, parse_chat_request
from proxy.core.policy import load_policy
from proxy.core.text.entities import Entities
from proxy.embedding.backends import SyncEmbedder
from proxy.observability.metrics import Metrics
from proxy.service.compose import Parts, open_parts
from proxy.settings import DEFAULT_POLICY, load_settings
from proxy.signing.intent import IntentClassifier
from tests.conftest import ProxyFactory, Upstream
from tests.e2e.test_e2e_core import chat
from tests.e2e.test_multi_turn_context import record_of, sign


async def test_a_turn_that_names_nothing_is_restated_with_the_name_the_conversation_gave(parts: Parts) -> None:
    """ "May I have the phone number?" is no elliptical turn by its length, but whose number it asks
    is the restaurant the reply before named; a turn that names something of its own, or a word
    taken from the answer to it (a pick among what that answer offered), is another request."""
    found = ["Find me an Indian restaurant in the east", "Curry Prince is an Indian restaurant in the east."]
    asked = await sign(
        parts,
        *found,
        "May I have the phone number?",
        "It is 01223 244277.",
        "May I have the phone number of Curry Prince?",
    )
    assert asked.restates_previous and asked.restated_answer == "It is 01223 244277."
    narrower = await sign(
        parts, "I want a cheap restaurant", "There are Italian and Indian ones.", "I want a cheap Italian restaurant"
    )
    assert not narrower.restates_previous
    rust = ["I use Rust at work", "Nice.", "What is the best way to learn the Rust programming language quickly"]
    assert not (await sign(parts, *rust, "Read the book.", rust[-1] + " for work")).restates_previous


async def test_a_reply_that_ends_with_an_offer_settles_nothing(parts: Parts) -> None:
    """The offer closing a reply is a question, though the normalised reply has lost its "?":
    the user who asks "What about Chinese?" has not taken it."""
    offer = "None in the south. Would you like the north part of town?"
    turns = ("I want Italian food in the south part of town", offer, "What about Chinese?", "Sure.")
    assert not (await sign(parts, *turns, "What about Chinese food in the north part of town?")).restates_previous
    assert (await sign(parts, *turns, "What about Chinese food in the south part of town?")).restates_previous


def restating_policy(tmp_path: Path) -> Path:
    data = yaml.safe_load(DEFAULT_POLICY.read_text(encoding="utf-8"))
    data["defaults"]["restatement"] = True
    path = tmp_path / "restate.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture
async def parts(tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path) -> AsyncIterator[Parts]:
    settings = load_settings(
        environ={},
        overrides={
            "data_dir": tmp_path,
            "model_home": model_home,
            "upstream": "http://127.0.0.1:9/v1",
            "policy": restating_policy(tmp_path),
        },
    )
    async with open_parts(
        settings, upstream_url="http://127.0.0.1:9/v1", metrics=Metrics(), backend=sync_embedder
    ) as p:
        yield p


ASK = "I need a packing list for a ski trip"
WHEN = "How many days will you stay?"
SLOT = "Five days."
BOOKED = "For 5 days pack two base layers, goggles and a helmet."
RESTATED = "I need a packing list for a five day ski trip"


async def test_signer_flags_the_restatement_and_decide_serves_the_previous_turn(parts: Parts) -> None:
    cached = await sign(parts, ASK, WHEN, SLOT)
    request = await sign(parts, ASK, WHEN, SLOT, BOOKED, RESTATED)
    assert request.restates_previous and not cached.restates_previous
    q_sim = float(cached.question_vector @ request.question_vector)
    policy = parts.policy_box.policy.for_intent(request.tags.intent)
    assert q_sim < policy.candidate  # by similarity alone it would be a miss
    record = record_of(cached, BOOKED)
    gap1 = Candidate(record, float(cached.vector @ request.vector), q_sim, same_session=True, turn_gap=1)
    off = dataclasses.replace(policy, restatement=False)
    assert decide([gap1], request, off).status is not Status.HIT  # opt-in per intent
    d = decide([gap1], request, policy)
    assert (d.status, d.reason) == (Status.HIT, "restatement") and d.record is record
    # the same turn two turns later, or from another session, is judged by similarity as before;
    # so is a record of that turn with another answer than the one the user saw (a conversation
    # that opened alike under the same derived session id)
    twin = record_of(cached, "For 5 days pack a swimsuit and sunscreen.")
    for other in (
        Candidate(record, gap1.view_similarity, q_sim, same_session=True, turn_gap=2),
        Candidate(record, gap1.view_similarity, q_sim),
        Candidate(twin, gap1.view_similarity, q_sim, same_session=True, turn_gap=1),
    ):
        assert decide([other], request, policy).status is not Status.HIT
    d = decide([Candidate(twin, gap1.view_similarity, q_sim, same_session=True, turn_gap=1), gap1], request, policy)
    assert d.record is record and d.reason == "restatement"


async def test_a_restatement_keeps_its_turns_change_phrase_and_may_be_classed_otherwise(parts: Parts) -> None:
    """ "What about Italian food?" was a change of cuisine, answered already; spelled out it is the
    same request, whatever intent the classifier gives either wording. An entity conflict still
    keeps the record from being served."""
    opening = ("I want a restaurant in the south part of town", "There are Italian and Thai places in the south.")
    answer = "Ristorante Roma serves Italian food."
    cached = await sign(parts, *opening, "What about Italian food?")
    request = await sign(parts, *opening, "What about Italian food?", answer, "What about Italian food in the south?")
    assert request.restates_previous
    policy = parts.policy_box.policy.for_intent(request.tags.intent)
    record = record_of(cached, answer)
    gap1 = Candidate(record, 0.5, 0.5, same_session=True, turn_gap=1)
    d = decide([gap1], request, policy)
    assert (d.status, d.reason) == (Status.HIT, "restatement"), d
    other = dataclasses.replace(record, coarse_tags=dataclasses.replace(record.coarse_tags, intent="code"))
    d = decide([dataclasses.replace(gap1, record=other)], request, policy)
    assert (d.status, d.reason) == (Status.HIT, "restatement"), d
    assert (
        decide(
            [dataclasses.replace(gap1, record=other)], dataclasses.replace(request, restated_answer=""), policy
        ).reason
        == "filtered:intent"
    )
    elsewhere = Entities(places=frozenset({"北京"}))
    conflicting = dataclasses.replace(record, coarse_tags=dataclasses.replace(record.coarse_tags, entities=elsewhere))
    request_there = dataclasses.replace(
        request,
        tags=dataclasses.replace(
            request.tags, entities=dataclasses.replace(request.tags.entities, places=frozenset({"上海"}))
        ),
    )
    d = decide([dataclasses.replace(gap1, record=conflicting)], request_there, policy)
    assert (d.status, d.reason) == (Status.MISS, "filtered:entities")


async def test_a_restatement_never_leaves_its_topic(parts: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    """The topic-switch test reads intents and vectors, which two wordings of one request may not
    share; a turn that keeps every word of the previous one has not left its topic."""
    monkeypatch.setattr(parts.signer, "_is_topic_switch", lambda *args: True)
    assert (await sign(parts, ASK, WHEN, SLOT, BOOKED, RESTATED)).tags.context_switch is False
    assert (await sign(parts, ASK, WHEN, SLOT, BOOKED, "Tell me a joke")).tags.context_switch is True


async def test_the_same_words_again_after_a_new_offer_answer_that_offer(parts: Parts) -> None:
    """ "Yes, please." after "Shall I send the route?" is not the "Yes, please." before it."""
    turns = ("Find me a bakery", "None nearby. Would you like a cafe instead?", "Yes, please.")
    again = await sign(parts, *turns, "Cafe Nero is 2 miles away. Shall I send the route?", "Yes, please.")
    assert not again.restates_previous


async def test_the_shipped_policy_reads_restatements(parts: Parts) -> None:
    shipped = load_policy(DEFAULT_POLICY)
    assert all(p.restatement for name, p in shipped.intents.items() if p.cache)
    parts.signer.classifier = await IntentClassifier.build(shipped, parts.embedder)
    request = await sign(parts, ASK, WHEN, SLOT, BOOKED, RESTATED)
    assert request.restates_previous


async def test_a_restatement_with_something_new_is_not_flagged(parts: Parts) -> None:
    request = await sign(parts, ASK, WHEN, SLOT, BOOKED, RESTATED + " to Norway")
    assert not request.restates_previous


async def test_restatement_is_served_through_the_proxy_where_the_policy_allows_it(
    make_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path
) -> None:
    proxy = await make_proxy(policy=restating_policy(tmp_path))
    client = proxy.client(**{"x-smartcache-session": "ski"})
    history = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": ASK}]
    status, when, _ = await chat(client, history)
    assert status == "miss"
    history += [{"role": "assistant", "content": when}, {"role": "user", "content": SLOT}]
    status, booked, _ = await chat(client, history)
    assert status == "miss"
    history += [{"role": "assistant", "content": booked}, {"role": "user", "content": RESTATED}]
    status, again, _ = await chat(client, history)
    assert (status, again) == ("hit", booked)
    assert len(upstream.script.calls) == 2
    # a new detail is a new request
    history[-1] = {"role": "user", "content": RESTATED + " to Norway"}
    status, _, _ = await chat(client, history)
    assert status != "hit" and len(upstream.script.calls) == 3


def _request(*turns: str) -> ChatRequest:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return parse_chat_request(orjson.dumps({"model": "m", "messages": msgs}))


async def test_the_turn_restated_stays_a_candidate_when_other_sessions_hold_nearer_answers(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    """Answers shared with the tenant are searched beside the session's own turns. However near
    they are, they must not push out of the candidates the very turn a restatement restates: on
    the replay harness's traces, shared neighbours at 0.93 hid a previous turn at 0.89."""
    data = yaml.safe_load(DEFAULT_POLICY.read_text(encoding="utf-8"))
    for intent in [data["defaults"], *data["intents"].values()]:
        intent["widen_to"] = "tenant"
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    overrides = {"data_dir": tmp_path, "model_home": model_home, "policy": path, "top_k": 2, "ready_after": 0}
    settings = load_settings(environ={}, overrides={**overrides, "upstream": "http://127.0.0.1:9/v1"})
    async with open_parts(
        settings, upstream_url="http://127.0.0.1:9/v1", metrics=Metrics(), backend=sync_embedder
    ) as p:
        restated = _request(ASK, WHEN, SLOT, BOOKED, RESTATED)
        sig = await p.signer.sign(restated)
        policy = p.policy_box.policy.for_intent(sig.tags.intent)
        me = Identity("t", "ski", None, session_explicit=True)
        slot = _request(ASK, WHEN, SLOT)
        await p.cache.write(
            request=slot,
            who=me,
            sig=await p.signer.sign(slot),
            policy=policy,
            policy_version="v",
            answer=BOOKED,
            usage={},
        )
        for n in range(3):  # other conversations' answers, as near as can be
            twin = dataclasses.replace(sig, request_hash=f"other-{n}")
            await p.cache.write(
                request=restated,
                who=Identity("t", f"other-{n}", None, session_explicit=True),
                sig=twin,
                policy=policy,
                policy_version="v",
                answer=f"another answer {n}",
                usage={},
            )
        found = await p.cache.candidates(sig, restated, me, policy)
        assert sorted(c.same_session for c in found.ready) == [False, False, True]
        d = decide(found.ready, sig, policy)
        assert (d.status, d.reason) == (Status.HIT, "restatement")
        assert d.record is not None and d.record.answer_text == BOOKED


# An acknowledgement asks nothing, so nothing restates it (the rule: tests/core/text/test_lexical.py):
# the turn after it that asks an earlier question again is that question, never the acknowledgement.
ACKNOWLEDGEMENTS = ["great", "cool", "nice", "really?", "good", "Got it, thanks!", "很好", "嗯", "对", "好的", "知道了"]
FRANCE = "What is the capital of France?"
TRANSLATE = "请把这句话翻译成英文：今天天气很好。"
HALF_WIDTH = "请把这句话翻译成英文:今天天气很好."


async def test_the_signer_restates_no_acknowledgement(parts: Parts) -> None:
    restated = []
    for ack in ACKNOWLEDGEMENTS:
        framed = ack.rstrip("!?.")
        for asked, again in (
            (FRANCE, f"{framed}, what is the capital of France?"),
            ("Write a short poem about the sea", f"{framed}, write a short poem about the sea"),
            (TRANSLATE, TRANSLATE),
            (TRANSLATE, HALF_WIDTH),
            ("中国的首都是哪里？", f"{framed}，中国的首都是哪里？"),
        ):
            sig = await sign(parts, asked, f"Answer #1 to: {asked}", ack, f"Answer #2 to: {ack}", again)
            if sig.restates_previous:
                restated.append((ack, again))
    assert restated == []


@pytest.mark.parametrize(
    ("asked", "ack", "again"),
    [
        (FRANCE, "great", "Great, what is the capital of France?"),
        (FRANCE, "really?", "Really? What is the capital of France?"),
        (TRANSLATE, "好的", HALF_WIDTH),
        (TRANSLATE, "好的", TRANSLATE),
    ],
)
async def test_a_question_asked_again_after_an_acknowledgement_is_never_served_its_answer(
    make_proxy: ProxyFactory, upstream: Upstream, asked: str, ack: str, again: str
) -> None:
    """Through the proxy under the shipped policy, which reads restatements: the scripted upstream
    names the turn each answer answers, so the acknowledgement's answer is told from the question's.
    A hit may only be the question's own answer; a miss is the safe side."""
    proxy = await make_proxy()
    client = proxy.client(**{"x-smartcache-session": "ack"})
    history = [{"role": "user", "content": asked}]
    _, first, _ = await chat(client, history)
    history += [{"role": "assistant", "content": first}, {"role": "user", "content": ack}]
    _, acknowledged, _ = await chat(client, history)
    assert first != acknowledged
    history += [{"role": "assistant", "content": acknowledged}, {"role": "user", "content": again}]
    status, served, raw = await chat(client, history)
    assert served != acknowledged, raw.headers
    assert status != "hit" or served == first, raw.headers
