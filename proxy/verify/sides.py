"""One side of a verified pair: a request read with its context, and the text the model reads.

The verifier compares two requests, each with the context that decides what its words mean:
"what is their address?" after a reply about one restaurant is another request than the same
words after a reply about another. A side carries the current user question, the previous user
turn and the head of the previous assistant reply; nothing older, because the cache's own
change detection already handles longer histories and every extra token costs latency.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from proxy.core.model import PREVIOUS_QUESTION_CHARS, QUESTION_CHARS, REPLY_HEAD_CHARS

__all__ = ["PairSide", "side_text"]

# Separates the parts; a character that user text rarely holds, read by the model as a marker.
_SEPARATOR = " ¦ "
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class PairSide:
    """A chat request as the verifier reads it (texts as the user and the assistant wrote them)."""

    question: str
    previous_question: str = ""
    previous_reply_head: str = ""


def _clean(text: str, limit: int) -> str:
    """NFKC (full-width forms fold to ASCII), whitespace runs collapsed, cut at ``limit`` chars."""
    folded = _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip()
    return folded[:limit].rstrip()


def side_text(side: PairSide) -> str:
    """The model input for one side: question first, so token truncation cuts context, never it.

    Empty context parts are left out entirely: a pair-set question without context and the same
    question opening a conversation read the same. When only the reply is known, the empty
    previous question keeps its separator so the reply is never read as a previous question.
    """
    question = _clean(side.question, QUESTION_CHARS)
    previous = _clean(side.previous_question, PREVIOUS_QUESTION_CHARS)
    reply = _clean(side.previous_reply_head, REPLY_HEAD_CHARS)
    if not previous and not reply:
        return question
    if not reply:
        return question + _SEPARATOR + previous
    return question + _SEPARATOR + previous + _SEPARATOR + reply
