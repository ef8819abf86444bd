"""Warm-up: bulk-sign past conversations and write them as ready records.

A warmed record must be one a real request can reach, so it is keyed exactly as the proxy keys a
live request: the tenant is the hash of an API key (``api_key``, else each conversation's
``tenant`` taken as its API key, as the replay harness sends it), the model is the one clients
will name, and the session is the one the proxy derives for a client that sends no session header
(``keep_sessions``: the trace's own ids, for clients that send them as x-smartcache-session).
Intents the policy widens reach every conversation of the tenant anyway. What is kept is what the
proxy keeps of a request answered without a lookup (``proxy.service.planner.unlooked``, through
``proxy.service.writeback.WriteBack``): no answer of an intent never cached, the answer of a turn that
left its topic as the proxy keys it.

Idempotent and so resumable: a turn whose exact request is already stored for that session is
skipped. Conversations are signed concurrently, so the embedder micro-batches them.

Warm-up holds the data dir's lock, as a proxy does (proxy.service.datadir.data_dir_lock): a proxy running
from that directory keeps its vector index in memory, so records written beside it would never be
served by it, and its index snapshot at shutdown would drop them. Warm-up refuses to start there,
and a proxy refuses to start while warm-up runs. With the Redis store, warm with a data dir of
its own: the replicas' change feed brings them the records."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from proxy.core.conversation import request_hash
from proxy.core.identity import Identity, clean_header_id, derived_session, tenant_of
from proxy.core.model import SessionLast
from proxy.core.openai.request import ChatRequest, parse_chat_request
from proxy.observability.metrics import Metrics
from proxy.service.compose import NOWHERE, Parts, open_parts
from proxy.service.datadir import data_dir_lock, tenant_salt
from proxy.service.planner import unlooked
from proxy.settings import Settings
from proxy.storage.base import Selector, StoreUnavailable
from proxy.tools.datasets.traces import Conversation

WARM_ADVICE = (
    "a running proxy would never serve records warmed beside it (its index is in memory) and would "
    "drop them at shutdown. Stop the proxy, warm, then start it again; with the Redis store "
    "(store: redis), warm with a --data-dir of its own instead: the replicas pick the records up"
)


@dataclass(frozen=True, slots=True)
class WarmTarget:
    """Who the warmed records are for: what live requests will carry."""

    model: str
    api_key: str | None = None  # None: each conversation's tenant is its API key
    keep_sessions: bool = False  # True: the trace's session ids, as explicit session headers


def identity_for(conv: Conversation, req: ChatRequest, target: WarmTarget, *, salt: str) -> Identity:
    """The identity a live request of this conversation would get from proxy.core.identity.identify."""
    tenant = tenant_of(f"Bearer {target.api_key or conv.tenant}", salt=salt)
    if target.keep_sessions:
        session = clean_header_id(conv.session, "session") or derived_session(tenant, req)
        return Identity(tenant=tenant, session=session, user=None, session_explicit=True)
    return Identity(tenant=tenant, session=derived_session(tenant, req), user=None, session_explicit=False)


async def _warm_one(parts: Parts, conv: Conversation, target: WarmTarget, salt: str) -> tuple[int, int]:
    written = skipped = 0
    history: list[dict[str, str]] = [{"role": "system", "content": conv.system}] if conv.system else []
    who: Identity | None = None  # fixed by the opening turn, as the derived session is
    noted = False
    for turn in conv.turns:
        msgs = [*history, {"role": "user", "content": turn.user}]
        req = parse_chat_request(orjson.dumps({"model": target.model, "messages": msgs}))
        who = who or identity_for(conv, req, target, salt=salt)
        if turn.answer:
            selector = Selector(tenant=who.tenant, session=who.session, request_hash=request_hash(req))
            if await parts.cache.store.find(selector, limit=1):
                skipped += 1
            else:
                # the past turn's answer is kept by the proxy's own rule, as a request answered
                # without a lookup would have it kept
                sig = await parts.signer.sign(req)
                plan = unlooked(sig, parts.policy_box.policy.for_intent(sig.tags.intent))
                kept = await parts.write_back.keep(req, who, plan, turn.answer, {})
                if kept.failed:  # a warm-up that reported records it never wrote would be believed
                    raise StoreUnavailable(f"the store refused a warmed answer of conversation {conv.id}")
                if kept.record is not None:
                    written += 1
                noted = True
        history = [*msgs, {"role": "assistant", "content": turn.answer or ""}]
    if who is not None and noted:
        # keeping made each answer its session's last: a client then asking the same question
        # would look like a regenerate of it. A warmed session has no last answer of its own.
        await parts.cache.store.set_session_last(who.tenant, who.session, SessionLast("", False, ""))
    return written, skipped


async def warm(
    convs: Sequence[Conversation], settings: Settings, *, target: WarmTarget, concurrency: int = 16
) -> tuple[int, int]:
    s = settings.replace(ready_after=0.0)  # warmed answers are past their feedback window already
    with data_dir_lock(s.data_dir, advice=WARM_ADVICE):
        return await _warm_all(convs, s, target=target, concurrency=concurrency)


async def _warm_all(
    convs: Sequence[Conversation], s: Settings, *, target: WarmTarget, concurrency: int
) -> tuple[int, int]:
    async with open_parts(s, upstream_url=NOWHERE, metrics=Metrics()) as parts:
        # the store's salt, as the proxy's: with Redis, the one every replica keys tenants by
        salt = await parts.cache.store.tenant_salt(tenant_salt(s.data_dir))
        gate = asyncio.Semaphore(concurrency)

        async def one(conv: Conversation) -> tuple[int, int]:
            async with gate:
                return await _warm_one(parts, conv, target, salt)

        results = await asyncio.gather(*(one(c) for c in convs))
    return sum(w for w, _ in results), sum(k for _, k in results)
