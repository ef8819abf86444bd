"""Writing an upstream answer back: the one rule of what is stored, read by the proxy after each
reply (proxy.http.chat) and by offline replay (proxy.tools.replay), so what replay measures is
what serving keeps.

An answer is written as a record when the plan lets its request be stored (``Plan.policy``), the
answer came back whole, successful and in plain text, and the client did not say ``no_store``.
An answer the engine cut at the token limit is kept only for a request that set that limit, and
for that limit alone (``SemanticCache.write``): another request could not tell it was cut. Any
other answer the client got, bypassed ones included, still becomes the session's last answer,
held by no record: a correction sent after it is about it, and must not penalise the record of
the turn before, which the user did not complain about. Only a request planned while the store
was down is not noted: there is nowhere to note it. A store that fails costs the answer its
keeping, never the answer: the client has it already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from proxy.core.conversation import request_hash
from proxy.core.identity import Identity
from proxy.core.model import Reason, Record
from proxy.core.openai.request import ChatRequest
from proxy.service.cache import SemanticCache
from proxy.service.planner import Plan, PolicyBox
from proxy.storage.base import StoreUnavailable

__all__ = ["Kept", "WriteBack", "record_vector"]


@dataclass(frozen=True, slots=True)
class Kept:
    """What came of an answer: the record written, or none; ``failed``: the store refused it."""

    record: Record | None = None
    failed: bool = False


class WriteBack:
    def __init__(self, cache: SemanticCache, policy_box: PolicyBox) -> None:
        self.cache, self.policy_box = cache, policy_box

    async def keep(
        self,
        req: ChatRequest,
        who: Identity,
        plan: Plan,
        answer: str | None,
        usage: dict[str, Any],
        *,
        cut: bool = False,
    ) -> Kept:
        """``answer``: the whole, successful, plain-text answer, None where none came back so;
        ``cut``: the engine ended it at the token limit."""
        if cut and req.answer_cap is None:
            answer = None
        if plan.policy is None or plan.signature is None or answer is None or req.controls.no_store:
            if plan.reason != Reason.STORE_UNAVAILABLE:
                # one bypassed before signing (its own parameters, a reset, an overload) is noted
                # by the hash signing would have given it
                said = plan.signature.request_hash if plan.signature is not None else request_hash(req)
                await self.cache.note_unstored(who, said)
            return Kept()
        try:
            record = await self.cache.write(
                request=req,
                who=who,
                sig=plan.signature,
                policy=plan.policy,
                policy_version=self.policy_box.policy.version,
                answer=answer,
                usage=usage,
                cut=cut,
            )
        except StoreUnavailable:
            return Kept(failed=True)
        except Exception:  # a store that breaks in a way of its own: as unavailable, but worth a trace
            structlog.get_logger("smartcache").exception("store.write_failed")
            return Kept(failed=True)
        return Kept(record)

    async def alias(
        self, original: Record, req: ChatRequest, who: Identity, plan: Plan, *, own: bool = False
    ) -> Record | None:
        """The judge said ``original`` answers this request: its wording becomes an alias of the
        record, under the same rule as an answer written back (nothing for ``no_store``). ``own``:
        the session was served another session's answer and keeps a copy of its own."""
        if plan.policy is None or plan.signature is None or req.controls.no_store:
            return None
        try:
            return await self.cache.alias(
                original,
                request=req,
                who=who,
                sig=plan.signature,
                policy=plan.policy,
                policy_version=self.policy_box.policy.version,
                own=own,
            )
        except Exception:  # a verdict is worth a record, never an error
            structlog.get_logger("smartcache").exception("store.alias_failed")
            return None


def record_vector(plan: Plan) -> np.ndarray | None:
    """The vector a record written back for ``plan`` is indexed by; None where none may be written."""
    return plan.signature.vector if plan.policy is not None and plan.signature is not None else None
