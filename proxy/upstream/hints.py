"""Prefix-cache hints per upstream engine flavour (pure functions, no IO).

No engine accepts "reuse this prefix" as an order. What works is keeping the prompt
byte-identical and append-only (so `messages` is never touched here) and steering each
conversation to the worker, or slot, that still holds its KV blocks:

- vllm:     `x-session-id` header for the production-stack router (`--routing-logic session
            --session-key x-session-id`) and vllm-router (`--policy consistent_hash`, whose first
            hash key it is); `cache_salt` per tenant, so one tenant's prefix blocks are never
            reused (or timed) by another. The salt is stable per tenant, never per
            request: a per-request salt would disable prefix caching altogether.
- sglang:   body `rid` = `<key>_t<turn>_r<n>` and header `x-smg-routing-key` = `<key>`. SGLang's
            model gateway (SMG, the former sglang router) strips a trailing `_r<digits>` retry
            suffix and `_t<digits>` turn suffix from `rid` to get the sticky routing key, so every
            turn pins to the same worker. `rid` must still be unique per request (SGLang tracks
            requests by it): two requests of one turn (a regenerate, a client retry, a prewarm
            beside the real call) differ in `n`, a number drawn per request unless the caller
            gives one. That draw is the one input here that is not the conversation's.
- llamacpp: `cache_prompt: true`; with `slot_count`, a stable `id_slot` per session. Do not
            pass `slot_count` for the embedded engine (proxy/engine.py): its own slot choice plus
            the RAM prompt cache keep more prefixes than pinned slots do (see the engine notes).
- openai:   `prompt_cache_key` = session id (OpenAI routes requests with one key together).
- generic:  nothing.

The session is the one the router keys on (proxy.upstream.routing). A value the client set itself
wins (its own routing scheme), except `cache_salt`: there the client's salt is folded into the
tenant's, so tenant isolation holds whatever the client sends.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

Flavour = Literal["vllm", "sglang", "llamacpp", "openai", "generic"]
FLAVOURS: tuple[Flavour, ...] = get_args(Flavour)

VLLM_SESSION_HEADER = "x-session-id"
SGLANG_ROUTING_HEADER = "x-smg-routing-key"
# SMG ignores routing keys over 128 bytes and strips lineage suffixes from keys; session ids
# that are too long or end like a suffix are hashed so the key SMG derives is always ours.
_MAX_ROUTING_KEY_BYTES = 128
_LINEAGE_SUFFIX = re.compile(r"_[tr][0-9]+$")


@dataclass(frozen=True, slots=True)
class HintContext:
    """What the hints may depend on: the conversation and its owner, never the request."""

    session_id: str
    tenant_id: str
    turn_index: int
    slot_count: int | None
    retry: int


def _digest(*parts: str) -> bytes:
    # Length-prefixed parts, so ("ab", "c") and ("a", "bc") never collide.
    hasher = hashlib.sha256(b"smartcache-hints-v1")
    for part in parts:
        data = part.encode("utf-8")
        hasher.update(len(data).to_bytes(8, "big") + data)
    return hasher.digest()


def tenant_cache_salt(tenant_id: str, client_salt: str | None = None) -> str:
    """vLLM `cache_salt`: a stable function of the tenant (and of the client's own salt)."""
    parts = (tenant_id,) if not client_salt else (tenant_id, client_salt)
    return _digest("cache_salt", *parts).hex()[:32]


def session_slot(session_id: str, slot_count: int) -> int:
    """llama.cpp `id_slot`: the same slot for every turn of a session."""
    if slot_count < 1:
        raise ValueError(f"slot_count must be >= 1, got {slot_count}")
    return int.from_bytes(_digest("id_slot", session_id)[:8], "big") % slot_count


def routing_key(session_id: str) -> str:
    """The session id when a router accepts it as a key, else a short stable hash of it."""
    fits = len(session_id.encode("utf-8")) <= _MAX_ROUTING_KEY_BYTES
    if fits and not _LINEAGE_SUFFIX.search(session_id):
        return session_id
    return "s" + _digest("routing_key", session_id).hex()[:40]


def sglang_rid(session_id: str, turn_index: int, retry: int = 0) -> str:
    """`<key>_t<turn>[_r<retry>]`, the lineage form SMG strips back to `<key>`."""
    rid = f"{routing_key(session_id)}_t{turn_index}"
    return f"{rid}_r{retry}" if retry else rid


def _has_header(headers: Mapping[str, str], name: str) -> bool:
    return any(key.lower() == name for key in headers)


def _vllm(body: dict[str, Any], headers: dict[str, str], ctx: HintContext) -> None:
    if not _has_header(headers, VLLM_SESSION_HEADER):
        headers[VLLM_SESSION_HEADER] = ctx.session_id
    client_salt = body.get("cache_salt")
    body["cache_salt"] = tenant_cache_salt(ctx.tenant_id, client_salt if isinstance(client_salt, str) else None)


def _sglang(body: dict[str, Any], headers: dict[str, str], ctx: HintContext) -> None:
    body.setdefault("rid", sglang_rid(ctx.session_id, ctx.turn_index, ctx.retry))
    if not _has_header(headers, SGLANG_ROUTING_HEADER):
        headers[SGLANG_ROUTING_HEADER] = routing_key(ctx.session_id)


def _llamacpp(body: dict[str, Any], headers: dict[str, str], ctx: HintContext) -> None:
    body.setdefault("cache_prompt", True)
    if ctx.slot_count is not None:
        body.setdefault("id_slot", session_slot(ctx.session_id, ctx.slot_count))


def _openai(body: dict[str, Any], headers: dict[str, str], ctx: HintContext) -> None:
    body.setdefault("prompt_cache_key", ctx.session_id)


def _generic(body: dict[str, Any], headers: dict[str, str], ctx: HintContext) -> None:
    return None


def as_flavour(name: str) -> Flavour:
    """``name`` as an upstream flavour; a ValueError naming the known ones if it is none."""
    if name not in FLAVOURS:
        raise ValueError(f"unknown upstream flavour {name!r}; expected one of {', '.join(FLAVOURS)}")
    return name


_HINTS: Mapping[Flavour, Callable[[dict[str, Any], dict[str, str], HintContext], None]] = {
    "vllm": _vllm,
    "sglang": _sglang,
    "llamacpp": _llamacpp,
    "openai": _openai,
    "generic": _generic,
}


def apply_hints(
    flavour: Flavour,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    *,
    session_id: str,
    tenant_id: str,
    turn_index: int,
    slot_count: int | None = None,
    retry: int | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """New (body, headers) carrying the flavour's prefix-cache hints; the inputs are untouched.

    The body copy is shallow: `messages` and every other value are the caller's own objects,
    unchanged, so the forwarded prompt stays byte-identical. `retry`: the number that tells
    this request from others of the same turn (SGLang's `_r<n>`; 0: none); None draws one, so
    request ids never repeat.
    """
    hint = _HINTS[as_flavour(flavour)]
    if not session_id:
        raise ValueError("session_id must not be empty")
    if retry is None:
        retry = 1 + secrets.randbelow(10**12)
    if turn_index < 0 or retry < 0:
        raise ValueError(f"turn_index and retry must be >= 0, got {turn_index} and {retry}")
    if slot_count is not None and slot_count < 1:
        raise ValueError(f"slot_count must be >= 1, got {slot_count}")
    new_body = dict(body)
    new_headers = dict(headers)
    hint(new_body, new_headers, HintContext(session_id, tenant_id, turn_index, slot_count, retry))
    return new_body, new_headers
