"""Which records a caller may be served, and the widest pool an answer is written to.

Pools widen from the session to the caller's user, the tenant and everyone (``SCOPE_WIDTH``); a
record is seen from its own pool and every wider one the intent's ``widen_to`` allows, and never
across tenants below ``global``. Pure: the cache applies these to what the index and store return.

The anonymous tenant (no key: proxy/core/identity.py) shares nothing, whatever the intent's
``scope``, ``widen_to`` or ``repeats_widen_to`` say. Anyone can be anonymous, so its pools beyond
the session would be everybody's: an anonymous caller reads its own session only (``reach``),
its answers are written to the session alone (``write_scope``), and no keyed caller reads an
anonymous record, whatever pool an older one was written to (``within``). An anonymous caller with
neither a session header nor a user id (``Identity.indistinct``) cannot even be told apart from
another person who opens with the same words, whose derived session is the same: it is served
only an answer its own conversation already carries (``held``), an earlier turn's answer asked for
again, never one its messages do not show it was given.
"""

from __future__ import annotations

from proxy.core.identity import ANONYMOUS, Identity
from proxy.core.model import Record, Signature
from proxy.core.openai.request import ChatRequest
from proxy.core.policy import IntentPolicy
from proxy.storage.base import IndexKey
from proxy.storage.mirror import SCOPE_WIDTH
from proxy.storage.vectors import Hits

__all__ = [
    "PASTED_CHARS",
    "fits_limit",
    "held",
    "nearest_of_both",
    "reach",
    "repeated",
    "visible",
    "write_scope",
]


def reach(who: Identity, scope: str) -> str:
    """The widest pool this caller may search or write, for an intent that allows ``scope``: the
    session alone for the anonymous tenant, which shares nothing."""
    return "session" if who.anonymous else scope


def visible(record: IndexKey | Record, who: Identity, widen_to: str) -> bool:
    """May a record of this scope be served to this caller, searching pools up to ``widen_to``?"""
    return within(record, who, min(SCOPE_WIDTH[record.scope], SCOPE_WIDTH[widen_to]))


def within(record: IndexKey | Record, who: Identity, width: int) -> bool:
    """Is the record in the caller's session, or in a pool of this width around the caller? An
    anonymous record, or an anonymous caller, has its session and nothing wider."""
    if record.tenant == who.tenant and record.session == who.session:
        return True
    if who.anonymous or record.tenant == ANONYMOUS:
        return False
    if width >= SCOPE_WIDTH["global"]:
        return True
    if record.tenant != who.tenant:
        return False
    if width >= SCOPE_WIDTH["tenant"]:
        return True
    return width >= SCOPE_WIDTH["user"] and who.user is not None and record.user == who.user


def repeated(record: Record, sig: Signature, who: Identity, policy: IntentPolicy) -> bool:
    """Is the record this very conversation (model, system prompt and every message the same) asked
    in another session within the intent's ``repeats_widen_to`` (the caller's tenant, or its user)?
    Its answer was written for exactly what this caller sent, so the pool it went to does not
    matter; it never crosses tenants."""
    return record.request_hash == sig.request_hash and within(record, who, SCOPE_WIDTH[policy.repeats_widen_to])


def held(record: Record, who: Identity, request: ChatRequest) -> bool:
    """May the record's answer go to this caller as far as telling callers apart goes? Always,
    but to an ``indistinct`` caller, whose session another person may share: only an answer its
    own conversation already carries (an assistant turn of the request), which tells it nothing
    it was not given."""
    if not who.indistinct:
        return True
    answer = record.answer_text.strip()
    return any(m.role == "assistant" and m.text.strip() == answer for m in request.messages)


PASTED_CHARS = 600  # a user turn this long carries the user's own text (a document, code, a letter)


def fits_limit(record: Record, cap: int | None, request_hash: str) -> bool:
    """May the record answer a request limited to ``cap`` tokens? An answer cut at a limit
    (``cut_at``) is the answer to that very request at that limit alone, never to one allowing
    more; a whole answer is one for a request with a limit only when it is known to fit in it (the
    engine would have cut a longer one; a count the upstream did not report fits no limit), and
    for any request without."""
    if record.cut_at is not None:
        return record.cut_at == cap and record.request_hash == request_hash
    return cap is None or 0 < record.completion_tokens <= cap


def nearest_of_both(own: Hits, wider: Hits, k: int) -> Hits:
    """The ``k`` best of the session's own records and the ``k`` best of the others, each label
    once. The two are not ranked against each other: a restatement or a rephrasing is judged
    against the turn it restates, so near neighbours from other sessions must never push the
    session's own turn out of the candidates."""
    mine = own[:k]
    seen = {label for label, _ in mine}
    return mine + [hit for hit in wider if hit[0] not in seen][:k]


def write_scope(policy: IntentPolicy, sig: Signature, request: ChatRequest, who: Identity) -> str:
    """The widest pool the answer may be served in. ``widen_to`` when the answer cannot depend on
    the user's own content: nobody is named, no user turn is pasted text, and the system-prompt
    version was computed from the prompt itself (one the caller asserted with the
    x-smartcache-system-version header could name another tenant's prompt and poison its pool).
    Otherwise ``scope``. Global also needs the intent marked safe, and never holds personal
    answers: those stop at the tenant. An anonymous answer stays in its session."""
    if who.anonymous:
        return "session"
    asserted = sig.system_version_asserted
    pasted = any(len(m.text) > PASTED_CHARS for m in request.messages if m.role == "user")
    personal = bool(sig.tags.entities.people) or asserted or pasted
    scope = policy.scope if personal else policy.widen_to
    return "tenant" if scope == "global" and (personal or not policy.global_safe) else scope
