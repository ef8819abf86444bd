"""Which records a caller may be served and where an answer is written, by table: keyed tenants
see their pools up to the intent's ``widen_to``; the anonymous tenant shares nothing, whatever
the policy says, and an anonymous caller nothing tells apart is served only what it already holds."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from proxy.core.identity import ANONYMOUS, Identity
from proxy.core.model import Record
from proxy.core.openai.request import ChatRequest, parse_chat_request
from proxy.core.policy import load_policy
from proxy.service.reach import held, reach, repeated, visible, write_scope
from proxy.settings import DEFAULT_POLICY
from tests.factories import make_record, make_signature

WIDE = dataclasses.replace(
    load_policy(DEFAULT_POLICY).for_intent("faq"),
    scope="global",
    widen_to="global",
    repeats_widen_to="tenant",
    global_safe=True,
)


def caller(tenant: str = ANONYMOUS, session: str = "s1", user: str | None = None, explicit: bool = True) -> Identity:
    return Identity(tenant=tenant, session=session, user=user, session_explicit=explicit)


def record(**fields: Any) -> Record:
    return make_record(**{"tenant": ANONYMOUS, "session": "s0", "scope": "global", "request_hash": "req", **fields})


ANON = caller()
ANON_USER = caller(user="bob", session="s2", explicit=False)
KEYED = caller("t-a", "s1")


@pytest.mark.parametrize(
    ("rec", "who", "widen_to", "seen"),
    [
        # the anonymous tenant: another session's record is never seen, whatever its pool
        (record(scope="global"), ANON, "global", False),
        (record(scope="tenant"), ANON, "tenant", False),
        (record(scope="user", user="bob"), caller(user="bob"), "user", False),
        (record(scope="session", session="s1"), ANON, "global", True),  # its own session
        # a keyed caller never reads an anonymous record, even one an older build wrote global
        (record(scope="global"), KEYED, "global", False),
        # nor does an anonymous caller read a keyed tenant's global record
        (record(tenant="t-b", scope="global"), ANON, "global", False),
        # keyed tenants as before: their pools, and the global pool across tenants
        (record(tenant="t-b", scope="global"), KEYED, "global", True),
        (record(tenant="t-a", scope="tenant"), KEYED, "tenant", True),
        (record(tenant="t-b", scope="tenant"), KEYED, "tenant", False),
        (record(tenant="t-a", scope="tenant"), KEYED, "session", False),
    ],
)
def test_visible(rec: Record, who: Identity, widen_to: str, seen: bool) -> None:
    assert visible(rec, who, widen_to) is seen


def test_an_anonymous_caller_reaches_its_session_only_whatever_the_policy() -> None:
    for scope in ("session", "user", "tenant", "global"):
        assert reach(ANON, scope) == "session"
        assert reach(KEYED, scope) == scope


def test_the_same_conversation_in_another_anonymous_session_is_no_repeat() -> None:
    sig = make_signature(request_hash="req")
    assert not repeated(record(), sig, ANON, WIDE)
    assert not repeated(record(scope="session"), sig, ANON_USER, WIDE)
    assert repeated(record(tenant="t-a", scope="session"), sig, KEYED, WIDE)


def ask(*turns: str, **body: Any) -> ChatRequest:
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
    return parse_chat_request(orjson.dumps({"model": "m", "messages": messages, **body}))


def test_an_anonymous_answer_is_written_to_its_session_only() -> None:
    sig = make_signature()
    assert write_scope(WIDE, sig, ask("Hi?"), ANON) == "session"
    assert write_scope(WIDE, sig, ask("Hi?"), ANON_USER) == "session"
    assert write_scope(WIDE, sig, ask("Hi?"), KEYED) == "global"


INDISTINCT = caller(session="d-x", explicit=False)


@pytest.mark.parametrize(
    ("who", "request_", "answer", "ok"),
    [
        # the opening turn: another person's identical opening shares its derived session
        (INDISTINCT, ask("What is my balance, account 12345?"), "Jane, your balance is 10.", False),
        # a later turn: only an answer the conversation already carries
        (INDISTINCT, ask("Define X.", "X is a letter.", "I mean, define X?"), "X is a letter.", True),
        (INDISTINCT, ask("Define X.", "X is a letter.", "I mean, define X?"), "X is a sign.", False),
        # a user turn saying the answer is not holding it
        (INDISTINCT, ask("Define X.", "X is a letter.", "X is a sign."), "X is a sign.", False),
        # a caller told apart (session header, user id, key) is judged by its pools alone
        (caller(), ask("What is my balance?"), "Jane, your balance is 10.", True),
        (caller(user="u", explicit=False), ask("What is my balance?"), "Jane, your balance is 10.", True),
        (caller("t-a", explicit=False), ask("What is my balance?"), "Jane, your balance is 10.", True),
    ],
)
def test_held(who: Identity, request_: ChatRequest, answer: str, ok: bool) -> None:
    assert held(record(answer_text=answer), who, request_) is ok
