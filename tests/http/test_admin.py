"""The admin API through the real proxy: its guard (404 without a configured token, 401 for a
missing or wrong one), stats, record listing, deletes, session resets and feedback."""

from __future__ import annotations

import pytest

from proxy.core.identity import tenant_of
from proxy.http import keys
from tests.conftest import Proxy, ProxyFactory
from tests.e2e.test_lifecycle import QUESTIONS, TOKEN, Clients, admin, ask, client, fill, live_records, record_with

__all__ = ["client"]  # the fixture, imported so this module can use it

ROUTES = [
    ("GET", "/admin/stats", None),
    ("GET", "/admin/records", None),
    ("DELETE", "/admin/records/sc-anything", None),
    ("POST", "/admin/invalidate", {"intent": "general", "apply": True}),
    ("POST", "/admin/sessions/s-1/reset", {"tenant": "anonymous"}),
    ("POST", "/admin/feedback", {"cache_id": "sc-anything", "feedback": "negative"}),
    ("POST", "/admin/policy/reload", None),
]
WRONG = [
    None,
    "Bearer wrong",
    f"Bearer {TOKEN.upper()}",
    TOKEN,
    f"Basic {TOKEN}",
    f"Bearer {TOKEN}x",
    f"Bearer {TOKEN[:-1]}",
    "Bearer key-A",
    f"Bearer {TOKEN}\u00e9",
    "Bearer ",
]


def tenant(proxy: Proxy, api_key: str) -> str:
    return tenant_of(f"Bearer {api_key}", salt=proxy.app[keys.TENANT_SALT])


