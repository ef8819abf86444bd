"""A conversation's history key: what its user said before the current turn, case, spacing and
punctuation aside, so two conversations that said the same so far share it and no others do."""

from __future__ import annotations

import orjson

from proxy.core.conversation import Conversation, Normalizer
from proxy.core.openai.request import parse_chat_request


def conversation(*turns: str) -> Conversation:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return Normalizer().conversation(parse_chat_request(orjson.dumps({"model": "m", "messages": msgs})))


def test_the_same_user_turns_share_a_key_whatever_the_replies() -> None:
    a = conversation("I want a cheap restaurant.", "There are three.", "Any Indian ones?")
    b = conversation("i want a CHEAP restaurant", "Sure, here is a list.", "Is there an Indian one?")
    assert a.history_key == b.history_key != ""


def test_other_user_turns_or_none_have_other_keys() -> None:
    first = conversation("Any Indian ones?")
    assert first.history_key == ""
    barbeque = conversation("I want a cheap barbeque restaurant.", "There is one.", "Any Indian ones?")
    cheap = conversation("I want a cheap restaurant.", "There are three.", "Any Indian ones?")
    assert len({first.history_key, barbeque.history_key, cheap.history_key}) == 3
    # the order of what was said matters too
    ab = conversation("north", "ok", "cheap", "ok", "now?")
    ba = conversation("cheap", "ok", "north", "ok", "now?")
    assert ab.history_key != ba.history_key
