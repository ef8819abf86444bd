"""What counts as evidence that an identical request is the same conversation re-sent."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.conversation import Conversation, Normalizer
from proxy.core.identity import Identity
from proxy.core.openai.request import parse_chat_request
from proxy.service.feedback import same_conversation_again

OPENING = [{"role": "user", "content": "How can I reset my router password?"}]
WITH_REPLY = [
    *OPENING,
    {"role": "assistant", "content": "Hold the reset button."},
    {"role": "user", "content": "Then?"},
]
TWO_USER_TURNS = [{"role": "user", "content": "Hi"}, {"role": "user", "content": "How can I reset it?"}]


def conversation(messages: list[dict[str, str]]) -> Conversation:
    return Normalizer().conversation(parse_chat_request(orjson.dumps({"model": "m", "messages": messages})))


@pytest.mark.parametrize(
    ("messages", "explicit", "user", "evidence"),
    [
        pytest.param(OPENING, False, None, False, id="derived-opening-is-anyone"),
        pytest.param(TWO_USER_TURNS, False, None, False, id="derived-no-reply-re-sent"),
        pytest.param(WITH_REPLY, False, None, True, id="derived-history-re-sent"),
        pytest.param(OPENING, False, "alice", True, id="derived-with-an-end-user"),
        pytest.param(OPENING, True, None, True, id="explicit-session"),
    ],
)
def test_a_regenerate_needs_evidence_of_the_same_conversation(
    messages: list[dict[str, str]], explicit: bool, user: str | None, evidence: bool
) -> None:
    who = Identity(tenant="t", session="s", user=user, session_explicit=explicit)
    assert same_conversation_again(who, conversation(messages)) is evidence