async def test_admin_routes_do_not_exist_without_a_token(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    _, unknown = await admin(proxy, "GET", "/admin/no-such-route")
    for method, path, body in ROUTES:
        for authorization in (None, f"Bearer {TOKEN}", "Bearer "):
            status, payload = await admin(proxy, method, path, json=body, authorization=authorization)
            assert status == 404 and payload["error"]["type"] == unknown["error"]["type"], (method, path)


async def test_admin_routes_refuse_a_missing_or_wrong_token(make_proxy: ProxyFactory, client: Clients) -> None:
    proxy = await make_proxy(admin_token=TOKEN)
    (answer,) = await fill(proxy, client(proxy, session="guarded"), QUESTIONS[:1])
    record = await record_with(proxy, answer)
    routes = [
        *ROUTES,
        ("DELETE", f"/admin/records/{record.cache_id}", None),
        ("POST", "/admin/feedback", {"cache_id": record.cache_id, "feedback": "negative"}),
        ("POST", "/admin/sessions/guarded/reset", {"tenant": record.tenant}),
    ]
    for method, path, body in routes:
        for authorization in WRONG:
            status, payload = await admin(proxy, method, path, json=body, authorization=authorization)
            assert status == 401, (method, path, authorization)
            assert set(payload["error"]) == {"message", "type", "param", "code"}
    after = await proxy.app[keys.CACHE].store.get(record.cache_id)
    assert after is not None and (after.state, after.feedback_score) == ("ready", 1.0)  # nothing was touched
    assert (await admin(proxy, "GET", "/admin/stats"))[0] == 200


async def test_stats_and_records(make_proxy: ProxyFactory, client: Clients) -> None:
    proxy = await make_proxy(admin_token=TOKEN)
    a1 = await fill(proxy, client(proxy, session="st-1"), QUESTIONS[:2])
    a2 = await fill(proxy, client(proxy, session="st-2"), QUESTIONS[2:3])
    a3 = await fill(proxy, client(proxy, "key-B", session="st-1"), QUESTIONS[3:4])
    records = await live_records(proxy)
    status, stats = await admin(proxy, "GET", "/admin/stats")
    assert status == 200
    intents: dict[str, int] = {}
    scopes: dict[str, int] = {}
    for r in records:
        intents[r.intent] = intents.get(r.intent, 0) + 1
        scopes[r.scope] = scopes.get(r.scope, 0) + 1
    assert stats["records"] == {"by_state": {"ready": 4}, "by_scope": scopes, "by_intent": intents}
    assert stats["index_size"] == 4 and stats["index_deleted_fraction"] == 0
    assert stats["answer_bytes"] == sum(len(a.encode()) for a in a1 + a2 + a3)
    assert stats["policy_version"] == proxy.app[keys.POLICY_BOX].policy.version

    status, listed = await admin(proxy, "GET", "/admin/records?session=st-1")
    assert status == 200
    assert {r["tenant"] for r in listed["records"]} == {tenant(proxy, "key-A"), tenant(proxy, "key-B")}
    assert all("answer_text" not in r for r in listed["records"]) and len(listed["records"]) == 3
    assert "key-A" not in str(listed) and "key-B" not in str(listed)  # tenants are salted hashes
    query = f"/admin/records?session=st-1&tenant={tenant(proxy, 'key-A')}&include_answer=true"
    _, mine = await admin(proxy, "GET", query)
    assert sorted(r["answer_text"] for r in mine["records"]) == sorted(a1)
    _, newest = await admin(proxy, "GET", "/admin/records?limit=1&include_answer=true")
    assert [r["answer_text"] for r in newest["records"]] == a3
    _, by_intent = await admin(proxy, "GET", f"/admin/records?intent={records[0].intent}")
    assert len(by_intent["records"]) == intents[records[0].intent]
    status, bad = await admin(proxy, "GET", "/admin/records?limit=many")
    assert status == 400 and bad["error"]["param"] == "limit"


async def test_delete_and_session_reset(make_proxy: ProxyFactory, client: Clients) -> None:
    proxy = await make_proxy(admin_token=TOKEN)
    one, two = client(proxy, session="del-1"), client(proxy, session="del-2")
    a1 = await fill(proxy, one, QUESTIONS[:2])
    a2 = await fill(proxy, two, QUESTIONS[2:4])
    cache = proxy.app[keys.CACHE]
    doomed = await record_with(proxy, a1[0])
    assert await admin(proxy, "DELETE", f"/admin/records/{doomed.cache_id}") == (200, {"deleted": doomed.cache_id})
    assert await cache.store.get(doomed.cache_id) is None and len(cache.index) == 3
    status, _ = await ask(one, QUESTIONS[0].lower())
    assert status == "miss"
    status, body = await admin(proxy, "DELETE", f"/admin/records/{doomed.cache_id}")
    assert status == 404

    # a session id alone names no session: the tenant must match too
    other = {"tenant": tenant(proxy, "key-B")}
    assert await admin(proxy, "POST", "/admin/sessions/del-2/reset", json=other) == (200, {"invalidated": 0})
    assert await ask(two, QUESTIONS[2].lower()) == ("hit", a2[0])
    mine = {"tenant": tenant(proxy, "key-A")}
    assert await admin(proxy, "POST", "/admin/sessions/del-2/reset", json=mine) == (200, {"invalidated": 2})
    for q, a in zip(QUESTIONS[2:4], a2, strict=True):
        status, text = await ask(two, q.upper())
        assert status == "miss" and text != a
    assert await ask(one, QUESTIONS[1].lower()) == ("hit", a1[1])  # the other session is untouched
    status, body = await admin(proxy, "POST", "/admin/sessions/del-2/reset", json={})
    assert status == 400 and body["error"]["param"] == "tenant"


async def test_feedback(make_proxy: ProxyFactory, client: Clients) -> None:
    proxy = await make_proxy(admin_token=TOKEN)
    chat = client(proxy, session="fb")
    cache = proxy.app[keys.CACHE]
    answers = await fill(proxy, chat, QUESTIONS[:2])
    target = await record_with(proxy, answers[0])

    async def feedback(body: dict[str, str]) -> tuple[int, dict[str, object]]:
        return await admin(proxy, "POST", "/admin/feedback", json=body)

    assert await feedback({"cache_id": target.cache_id, "feedback": "negative"}) == (
        200,
        {"cache_id": target.cache_id, "state": "ready", "feedback_score": pytest.approx(0.4)},
    )
    status, _ = await ask(chat, QUESTIONS[0].lower())
    assert status == "miss"  # below the feedback floor: no longer served
    for expected in (0.5, 0.6):
        _, body = await feedback({"cache_id": target.cache_id, "feedback": "positive"})
        assert body["feedback_score"] == pytest.approx(expected)
    assert await ask(chat, QUESTIONS[0].upper()) == ("hit", answers[0])

    # by the completion id the client saw; a regenerate counts against the answer
    raw = await chat.chat.completions.with_raw_response.create(
        model="m",
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": QUESTIONS[2]},
        ],
    )
    response_id, fresh = raw.parse().id, raw.parse().choices[0].message.content
    _, body = await feedback({"response_id": response_id, "feedback": "regenerate"})
    assert body["cache_id"] == (await cache.store.get(str(body["cache_id"]))).cache_id
    assert (await cache.store.get(str(body["cache_id"]))).answer_text == fresh
    assert body["feedback_score"] == pytest.approx(0.4)

    # a pending answer that gets negative feedback is rejected outright and leaves the index
    cache.ready_after = 30.0
    (pending_answer,) = await fill(proxy, chat, QUESTIONS[3:4])
    pending = await record_with(proxy, pending_answer)
    assert pending.state == "pending" and pending.label in cache.keys
    _, body = await feedback({"cache_id": pending.cache_id, "feedback": "negative"})
    assert body["state"] == "rejected" and pending.label not in cache.keys

    for bad, code in (
        ({"cache_id": "sc-nope", "feedback": "positive"}, 404),
        ({"cache_id": "sc-nope", "feedback": "negative"}, 404),
        ({"response_id": "chatcmpl-nope", "feedback": "negative"}, 404),
        ({"cache_id": target.cache_id, "feedback": "meh"}, 400),
    ):
        status, _ = await feedback(bad)
        assert status == code, bad


