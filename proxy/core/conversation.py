"""A request's conversation read once: every turn normalised at the edge, into the value that
the feedback rules, the signer and the decision stages all read.

Normalising is the costly part of reading text (NFKC, punctuation, jieba for Chinese
numerals), and history turns come back with every request, so turns are normalised through an
LRU keyed by their raw text. Nothing after this normalises a request's turns again: the rules
of ``proxy.core.text`` take ``NormalText``. Nor does anything cut a normalised turn into words twice:
``Cuts`` remembers the segmenter's cuts by text for every stage that reads them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from proxy.core.lru import LruDict
from proxy.core.openai.request import ChatRequest
from proxy.core.text.lexical import canonical_formula
from proxy.core.text.normalize import Cutter, NormalText, default_segmenter, normalize_text, system_prompt_version


@dataclass(frozen=True, slots=True)
class Turn:
    """One user or assistant turn: as written (what the verifier reads) and normalised."""

    role: str
    text: str
    norm: NormalText


class Cuts:
    """A segmenter's word cuts remembered by text: a turn that the signer reads for a restatement
    and the decision for reordered words is cut once (and a history turn once for the requests
    that carry it). Owned by the signer and bounded like its other memories; read on one thread
    only."""

    def __init__(self, segmenter: Cutter, size: int = 20_000) -> None:
        self.segmenter = segmenter
        self._words: LruDict[str, tuple[str, ...]] = LruDict(size)

    def words(self, text: str) -> Sequence[str]:
        return self._words.remember(text, lambda t: tuple(self.segmenter.words(t)))

    def tag(self, words: Sequence[str]) -> Sequence[tuple[str, str]]:
        # read for a text's entities alone, which the signer keeps whole (ContextSigner.entities)
        return self.segmenter.tag(words)


def _normalized(text: str, segmenter: Cutter) -> NormalText:
    norm = normalize_text(text, segmenter=segmenter)
    return NormalText(canonical_formula(norm) or norm)


def _system(text: str, segmenter: Cutter) -> tuple[NormalText, str]:
    norm = normalize_text(text, segmenter=segmenter)
    return norm, system_prompt_version(norm)


_WORDS_ONLY = re.compile(r"[\W_]+")


def request_hash(request: ChatRequest) -> str:
    """Exact identity of a request's conversation and of the parameters that shape its answer
    (``ChatRequest.shaping``, absent for a plain request): the same bytes re-sent is a regenerate;
    the same conversation asked in JSON mode is another request."""
    said = [request.model, [[m.role, m.text] for m in request.messages]]
    material = orjson.dumps([*said, request.shaping] if request.shaping else said)
    return hashlib.sha256(material).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Conversation:
    system: NormalText  # every system prompt of the request, joined and normalised
    system_version: str  # the version of that prompt's template (normalize.system_prompt_version)
    history: tuple[Turn, ...]  # the non-empty turns before the current user turn
    current: NormalText  # the last user turn ("" when there is none)
    current_raw: str
    request_hash: str  # the exact request (request_hash), read by regenerate detection and the record

    @property
    def history_key(self) -> str:
        """The user turns before the current one, with case, spacing and punctuation aside: two
        conversations that said the same so far share it, whatever the replies were."""
        said = [_WORDS_ONLY.sub("", m.norm) for m in self.history if m.role == "user"]
        return hashlib.sha256("\x1f".join(said).encode()).hexdigest()[:16] if said else ""

    def user_turns(self) -> list[NormalText]:
        return [t.norm for t in self.history if t.role == "user"]


class Normalizer:
    """normalize_text with courtesy formulas in one canonical form ("thx" = "thanks"), remembered
    per raw text. ``segmenter``: the app's (``default_segmenter()`` for a caller without one)."""

    def __init__(self, cache_size: int = 20_000, *, segmenter: Cutter | None = None) -> None:
        self._segmenter = segmenter or default_segmenter()
        self._norms: LruDict[str, NormalText] = LruDict(cache_size)
        self._systems: LruDict[str, tuple[NormalText, str]] = LruDict(256)  # few prompts, long ones

    def __call__(self, text: str) -> NormalText:
        return self._norms.remember(text, lambda t: _normalized(t, self._segmenter))

    def system(self, text: str) -> tuple[NormalText, str]:
        """A system prompt normalised (no courtesy formulas) and its version: both recur with every
        request of the prompt, and masking its volatile parts runs a dozen patterns over it."""
        return self._systems.remember(text, lambda t: _system(t, self._segmenter))

    def conversation(self, request: ChatRequest) -> Conversation:
        turns = [m for m in request.turns if m.text.strip()]
        history = turns[:-1] if turns and turns[-1].role == "user" else turns
        current_raw = request.last_user_text
        system, version = self.system(request.system_text)
        return Conversation(
            system=system,
            system_version=version,
            history=tuple(Turn(m.role, m.text, self(m.text)) for m in history),
            current=self(current_raw),
            current_raw=current_raw,
            request_hash=request_hash(request),
        )
