"""The session a router keys a forwarded request on (pure, no IO).

A router in front of several engine replicas (vllm-router's ``consistent_hash``, SGLang's model
gateway with a routing key) sends every request with one key to one replica, whose prefix cache
then holds that conversation. The key is the conversation's session: the client's own, or the
one derived from how the conversation opens for a client that sends none (``proxy.core.identity``),
so every turn of it lands where its history is cached, through any proxy of a fleet.

A half-hit is related to a record written by another session: that session's replica holds the
record's prompt. Where the request shares enough of that prompt (the same system prompt and, when
the record's conversation said the same so far, its history too), sending the request there reuses
that prefix instead of prefilling it again elsewhere. The conversation's next turn goes back to its
own key unless it half-hits again, which is why a short shared prefix (cheaper than the turn it
moves) keeps the conversation's own key.
"""

from __future__ import annotations

from proxy.core.model import Decision, Record, Signature, Status
from proxy.core.openai.request import SYSTEM_ROLES, ChatRequest


def shared_prefix_chars(req: ChatRequest, sig: Signature, record: Record) -> int:
    """Characters at the head of the request's prompt that the record's prompt began with too: its
    system prompt where the versions match, and the turns before the current one where the
    record's conversation asked the same so far."""
    if record.system_prompt_version != sig.system_prompt_version:
        return 0
    shared = len(req.system_text)
    tags = record.coarse_tags
    if tags.history == sig.history_key and tags.turn == sig.turn_index:
        last_user = max((i for i, m in enumerate(req.messages) if m.role == "user"), default=0)
        shared += sum(len(m.text) for m in req.messages[:last_user] if m.role not in SYSTEM_ROLES)
    return shared


def routing_session(
    own: str,
    tenant: str,
    req: ChatRequest,
    sig: Signature | None,
    decision: Decision | None,
    *,
    min_shared_chars: int,
) -> str:
    """``own``: the conversation's session, ``tenant``: the caller's. A half-hit goes to its related
    record's session when they share at least ``min_shared_chars`` of prompt; everything else
    keeps its own. A record of another tenant (a global pool's) never moves it: the engines keep
    each tenant's prefix blocks apart (vLLM's ``cache_salt``, upstream.hints), so there is nothing
    to reuse there."""
    if sig is None or decision is None or decision.status is not Status.HALF_HIT or decision.record is None:
        return own
    record = decision.record
    if record.session == own or record.tenant != tenant:
        return own
    shared = shared_prefix_chars(req, sig, record)
    return record.session if shared and shared >= min_shared_chars else own
