"""Factories for the values tests build again and again: one place that knows every field of a
``Record`` and a ``Signature``, so a test names only the fields it is about."""

from __future__ import annotations

from typing import Any

import numpy as np

from proxy.core.model import CoarseTags, KeyFacts, Record, RecordTags, Signature
from proxy.core.text.entities import Entities


def unit_vector(dim: int, seed: int | None = None) -> bytes:
    """A unit float32 vector as a record stores it: all equal components, or random ones by ``seed``."""
    v = np.ones(dim, dtype=np.float32) if seed is None else np.random.default_rng(seed).standard_normal(dim)
    return (v / np.linalg.norm(v)).astype(np.float32).tobytes()


def make_record(**fields: Any) -> Record:
    """A ready record of tenant ``t``, session ``s``, with no vectors, tags or key facts; ``fields``
    replace any of them."""
    base: dict[str, Any] = {
        "cache_id": "sc-1",
        "tenant": "t",
        "user": None,
        "scope": "session",
        "session": "s",
        "namespace": "",
        "context_fingerprint": "fp",
        "intent": "general",
        "coarse_tags": RecordTags(),
        "vector": b"",
        "qvector": b"",
        "answer_text": "cached answer",
        "key_facts": KeyFacts(),
        "model": "m",
        "system_prompt_version": "sp",
        "policy_version": "v",
        "request_hash": "h",
        "state": "ready",
    }
    return Record(**{**base, **fields})


def make_signature(*, intent: str = "general", entities: Entities | None = None, **fields: Any) -> Signature:
    """A signature of intent ``intent`` (``entities``, no change instruction, no context switch),
    with equal 4-d vectors, system prompt version ``sp`` and no text; ``fields`` replace any of them."""
    vector = np.ones(4, dtype=np.float32) / 2
    tags = CoarseTags(intent=intent, entities=entities or Entities(), change_instruction=False, context_switch=False)
    base: dict[str, Any] = {
        "vector": vector,
        "question_vector": vector,
        "tags": tags,
        "system_prompt_version": "sp",
        "context_fingerprint": "fp",
        "request_hash": "req",
        "current_text": "",
        "view_text": "",
    }
    return Signature(**{**base, **fields})
