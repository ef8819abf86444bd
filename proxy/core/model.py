"""The shared types: what a request is signed into, what a record holds, how a candidate scores
and what a decision says. Plain frozen values: every room reads them and none owns them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, get_args

import numpy as np

from proxy.core.text.entities import Entities
from proxy.core.text.normalize import Cutter, NormalText


class RecordState(StrEnum):
    """A record is written pending, promoted to ready after the feedback window unless the user
    regenerated or objected (rejected), and made invalid by a version change or an admin call."""

    PENDING = "pending"
    READY = "ready"
    REJECTED = "rejected"
    INVALID = "invalid"


LIVE_STATES = (RecordState.PENDING, RecordState.READY)


# Pools from narrow to wide: an answer is written to one and looked up up to the policy's widen_to.
# A literal, not an enum: it is read from policy files and stored on records as these strings.
Scope = Literal["session", "user", "tenant", "global"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
SCOPE_WIDTH: Mapping[str, int] = {scope: width for width, scope in enumerate(SCOPES)}


@dataclass(frozen=True, slots=True)
class CoarseTags:
    intent: str
    entities: Entities
    change_instruction: bool
    context_switch: bool
    intent_forced: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "intent": self.intent,
            "entities": self.entities.to_json(),
            "change_instruction": self.change_instruction,
            "context_switch": self.context_switch,
        }


# What the pair verifier reads of a request (proxy.verify.sides), and so what a signature keeps of
# it and what the decision compares: a side stays near 64 tokens for Chinese and 80 for English;
# the question is bounded too so that a pasted document cannot push its own context out.
QUESTION_CHARS = 200
PREVIOUS_QUESTION_CHARS = 120
REPLY_HEAD_CHARS = 160


@dataclass(frozen=True, slots=True)
class Signature:
    vector: np.ndarray  # the encoding view: the conversation as a whole
    question_vector: np.ndarray  # the current user turn alone
    tags: CoarseTags
    system_prompt_version: str
    context_fingerprint: str
    request_hash: str
    current_text: NormalText  # the current user turn
    view_text: str
    # the version came from the caller (x-smartcache-system-version), not from the prompt itself
    system_version_asserted: bool = False
    previous_reply: str = ""  # the last assistant message before this turn, normalised and cut
    turn_index: int = 1  # user turns so far, this one included
    # set when this turn spells out the previous, elliptical user turn (lexical.restates): the
    # answer the user saw to that turn, whitespace-folded, which names the record it restates
    restated_answer: str = ""
    # The request as the pair verifier reads it: the texts as written (not normalised), each cut
    # to what the verifier reads of it (QUESTION_CHARS, PREVIOUS_QUESTION_CHARS, REPLY_HEAD_CHARS),
    # the context from the signed view.
    question_raw: str = ""
    previous_question: str = ""
    previous_reply_head: str = ""
    # the turn as written without its courtesy framing (core.text.courtesy.bare_question), read
    # once for every candidate a decision holds it against
    question_bare: str = ""
    # the user turns before this one, case, spacing and punctuation aside (signing.conversation
    # .history_key): another conversation's answer is only this one's if they said the same so far
    history_key: str = ""
    # the segmenter the request's turns were cut with, remembering its cuts (signing.conversation
    # .Cuts): the decision's guards read the turns' words from it instead of cutting them again.
    # None: the decision cuts with the default segmenter (tests, hand-made signatures)
    cuts: Cutter | None = field(default=None, compare=False, repr=False)

    @property
    def restates_previous(self) -> bool:
        return bool(self.restated_answer)

    def record_tags(self, *, cut_at: int | None = None) -> RecordTags:
        """Tags stored on a record: the coarse tags plus what the lexical guards and the verifier
        compare."""
        tags = self.tags
        return RecordTags(
            intent=tags.intent,
            entities=tags.entities,
            change_instruction=tags.change_instruction,
            context_switch=tags.context_switch,
            question=NormalText(self.current_text[:600]),
            previous_reply=self.previous_reply,
            turn=self.turn_index,
            question_raw=self.question_raw,
            previous_question=self.previous_question,
            previous_reply_head=self.previous_reply_head,
            history=self.history_key,
            cut_at=cut_at,
        )


CUT_AT = "cut_at"  # the coarse tag of an answer cut at the request's token limit


@dataclass(frozen=True, slots=True)
class RecordTags:
    """What a record keeps of the request it answered, for the hard filters, the lexical guards and
    the verifier to hold a new request against. Stored as JSON (``to_json``) and parsed once, where
    the record leaves the store; a key a record of an older version lacks reads as its default."""

    intent: str = ""
    entities: Entities = field(default_factory=Entities)
    change_instruction: bool = False
    context_switch: bool = False
    question: NormalText = field(default=NormalText(""))  # the current turn, normalised
    previous_reply: str = ""  # normalised and cut, as the signature holds it
    turn: int = 0  # user turns up to this one; 0 on records that did not count them
    question_raw: str = ""
    previous_question: str = ""
    previous_reply_head: str = ""
    # the user turns before it (Signature.history_key); None on records that did not keep them,
    # which makes the record another conversation's to every request
    history: str | None = None
    cut_at: int | None = None  # the token limit the engine cut its answer at, if it did
    # the record whose answer the judge approved for this wording: an alias is served to its own
    # wording (and its restatements) only, is never judged for another, and dies with its record
    alias_of: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "intent": self.intent,
            "entities": self.entities.to_json(),
            "change_instruction": self.change_instruction,
            "context_switch": self.context_switch,
            "question": self.question,
            "previous_reply": self.previous_reply,
            "turn": self.turn,
            "question_raw": self.question_raw,
            "previous_question": self.previous_question,
            "previous_reply_head": self.previous_reply_head,
        }
        if self.history is not None:
            out["history"] = self.history
        if self.cut_at is not None:
            out[CUT_AT] = self.cut_at
        if self.alias_of is not None:
            out["alias_of"] = self.alias_of
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordTags:
        history, cut_at = data.get("history"), data.get(CUT_AT)
        return cls(
            intent=str(data.get("intent", "")),
            entities=Entities.from_json(data.get("entities", {})),
            change_instruction=bool(data.get("change_instruction", False)),
            context_switch=bool(data.get("context_switch", False)),
            question=NormalText(str(data.get("question", ""))),
            previous_reply=str(data.get("previous_reply", "")),
            turn=int(data.get("turn", 0)),
            question_raw=str(data.get("question_raw", "")),
            previous_question=str(data.get("previous_question", "")),
            previous_reply_head=str(data.get("previous_reply_head", "")),
            history=None if history is None else str(history),
            cut_at=cut_at if isinstance(cut_at, int) else None,
            alias_of=str(data["alias_of"]) if data.get("alias_of") else None,
        )


@dataclass(frozen=True, slots=True)
class KeyFacts:
    """What an answer commits to (proxy.core.decision.validate extracts them); stored with the record as
    JSON and parsed once, where the record leaves the store."""

    money: tuple[tuple[float, str], ...] = ()  # (amount, currency)
    numbers_with_units: tuple[tuple[float, str], ...] = ()  # (1.2, "kg"), (3, "day")
    dates: tuple[int, ...] = ()  # YYYYMMDD, or MMDD without a year
    list_items: int = 0  # top-level items of the answer's main list
    day_sections: int = 0  # highest "Day N" / "第N天" header of an itinerary
    sentences: int = 0
    paragraphs: int = 0
    places: frozenset[str] = field(default_factory=frozenset)
    products: frozenset[str] = field(default_factory=frozenset)

    def to_json(self) -> dict[str, Any]:
        return {
            "money": [list(m) for m in self.money],
            "numbers_with_units": [list(n) for n in self.numbers_with_units],
            "dates": list(self.dates),
            "list_items": self.list_items,
            "day_sections": self.day_sections,
            "sentences": self.sentences,
            "paragraphs": self.paragraphs,
            "places": sorted(self.places),
            "products": sorted(self.products),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KeyFacts:
        """Tolerates missing keys, so records written by an older version still load."""
        return cls(
            money=tuple((float(v), str(c)) for v, c in data.get("money", ())),
            numbers_with_units=tuple((float(v), str(u)) for v, u in data.get("numbers_with_units", ())),
            dates=tuple(int(d) for d in data.get("dates", ())),
            list_items=int(data.get("list_items", 0)),
            day_sections=int(data.get("day_sections", 0)),
            sentences=int(data.get("sentences", 0)),
            paragraphs=int(data.get("paragraphs", 0)),
            places=frozenset(data.get("places", ())),
            products=frozenset(data.get("products", ())),
        )


@dataclass(frozen=True, slots=True)
class Record:
    cache_id: str
    tenant: str
    user: str | None
    scope: str
    session: str
    namespace: str
    context_fingerprint: str
    intent: str
    coarse_tags: RecordTags
    vector: bytes
    qvector: bytes
    answer_text: str
    key_facts: KeyFacts
    model: str
    system_prompt_version: str
    policy_version: str
    request_hash: str
    state: str = "pending"
    created_at: float = 0.0
    ready_at: float = 0.0
    expires_at: float = 0.0
    hit_count: int = 0
    last_hit_at: float = 0.0
    feedback_score: float = 1.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    label: int | None = None

    def vector_array(self) -> np.ndarray:
        return np.frombuffer(self.vector, dtype=np.float32)

    def qvector_array(self) -> np.ndarray:
        return np.frombuffer(self.qvector, dtype=np.float32)

    @property
    def cut_at(self) -> int | None:
        """The token limit the engine cut this answer at (finish_reason "length"), if it did: it
        answers only the very request that set that limit."""
        return self.coarse_tags.cut_at


@dataclass(frozen=True, slots=True)
class SessionLast:
    """The record behind a session's last answer: the one a correction or a regenerate is about."""

    cache_id: str
    served: bool  # True: served from the cache as a hit; False: written from upstream
    request_hash: str
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class Candidate:
    record: Record
    view_similarity: float  # the conversations as wholes
    question_similarity: float  # the current turns alone
    same_session: bool = False
    turn_gap: int | None = None  # user turns between it and the request, in the same session

    @property
    def score(self) -> float:
        """Both must match: the same question asked in another context, or another question in
        the same context, is not the same request. For the previous turn of the same session the
        context is the same by construction (the conversation up to it, plus its own exchange),
        so only the questions are compared."""
        if self.same_session and self.turn_gap == 1:
            return self.question_similarity
        return min(self.view_similarity, self.question_similarity)


