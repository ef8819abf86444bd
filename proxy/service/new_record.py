"""The record an answer becomes: who may see it, how long it lives, and what a later request must
match to be served it, read from the request, its signature and its intent's policy. Pure: the
cache stores what this builds."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from proxy.core.identity import Identity
from proxy.core.model import KeyFacts, Record, Signature
from proxy.core.openai.request import ChatRequest
from proxy.core.policy import IntentPolicy
from proxy.service.reach import write_scope

__all__ = ["new_record"]


def new_record(
    *,
    request: ChatRequest,
    who: Identity,
    sig: Signature,
    policy: IntentPolicy,
    policy_version: str,
    answer: str,
    key_facts: KeyFacts,
    usage: Mapping[str, Any],
    now: float,
    ready_after: float,
    cut: bool,
) -> Record:
    """``cut``: the engine ended the answer at the request's token limit; it is kept for that very
    request at that limit only (``SemanticCache.candidates``). An answer waits ``ready_after``
    seconds in its feedback window before it is served; the request's own ttl can only shorten
    the policy's."""
    ttl = policy.ttl if request.controls.ttl is None else min(policy.ttl, request.controls.ttl)
    return Record(
        cache_id="sc-" + uuid.uuid4().hex[:20],
        tenant=who.tenant,
        user=who.user,
        scope=write_scope(policy, sig, request, who),
        session=who.session,
        namespace=request.record_namespace,
        context_fingerprint=sig.context_fingerprint,
        intent=sig.tags.intent,
        coarse_tags=sig.record_tags(cut_at=request.answer_cap if cut else None),
        vector=np.asarray(sig.vector, dtype=np.float32).tobytes(),
        qvector=np.asarray(sig.question_vector, dtype=np.float32).tobytes(),
        answer_text=answer,
        key_facts=key_facts,
        model=request.model,
        system_prompt_version=sig.system_prompt_version,
        policy_version=policy_version,
        request_hash=sig.request_hash,
        state="ready" if ready_after <= 0 else "pending",
        created_at=now,
        ready_at=now + ready_after,
        expires_at=now + ttl,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
    )
