"""The record an answer becomes: its lifetime is the policy's unless the request asked for less,
it waits out the feedback window unless there is none, an answer cut at the request's token limit
says so, and a named person keeps it out of the wider pool."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.identity import Identity
from proxy.core.model import Entities, KeyFacts
from proxy.core.openai.request import ChatRequest, parse_chat_request
from proxy.core.policy import load_policy
from proxy.service.new_record import new_record
from proxy.settings import DEFAULT_POLICY
from tests.factories import make_signature

WHO = Identity(tenant="t", session="s", user="u", session_explicit=True)
FAQ = load_policy(DEFAULT_POLICY).for_intent("faq")


def ask(cache_control: str | None = None, **body: Any) -> ChatRequest:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi?"}], **body})
    return parse_chat_request(raw, cache_control=cache_control)


def build(request: ChatRequest, *, ready_after: float = 30.0, cut: bool = False, **sig: Any) -> Any:
    return new_record(
        request=request, who=WHO, sig=make_signature(intent="faq", **sig), policy=FAQ, policy_version="pv",
        answer="Hello.", key_facts=KeyFacts(), usage={"prompt_tokens": 7, "completion_tokens": "3"},
        now=1000.0, ready_after=ready_after, cut=cut,
    )  # fmt: skip


def test_an_answer_lives_as_long_as_the_policy_says_or_the_request_asked_if_shorter() -> None:
    assert build(ask()).expires_at == 1000.0 + FAQ.ttl
    assert build(ask(cache_control="max-age=60")).expires_at == 1060.0
    assert build(ask(cache_control=f"max-age={FAQ.ttl * 2}")).expires_at == 1000.0 + FAQ.ttl


def test_an_answer_waits_out_the_feedback_window_unless_there_is_none() -> None:
    pending = build(ask())
    assert (pending.state, pending.ready_at) == ("pending", 1030.0)
    assert build(ask(), ready_after=0).state == "ready"


def test_a_cut_answer_keeps_the_limit_it_was_cut_at_and_a_whole_one_none() -> None:
    assert build(ask(max_tokens=20), cut=True).coarse_tags.cut_at == 20
    assert build(ask(max_tokens=20)).coarse_tags.cut_at is None


def test_the_record_carries_who_asked_what_it_cost_and_the_signature_it_matches() -> None:
    record = build(ask(), request_hash="rh", context_fingerprint="fp2")
    assert (record.tenant, record.session, record.user, record.model) == ("t", "s", "u", "m")
    assert (record.request_hash, record.context_fingerprint, record.intent) == ("rh", "fp2", "faq")
    assert (record.prompt_tokens, record.completion_tokens) == (7, 3)
    assert record.cache_id.startswith("sc-") and record.cache_id != build(ask()).cache_id


def test_a_named_person_keeps_the_answer_in_the_pool_the_policy_writes_to() -> None:
    assert FAQ.widen_to != FAQ.scope  # the case this test is about
    assert build(ask()).scope == FAQ.widen_to
    assert build(ask(), entities=Entities(people=frozenset({"Alice"}))).scope == FAQ.scope