class Status(StrEnum):
    HIT = "hit"
    HALF_HIT = "half-hit"
    MISS = "miss"
    BYPASS = "bypass"


class Reason(StrEnum):
    """Why a request got its status: one member per exit of the plan and of the decision. The
    values are the wire strings of the log line, the debug header and the metric label; what
    varies (which slots conflicted, which change signals fired) goes in fields of ``Decision``."""

    # the request itself rules caching out (proxy.core.openai.request)
    N_ABOVE_ONE = "n>1"
    LOGPROBS = "logprobs"
    NON_TEXT_CONTENT = "non_text_content"
    TOOLS = "tools"
    NO_USER_TURN = "no_user_turn"
    TOO_LONG = "too_long"  # more text than the cache reads (MAX_CACHEABLE_CHARS): forwarded uncached
    # a parameter asks for what a cache cannot give (proxy.core.openai.params)
    AUDIO_OUTPUT = "audio_output"  # an audio answer: the cache keeps text
    WEB_SEARCH = "web_search"  # an answer read from the web at the time of asking
    HIGH_TEMPERATURE = "high_temperature"  # more variety than the default sampling: a new answer each time
    # a Responses request leans on what the cache cannot read (proxy.core.openai.responses)
    BACKGROUND = "background"  # run in the background, polled later: no answer to serve now
    UNKNOWN_PREVIOUS_RESPONSE = "unknown_previous_response"  # continues a response the proxy has no record of
    STORED_CONTEXT = "stored_context"  # a stored conversation, prompt or item the upstream keeps
    REASONING_ITEMS = "reasoning_items"  # reasoning items in the input, or reasoning asked for in the output
    # the session or the policy rules it out before any lookup
    SESSION_RESET = "session_reset"
    INTENT_DISABLED = "intent_disabled"
    OVERLOADED = "overloaded"  # the embedder could not take the request in time: forwarded uncached
    STORE_UNAVAILABLE = "store_unavailable"  # a shared record store that is down: forwarded uncached
    REGENERATE = "regenerate"
    CORRECTION = "correction"
    TOPIC_SWITCH = "topic_switch"
    # a turn that only acknowledges the reply ("great", "Got it, thanks!", 嗯): it asks nothing, so
    # its answer is the conversation's own; forwarded uncached (proxy.core.text.acknowledgement)
    ACKNOWLEDGEMENT = "acknowledgement"
    NO_CACHE = "no_cache"
    PENDING = "pending"  # a better candidate is still in its feedback window: its answer is not served yet
    # the decision over the candidates (proxy.core.decision.decide), in the order of its stages
    NO_CANDIDATE = "no_candidate"
    FILTERED_INTENT = "filtered:intent"
    FILTERED_ENTITIES = "filtered:entities"
    BELOW_CANDIDATE = "below_candidate"
    NEW_TOPIC = "new_topic"
    MODIFIES_CONTEXT = "modifies_context"
    CONTEXT_MOVED = "context_moved"
    REORDERED_WORDS = "reordered_words"
    CONTEXT_DIFFERS = "context_differs"
    OTHER_HISTORY = "other_history"  # another conversation's answer, after other user turns
    ASKED_AGAIN = "asked_again"  # the session's previous turn in its own words: another answer is wanted
    OTHER_NAMES = "other_names"  # a capitalised name one turn has and the other does not
    OTHER_LANGUAGE = "other_language"  # asked in Chinese, answered for English (or the other way)
    OTHER_OPERATORS = "other_operators"  # "==" against "-=": symbols an embedding does not read
    CANDIDATE_ZONE = "candidate_zone"
    NO_DIRECT_HIT = "no_direct_hit"
    # another session's answer, which the intent serves only on the judge's yes (``widen_by: judge``)
    JUDGE_ONLY = "judge_only"
    VERIFIER_UNAVAILABLE = "verifier_unavailable"
    VERIFIER_REJECTED = "verifier_rejected"
    VALIDATION_FAILED = "validation_failed"
    ACCEPT = "accept"
    VERIFIED = "verified"
    EXACT_REPEAT = "exact_repeat"
    # the same turn after the same turns, with courtesy framing added or dropped ("…, thanks")
    COURTESY_VARIANT = "courtesy_variant"
    RESTATEMENT = "restatement"
    # the pair verifier read the request as the session's previous turn asked again
    VERIFIED_PREVIOUS = "verified_previous"
    # the model behind the proxy read the cached answer and said it answers this request
    JUDGED = "judged"
    # the judge said no to every candidate it read, or its verdict came after the deadline
    JUDGE_REFUSED = "judge_refused"
    JUDGE_LATE = "judge_late"
    # served without asking: the tenant's labels bound the wrong answers above the verifier's
    # score for this pair under the intent's max_error (proxy.core.learning)
    LEARNED = "learned"
    # the judge said yes, but this request is one of the sample whose fresh answer is compared
    # with the cached one instead (audit_rate): forwarded
    JUDGE_AUDIT = "judge_audit"
    # an identical request in flight shared its upstream answer (proxy.upstream.coalesce)
    COALESCED = "coalesced"


@dataclass(frozen=True, slots=True)
class Decision:
    status: Status
    reason: Reason
    record: Record | None = None
    score: float | None = None
    failed_checks: tuple[str, ...] = ()
    signals: tuple[str, ...] = ()
    detail: str = ""  # what varies within the reason, e.g. the conflicting entity slots "budget,places"
    verified: float | None = None  # the verifier's probability for the record, when it was asked
    stage: str = ""  # the decision stage that ended the decision

    @property
    def is_hit(self) -> bool:
        return self.status is Status.HIT

    @property
    def summary(self) -> str:
        """The reason with its detail, for people: ``filtered:entities:budget``."""
        return f"{self.reason}:{self.detail}" if self.detail else str(self.reason)
