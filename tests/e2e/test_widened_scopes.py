"""An intent's ``widen_to`` is where its answers are written when they do not depend on the user's
own content, so the shipped chitchat (session -> tenant) is shared by the tenant's conversations."""

from __future__ import annotations

from proxy.http import keys
from tests.conftest import Proxy, Upstream
from tests.e2e.test_e2e_core import ask, chat

JOKE = "Tell me a joke"


async def _scopes(proxy: Proxy) -> list[str]:
    return [str(r.scope) async for r in proxy.app[keys.CACHE].store.iter_live()]


async def test_a_widened_intent_is_written_to_the_tenant_and_served_to_its_other_sessions(
    proxy: Proxy, upstream: Upstream
) -> None:
    status, answer, _ = await chat(proxy.client(**{"x-smartcache-session": "w-1"}), ask(JOKE))
    assert status == "miss"
    assert await _scopes(proxy) == ["tenant"]
    status, served, _ = await chat(proxy.client(**{"x-smartcache-session": "w-2"}), ask(JOKE))
    assert (status, served) == ("hit", answer)
    status, _, _ = await chat(proxy.client("key-B", **{"x-smartcache-session": "w-2"}), ask(JOKE))
    assert status == "miss"  # never across tenants


async def test_an_answer_about_someone_named_stays_in_its_session(proxy: Proxy, upstream: Upstream) -> None:
    text = "Tell me a joke about my friend Alice"
    await chat(proxy.client(**{"x-smartcache-session": "p-1"}), ask(text))
    assert await _scopes(proxy) == ["session"]
    status, _, _ = await chat(proxy.client(**{"x-smartcache-session": "p-2"}), ask(text))
    assert status == "miss"


async def test_a_users_reset_keeps_the_answers_it_shared_with_the_tenant(proxy: Proxy, upstream: Upstream) -> None:
    private = "Tell me a joke about my friend Alice"  # names someone: kept to the session
    client = proxy.client(**{"x-smartcache-session": "r-1"})
    _, shared_answer, _ = await chat(client, ask(JOKE))
    await chat(client, ask(private))
    assert sorted(await _scopes(proxy)) == ["session", "tenant"]
    status, _, _ = await chat(client, ask("Let's start over"))
    assert status == "bypass"
    assert await _scopes(proxy) == ["tenant"]  # the session's own answer went, the shared one stays
    status, served, _ = await chat(proxy.client(**{"x-smartcache-session": "r-2"}), ask(JOKE))
    assert (status, served) == ("hit", shared_answer)
