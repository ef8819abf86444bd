"""SGLang request ids: distinct for every request, even two of the same turn (a regenerate, a
client retry, a prewarm beside the real call), while the routing key SMG derives from them stays
the session's, so every request of a conversation still lands on the worker holding its KV."""

from __future__ import annotations

import re

from proxy.upstream.hints import SGLANG_ROUTING_HEADER, apply_hints, routing_key

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
