"""Warm-up: bulk-sign past conversations and write them as ready records.

Idempotent and so resumable: a turn whose exact request is already stored for that session is
skipped. Conversations are signed concurrently, so the embedder micro-batches them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

from proxy.identity import Identity
from proxy.observability.metrics import Metrics
from proxy.openai.request import parse_chat_request
from proxy.parts import NOWHERE, Parts, open_parts
from proxy.settings import Settings
from proxy.signing.signer import request_hash
from proxy.storage.base import Selector
from proxy.tools.datasets.traces import Conversation


async def _warm_one(parts: Parts, conv: Conversation, model: str) -> tuple[int, int]:
    written = skipped = 0
    history: list[dict[str, str]] = [{"role": "system", "content": conv.system}] if conv.system else []
    who = Identity(tenant=conv.tenant, session=conv.session, user=None, session_explicit=True)
    for turn in conv.turns:
        msgs = [*history, {"role": "user", "content": turn.user}]
        if turn.answer:
            req = parse_chat_request(orjson.dumps({"model": model, "messages": msgs}))
            selector = Selector(tenant=conv.tenant, session=conv.session, request_hash=request_hash(req))
            if await parts.cache.store.find(selector, limit=1):
                skipped += 1
            else:
                sig = await parts.signer.sign(req)
                policy = parts.policy_box.policy.for_intent(sig.tags.intent)
                if policy.cache and not sig.tags.context_switch:
                    await parts.cache.write(
                        request=req,
                        who=who,
                        sig=sig,
                        policy=policy,
                        policy_version=parts.policy_box.policy.version,
                        answer=turn.answer,
                        usage={},
                    )
                    written += 1
        history = [*msgs, {"role": "assistant", "content": turn.answer or ""}]
    return written, skipped


async def warm(
    convs: Sequence[Conversation], settings: Settings, *, model: str = "default", concurrency: int = 16
) -> tuple[int, int]:
    s = settings.replace(ready_after=0.0)  # warmed answers are past their feedback window already
    async with open_parts(s, upstream_url=NOWHERE, metrics=Metrics()) as parts:
        gate = asyncio.Semaphore(concurrency)

        async def one(conv: Conversation) -> tuple[int, int]:
            async with gate:
                return await _warm_one(parts, conv, model)

        results = await asyncio.gather(*(one(c) for c in convs))
    return sum(w for w, _ in results), sum(k for _, k in results)
