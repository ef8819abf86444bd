"""The admin API, behind ``Authorization: Bearer $SMARTCACHE_ADMIN_TOKEN``, and the one route a
client calls with its own API key: feedback on its tenant's own records.

With no token configured the admin routes answer 404, as if they did not exist. Invalidation is a
dry run unless the body says ``"apply": true``; a tenant purge is not, since it is what a revoked
key calls for at once. The tenant's feedback route (``TENANT_FEEDBACK``) needs no admin token: its
tenant is the hash of the caller's key (proxy/core/identity.py), and a record of any other tenant is
answered as one that does not exist.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from aiohttp import web

from proxy.core.errors import InvalidRequest, NotFound, Unauthorized
from proxy.core.identity import ANONYMOUS, caller_tenant, key_tenant, tenant_parts
from proxy.core.model import RecordState
from proxy.core.policy import PolicyError
from proxy.http import keys
from proxy.service.compose import load_policy_for
from proxy.service.feedback import THUMBS, thumb
from proxy.service.indexing import policy_changed
from proxy.signing.intent import IntentClassifier
from proxy.storage.base import Selector

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# under /v1, where clients already send their key; matched before the /v1 passthrough (aiohttp
# resolves an exact path before a pattern, whatever the order routes were added in)
TENANT_FEEDBACK = "/v1/smartcache/feedback"
# the invalidation body's keys, each a field of the store's Selector; nothing else selects records
SELECTORS = (
    "system_prompt_version",
    "policy_version",
    "intent",
    "tenant",
    "session",
    "context_fingerprint",
    "model",
    "cache_id",
)


def _selector(chosen: dict[str, str]) -> Selector:
    return Selector(
        system_prompt_version=chosen.get("system_prompt_version"),
        policy_version=chosen.get("policy_version"),
        intent=chosen.get("intent"),
        tenant=chosen.get("tenant"),
        session=chosen.get("session"),
        context_fingerprint=chosen.get("context_fingerprint"),
        model=chosen.get("model"),
        cache_ids=(chosen["cache_id"],) if "cache_id" in chosen else None,
    )


def guarded(handler: Handler) -> Handler:
    async def wrapper(request: web.Request) -> web.StreamResponse:
        token = request.app[keys.SETTINGS].admin_token
        if not token:
            raise NotFound(f"no route {request.method} {request.path}")
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise Unauthorized("admin routes need Authorization: Bearer <SMARTCACHE_ADMIN_TOKEN>")
        # every answer already given is in what the route reads or changes (proxy.service.settling)
        await request.app[keys.CHAT].settling.everything()
        return await handler(request)

    return wrapper


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("body must be a JSON object")
    return body


async def stats(request: web.Request) -> web.Response:
    cache = request.app[keys.CACHE]
    by_state: dict[str, int] = {}
    by_scope: dict[str, int] = {}
    by_intent: dict[str, int] = {}
    for state, scope, intent, n in await cache.store.counts():
        by_state[state] = by_state.get(state, 0) + n
        by_scope[scope] = by_scope.get(scope, 0) + n
        by_intent[intent] = by_intent.get(intent, 0) + n
    return web.json_response(
        {
            "records": {"by_state": by_state, "by_scope": by_scope, "by_intent": by_intent},
            "index_size": len(cache.index),
            "index_deleted_fraction": round(cache.index.deleted_fraction, 4),
            "answer_bytes": await cache.store.answer_bytes(),
            "policy_version": request.app[keys.POLICY_BOX].policy.version,
            "embedder_model_calls": request.app[keys.EMBEDDER].model_calls,
            "judge": _judge_stats(request),
        }
    )


def _judge_stats(request: web.Request) -> dict[str, object] | None:
    judging = request.app[keys.CHAT].judging
    if judging is None:
        return None
    counts = judging.judge.counts
    return {
        "models": judging.qualification.standings(),
        "calls": {"yes": counts.yes, "no": counts.no, "failed": counts.failed, "skipped": counts.skipped},
        "tokens": {"prompt": counts.prompt_tokens, "completion": counts.completion_tokens},
        "decided": dict(judging.decided),
    }


async def list_records(request: web.Request) -> web.Response:
    q = request.query
    try:
        limit = min(max(int(q.get("limit", "50")), 1), 1000)
    except ValueError as exc:
        raise InvalidRequest("limit must be an integer", param="limit") from exc
    state = q.get("state")
    if state and state not in set(RecordState):
        return web.json_response({"records": []})  # no record is in a state that does not exist
    selector = Selector(
        session=q.get("session") or None,
        intent=q.get("intent") or None,
        tenant=q.get("tenant") or None,
        states=(RecordState(state),) if state else None,
    )
    records = await request.app[keys.CACHE].store.find(selector, limit=limit)
    with_answer = q.get("include_answer") == "true"
    out = []
    for r in records:
        item = {
            k: getattr(r, k)
            for k in (
                "cache_id",
                "tenant",
                "user",
                "scope",
                "session",
                "intent",
                "state",
                "model",
                "system_prompt_version",
                "policy_version",
                "created_at",
                "expires_at",
                "hit_count",
                "feedback_score",
                "prompt_tokens",
                "completion_tokens",
            )
        }
        item["coarse_tags"] = r.coarse_tags.to_json()
        if with_answer:
            item["answer_text"] = r.answer_text
        out.append(item)
    return web.json_response({"records": out})


async def delete_record(request: web.Request) -> web.Response:
    cache = request.app[keys.CACHE]
    cache_id = request.match_info["cache_id"]
    if not await cache.retire(Selector(cache_ids=(cache_id,), states=None), to=None):
        raise NotFound("no such record")
    return web.json_response({"deleted": cache_id})


async def invalidate(request: web.Request) -> web.Response:
    body = await _json_body(request)
    unknown = set(body) - set(SELECTORS) - {"apply"}
    if unknown:
        raise InvalidRequest(f"unknown selector(s) {sorted(unknown)}; known: {sorted(SELECTORS)}")
    chosen = {k: v for k, v in body.items() if k in SELECTORS}
    if not chosen:
        raise InvalidRequest(f"name at least one selector of {sorted(SELECTORS)}")
    if any(not isinstance(v, str) for v in chosen.values()):
        raise InvalidRequest("selector values must be strings")
    cache = request.app[keys.CACHE]
    selector = _selector(chosen)
    applied = body.get("apply") is True
    matched = await (cache.retire(selector) if applied else cache.store.refs(selector))
    return web.json_response({"matched": len(matched), "applied": applied})


def _tenant_named(body: dict[str, Any], salt: str) -> str:
    """A tenant named by its API key (the tenant id is the key's salted hash, which only this
    installation can compute) or by the id /admin/records shows."""
    api_key, tenant = body.get("api_key"), body.get("tenant")
    if (api_key is None) == (tenant is None) or set(body) - {"api_key", "tenant"}:
        raise InvalidRequest("name the tenant by exactly one of 'api_key' (the revoked key) or 'tenant' (its id)")
    if api_key is not None:
        if not isinstance(api_key, str) or not api_key.strip():
            raise InvalidRequest("'api_key' must be a non-empty string", param="api_key")
        return key_tenant(api_key, salt=salt)
    if not isinstance(tenant, str) or not tenant:
        raise InvalidRequest("'tenant' must be a tenant id such as t-…", param="tenant")
    return tenant


def _tenants_holding(named: str, live: Iterable[str]) -> list[str]:
    """The named tenant and every live one its key is part of: a caller that sent the key beside
    another (proxy/core/identity.py) is the tenant of both, and a revoked key must leave it too."""
    parts = tenant_parts(named)
    return [named, *sorted({t for t in live if t != named and parts and parts <= tenant_parts(t)})]


async def purge_tenant(request: web.Request) -> web.Response:
    """Every record of one tenant deleted, whatever its state: the rejected and invalid ones kept
    for audit hold that tenant's answers too. The tenants of several keys the named key is part of
    are found among those with a live record (the index's pools) and deleted whole as well."""
    named = _tenant_named(await _json_body(request), request.app[keys.TENANT_SALT])
    cache = request.app[keys.CACHE]
    tenants = _tenants_holding(named, {tenant for tenant, _ in cache.pools.sessions})
    purged = 0
    chains = request.app[keys.STORE].chains
    for tenant in tenants:
        purged += len(await cache.retire(Selector(tenant=tenant, states=None), to=None))
        await chains.forget(tenant)  # the conversations its Responses follow-ups would continue
    await cache.store.scrub()
    return web.json_response({"tenant": named, "purged": purged, "tenants": tenants})


async def reset_session(request: web.Request) -> web.Response:
    body = await _json_body(request)
    tenant = body.get("tenant")
    if not isinstance(tenant, str):
        raise InvalidRequest("body needs 'tenant' (the tenant id from /admin/records)", param="tenant")
    n = await request.app[keys.CACHE].invalidate_session(tenant, request.match_info["session"])
    return web.json_response({"invalidated": n})


def _named_record(body: dict[str, Any], response_of: Callable[[str], str | None]) -> str | None:
    """The record the feedback is about: its ``cache_id`` (the ``x-cache-id`` header a hit carries)
    or the ``response_id`` (the completion id) the client received."""
    cache_id, response_id = body.get("cache_id"), body.get("response_id")
    if cache_id is not None and (not isinstance(cache_id, str) or not cache_id):
        raise InvalidRequest("'cache_id' must be the x-cache-id a response carried", param="cache_id")
    if response_id is not None and not isinstance(response_id, str):
        raise InvalidRequest("'response_id' must be the id of a chat completion", param="response_id")
    return cache_id or (response_of(response_id) if response_id else None)


async def _record_feedback(request: web.Request, *, tenant: str | None) -> web.Response:
    """A thumb on one record; ``tenant``: the caller may only touch that tenant's records (None:
    the admin, any record). Another tenant's record is answered as a missing one: nothing says it
    exists."""
    body = await _json_body(request)
    kind = body.get("feedback")
    if kind not in THUMBS:
        raise InvalidRequest("'feedback' must be positive, negative or regenerate", param="feedback")
    cache_id = _named_record(body, request.app[keys.CHAT].responses.get)
    cache = request.app[keys.CACHE]
    record = await cache.store.get(cache_id) if cache_id else None
    if record is None or (tenant is not None and record.tenant != tenant):
        raise NotFound("no record for that cache_id or response_id")
    await thumb(cache, record.cache_id, kind)
    updated = await cache.store.get(record.cache_id)
    return web.json_response(
        {
            "cache_id": record.cache_id,
            "state": updated.state if updated else None,
            "feedback_score": updated.feedback_score if updated else None,
        }
    )


async def feedback(request: web.Request) -> web.Response:
    return await _record_feedback(request, tenant=None)


def _caller_tenant(request: web.Request) -> str:
    """The tenant of the key the client sends, as its chat requests are keyed (proxy/core/identity.py);
    no credential is refused: the anonymous tenant is everyone without a key."""
    tenant = caller_tenant(request.headers, salt=request.app[keys.TENANT_SALT], query=tuple(request.query.items()))
    if tenant == ANONYMOUS:
        raise Unauthorized("feedback needs the API key the answer was asked with: Authorization: Bearer <key>")
    return tenant


async def tenant_feedback(request: web.Request) -> web.Response:
    """POST /v1/smartcache/feedback with the client's own key: a thumb on a record of its tenant."""
    tenant = _caller_tenant(request)
    # the answer just received may still be being written (proxy.service.settling): its id names it then
    await request.app[keys.CHAT].settling.everything()
    return await _record_feedback(request, tenant=tenant)


async def reload_policy(app: web.Application) -> dict[str, Any]:
    """Load, build, then swap: a bad file leaves the running policy in force."""
    settings = app[keys.SETTINGS]
    box = app[keys.POLICY_BOX]
    policy = await asyncio.to_thread(load_policy_for, settings)
    classifier = await IntentClassifier.build(policy, app[keys.EMBEDDER])
    old_version = box.policy.version
    box.policy, box.classifier = policy, classifier
    app[keys.SIGNER].classifier = classifier
    invalidated = 0
    if policy.version != old_version:
        cache = app[keys.CACHE]
        invalidated = await policy_changed(app[keys.STORE].shared, cache, policy.version)
    return {"version": policy.version, "previous": old_version, "invalidated": invalidated}


async def reload_policy_route(request: web.Request) -> web.Response:
    try:
        result = await reload_policy(request.app)
    except PolicyError as exc:
        raise InvalidRequest(f"policy not reloaded, the running one stays: {exc}") from exc
    return web.json_response(result)


def add_admin_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/stats", guarded(stats))
    r.add_get("/admin/records", guarded(list_records))
    r.add_delete("/admin/records/{cache_id}", guarded(delete_record))
    r.add_post("/admin/invalidate", guarded(invalidate))
    r.add_post("/admin/sessions/{session}/reset", guarded(reset_session))
    r.add_post("/admin/tenants/purge", guarded(purge_tenant))
    r.add_post("/admin/feedback", guarded(feedback))
    r.add_post(TENANT_FEEDBACK, tenant_feedback)
    r.add_post("/admin/policy/reload", guarded(reload_policy_route))
