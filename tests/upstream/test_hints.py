"""The hints each upstream flavour gets (proxy/upstream/hints.py): session and tenant headers,
cache salts, SGLang request ids and routing keys."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from proxy.upstream.hints import (
    FLAVOURS,
    SGLANG_ROUTING_HEADER,
    VLLM_SESSION_HEADER,
    Flavour,
    apply_hints,
    routing_key,
    session_slot,
    sglang_rid,
    tenant_cache_salt,
)

SESSION = "sess-7f3a"
TENANT = "tenant-a"


def make_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Plan 3 days in Kyoto, budget 8000"},
        ],
        "stream": True,
        **extra,
    }


def hint(
    flavour: Flavour,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    **kwargs: Any,
) -> tuple[dict[str, Any], dict[str, str]]:
    params: dict[str, Any] = {"session_id": SESSION, "tenant_id": TENANT, "turn_index": 2, **kwargs}
    return apply_hints(flavour, body or make_body(), headers or {"authorization": "Bearer k"}, **params)


# flavour, kwargs, body fields added, headers added
CASES: list[tuple[Flavour, dict[str, Any], dict[str, Any], dict[str, str]]] = [
    ("vllm", {}, {"cache_salt": tenant_cache_salt(TENANT)}, {VLLM_SESSION_HEADER: SESSION}),
    ("sglang", {"retry": 0}, {"rid": f"{SESSION}_t2"}, {SGLANG_ROUTING_HEADER: SESSION}),
    ("sglang", {"retry": 1}, {"rid": f"{SESSION}_t2_r1"}, {SGLANG_ROUTING_HEADER: SESSION}),
    ("llamacpp", {}, {"cache_prompt": True}, {}),
    ("llamacpp", {"slot_count": 4}, {"cache_prompt": True, "id_slot": session_slot(SESSION, 4)}, {}),
    ("openai", {}, {"prompt_cache_key": SESSION}, {}),
    ("generic", {}, {}, {}),
]


@pytest.mark.parametrize(("flavour", "kwargs", "body_added", "headers_added"), CASES)
def test_each_flavour_adds_exactly_its_hints(
    flavour: Flavour, kwargs: dict[str, Any], body_added: dict[str, Any], headers_added: dict[str, str]
) -> None:
    body, headers = make_body(), {"authorization": "Bearer k"}
    new_body, new_headers = hint(flavour, body, headers, **kwargs)
    assert new_body == {**make_body(), **body_added}
    assert new_headers == {"authorization": "Bearer k", **headers_added}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_inputs_are_never_mutated_and_messages_are_the_same_objects(flavour: Flavour) -> None:
    body, headers = make_body(), {"authorization": "Bearer k"}
    body_before, headers_before = copy.deepcopy(body), dict(headers)
    new_body, new_headers = hint(flavour, body, headers, slot_count=3)
    assert body == body_before
    assert headers == headers_before
    assert new_body is not body
    assert new_headers is not headers
    # Same list object and unchanged content: the forwarded prompt stays byte-identical.
    assert new_body["messages"] is body["messages"]
    assert new_body["messages"] == body_before["messages"]


def test_cache_salt_is_stable_per_tenant_and_differs_between_tenants() -> None:
    first, _ = hint("vllm", turn_index=1)
    later, _ = hint("vllm", turn_index=9, session_id="another-session")
    other_tenant, _ = hint("vllm", tenant_id="tenant-b")
    assert first["cache_salt"] == later["cache_salt"]
    assert first["cache_salt"] != other_tenant["cache_salt"]
    assert re.fullmatch(r"[0-9a-f]{32}", first["cache_salt"])


def test_client_cache_salt_cannot_escape_the_tenant() -> None:
    a, _ = hint("vllm", make_body(cache_salt="shared"), tenant_id="tenant-a")
    b, _ = hint("vllm", make_body(cache_salt="shared"), tenant_id="tenant-b")
    plain, _ = hint("vllm", tenant_id="tenant-a")
    assert a["cache_salt"] != b["cache_salt"]
    assert a["cache_salt"] not in {"shared", plain["cache_salt"]}


@pytest.mark.parametrize(
    ("flavour", "body_extra", "headers", "field", "kept"),
    [
        ("vllm", {}, {"X-Session-Id": "client"}, None, None),
        ("sglang", {"rid": "client-rid"}, {}, "rid", "client-rid"),
        ("sglang", {}, {"X-SMG-Routing-Key": "client"}, None, None),
        ("llamacpp", {"cache_prompt": False}, {}, "cache_prompt", False),
        ("llamacpp", {"id_slot": 0}, {}, "id_slot", 0),
        ("openai", {"prompt_cache_key": "client-key"}, {}, "prompt_cache_key", "client-key"),
    ],
)
def test_client_values_win(
    flavour: Flavour, body_extra: dict[str, Any], headers: dict[str, str], field: str | None, kept: Any
) -> None:
    new_body, new_headers = hint(flavour, make_body(**body_extra), dict(headers), slot_count=4)
    if field is not None:
        assert new_body[field] == kept
    # A header the client set (any case) is neither overwritten nor duplicated.
    for name, value in headers.items():
        assert new_headers[name] == value
        assert [k for k in new_headers if k.lower() == name.lower()] == [name]


def test_sglang_turns_share_one_routing_key_and_differ_in_rid() -> None:
    rids = {hint("sglang", turn_index=t)[0]["rid"] for t in range(4)}
    assert len(rids) == 4
    # SMG's lineage rule: strip one `_r<n>`, then one `_t<n>`, at the end.
    keys = {re.sub(r"_t[0-9]+$", "", re.sub(r"_r[0-9]+$", "", rid)) for rid in rids}
    assert keys == {SESSION}


@pytest.mark.parametrize("session_id", ["x" * 300, "chat_t7", "chat_r2"])
def test_routing_key_is_hashed_when_smg_would_not_keep_it(session_id: str) -> None:
    key = routing_key(session_id)
    assert key != session_id
    assert len(key.encode()) <= 128
    assert not re.search(r"_[tr][0-9]+$", key)
    assert routing_key(session_id) == key
    assert sglang_rid(session_id, 3) == f"{key}_t3"


def test_session_slot_is_stable_in_range_and_spreads_sessions() -> None:
    slots = [session_slot(f"session-{i}", 4) for i in range(400)]
    assert all(0 <= s < 4 for s in slots)
    assert [session_slot(f"session-{i}", 4) for i in range(400)] == slots
    counts = [slots.count(s) for s in range(4)]
    assert min(counts) > 60  # 100 expected per slot; a constant or skewed hash fails


@pytest.mark.parametrize(
    "kwargs",
    [
        {"session_id": ""},
        {"turn_index": -1},
        {"slot_count": 0},
        {"retry": -1},
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        hint("llamacpp", **kwargs)


def test_unknown_flavour_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown upstream flavour"):
        apply_hints("tgi", make_body(), {}, session_id=SESSION, tenant_id=TENANT, turn_index=0)  # type: ignore[arg-type]


# SGLang request ids: distinct for every request, even two of the same turn (a regenerate, a
# client retry, a prewarm beside the real call), while the routing key SMG derives from them stays
# the session's, so every request of a conversation still lands on the worker holding its KV.
BODY = {"model": "m", "messages": [{"role": "user", "content": "Plan 3 days in Kyoto"}]}


def _rid_and_header(session: str, turn: int) -> tuple[str, str]:
    body, headers = apply_hints("sglang", BODY, {}, session_id=session, tenant_id="t", turn_index=turn)
    return body["rid"], headers[SGLANG_ROUTING_HEADER]


def _smg_key(rid: str) -> str:
    """SMG's lineage rule: a trailing _r<digits> retry suffix, then a _t<digits> turn suffix."""
    return re.sub(r"_t[0-9]+$", "", re.sub(r"_r[0-9]+$", "", rid))


def test_requests_of_one_turn_get_distinct_rids() -> None:
    rids = {_rid_and_header("sess-1", 3)[0] for _ in range(50)}
    assert len(rids) == 50


def test_every_rid_of_a_session_routes_by_the_session_key() -> None:
    for session in ("sess-1", "x" * 300, "chat_t7"):
        pairs = [_rid_and_header(session, turn) for turn in (1, 1, 2, 5)]
        assert {_smg_key(rid) for rid, _ in pairs} == {routing_key(session)}
        assert {header for _, header in pairs} == {routing_key(session)}


def test_an_explicit_request_number_is_deterministic() -> None:
    body, _ = apply_hints("sglang", BODY, {}, session_id="s", tenant_id="t", turn_index=2, retry=0)
    assert body["rid"] == "s_t2"
    body, _ = apply_hints("sglang", BODY, {}, session_id="s", tenant_id="t", turn_index=2, retry=7)
    assert body["rid"] == "s_t2_r7"


def test_a_client_rid_still_wins() -> None:
    body, _ = apply_hints("sglang", {**BODY, "rid": "mine"}, {}, session_id="s", tenant_id="t", turn_index=2)
    assert body["rid"] == "mine"
