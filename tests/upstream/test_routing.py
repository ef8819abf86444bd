"""routing_session: a forwarded request keeps its conversation's session as the router's key, but
for a half-hit that shares a long enough prompt prefix with its related record of another session
of the same tenant, which goes where that record's prefix is cached."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import orjson
import pytest

from proxy.core.model import Decision, Reason, Record, RecordTags, Signature, Status
from proxy.core.openai.request import ChatRequest, parse_chat_request
from proxy.upstream.routing import routing_session, shared_prefix_chars
from tests.factories import make_record, make_signature

SYSTEM = "You are the travel desk of a large agency. " * 20  # 880 characters
HISTORY = "user: plan four days in Lisbon" + "x" * 300


def request(*, system: str = SYSTEM, history: bool = True) -> ChatRequest:
    messages = [{"role": "system", "content": system}]
    if history:
        messages += [
            {"role": "user", "content": "Plan four days in Lisbon."},
            {"role": "assistant", "content": "Day one: Alfama. " * 30},
        ]
    messages.append({"role": "user", "content": "Make it five days instead."})
    return parse_chat_request(orjson.dumps({"model": "m", "messages": messages}))


def signature(*, history_key: str = HISTORY, turn: int = 2, version: str = "sp") -> Signature:
    return make_signature(
        intent="travel",
        current_text="make it five days instead",
        turn_index=turn,
        history_key=history_key,
        system_prompt_version=version,
    )


def record(*, session: str = "theirs", tenant: str = "t", history: str = HISTORY, turn: int = 2) -> Record:
    return make_record(
        tenant=tenant,
        session=session,
        scope="tenant",
        intent="travel",
        coarse_tags=RecordTags(history=history, turn=turn),
    )


def half_hit(rec: Record | None = None) -> Decision:
    return Decision(Status.HALF_HIT, Reason.MODIFIES_CONTEXT, rec or record())


@dataclass(frozen=True)
class Case:
    name: str
    expect: str
    decision: Decision | None = None
    sig: Signature | None = dataclasses.field(default_factory=signature)
    min_chars: int = 1000


CASES = [
    Case("a miss keeps its own session", "ours", Decision(Status.MISS, Reason.BELOW_CANDIDATE, record())),
    Case("no plan (a bypass) keeps its own session", "ours", None, None),
    Case("a half-hit sharing system prompt and history goes to the record's session", "theirs", half_hit()),
    Case("a half-hit sharing too little keeps its own session", "ours", half_hit(), min_chars=10_000),
    Case("a related record of the same session changes nothing", "ours", half_hit(record(session="ours"))),
    Case("another tenant's record never moves a request", "ours", half_hit(record(tenant="other"))),
    Case(
        "another history leaves the system prompt alone, too short here",
        "ours",
        half_hit(record(history="user: something else")),
    ),
    Case(
        "another history with a long enough system prompt still goes there",
        "theirs",
        half_hit(record(history="user: something else")),
        min_chars=800,
    ),
    Case(
        "another system prompt version shares nothing", "ours", half_hit(), sig=signature(version="other"), min_chars=0
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_routing_session(case: Case) -> None:
    got = routing_session("ours", "t", request(), case.sig, case.decision, min_shared_chars=case.min_chars)
    assert got == case.expect


def test_the_shared_prefix_counts_the_system_prompt_and_the_same_history() -> None:
    req = request()
    history = sum(len(m.text) for m in req.messages[1:-1])
    assert shared_prefix_chars(req, signature(), record()) == len(SYSTEM) + history
    assert shared_prefix_chars(req, signature(), record(history="other")) == len(SYSTEM)
    assert shared_prefix_chars(req, signature(), record(turn=3)) == len(SYSTEM)
    assert shared_prefix_chars(request(history=False, system=""), signature(), record()) == 0