TENANT_FEEDBACK = "/v1/smartcache/feedback"


async def test_a_tenant_sends_feedback_on_its_own_records_with_its_own_key(
    make_proxy: ProxyFactory, client: Clients
) -> None:
    """Issue 38.7: feedback needed the global admin token. A client says 'that answer was wrong'
    with its own key, by the x-cache-id or the completion id it received; no admin token is set."""
    proxy = await make_proxy()
    mine = client(proxy, session="tf")
    await fill(proxy, mine, QUESTIONS[:1])
    raw = await mine.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": QUESTIONS[0].lower()}]
    )  # fmt: skip
    assert raw.headers["x-cache-status"] == "hit"
    cache_id = raw.headers["x-cache-id"]
    # the official SDK, the client's own key
    body = await mine.post(TENANT_FEEDBACK[3:], body={"cache_id": cache_id, "feedback": "negative"}, cast_to=object)
    assert body == {"cache_id": cache_id, "state": "ready", "feedback_score": pytest.approx(0.4)}
    assert (await ask(mine, QUESTIONS[0].upper()))[0] == "miss"  # under the feedback floor now

    # by the completion id of a fresh answer, sent at once: its write-back is waited for
    raw = await mine.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": QUESTIONS[1]}]
    )  # fmt: skip
    fresh = raw.parse()
    body = await mine.post(TENANT_FEEDBACK[3:], body={"response_id": fresh.id, "feedback": "regenerate"},
                           cast_to=object)  # fmt: skip
    record = await proxy.app[keys.CACHE].store.get(str(body["cache_id"]))  # type: ignore[index]
    assert record is not None and record.answer_text == fresh.choices[0].message.content

    async def other(authorization: str | None, payload: dict[str, str]) -> tuple[int, dict[str, object]]:
        return await admin(proxy, "POST", TENANT_FEEDBACK, json=payload, authorization=authorization)

    before = await proxy.app[keys.CACHE].store.get(cache_id)
    missing_status, missing = await other("Bearer key-B", {"cache_id": "sc-nope", "feedback": "negative"})
    assert missing_status == 404
    # another tenant's record is answered exactly as one that does not exist, and left alone
    for key in ("Bearer key-B", f"Bearer {TOKEN}", "Basic key-A"):
        for named in ({"cache_id": cache_id}, {"response_id": fresh.id}):
            assert await other(key, {**named, "feedback": "positive"}) == (404, missing), (key, named)
    assert await proxy.app[keys.CACHE].store.get(cache_id) == before
    status, payload = await other(None, {"cache_id": cache_id, "feedback": "positive"})
    assert status == 401 and payload["error"]["type"] == "authentication_error"  # type: ignore[index]
    for bad in ({"cache_id": cache_id, "feedback": "meh"}, {"cache_id": 7, "feedback": "positive"}):
        assert (await other("Bearer key-A", bad))[0] == 400, bad  # type: ignore[arg-type]
    assert (await proxy.app[keys.CACHE].store.get(cache_id)) == before
