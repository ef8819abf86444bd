"""An intent's ``widen_to`` is where its answers are written when they do not depend on the user's
own content, so the shipped chitchat (session -> tenant) is shared by the tenant's conversations.
Whatever pool an answer went to, ``repeats_widen_to`` (tenant in the shipped policy) serves it to the
very same conversation asked in another session of the tenant."""

from __future__ import annotations

from pathlib import Path

from proxy.http import keys
from proxy.settings import DEFAULT_POLICY
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat
from tests.e2e.test_multi_turn_context import HANGZHOU_TRIP

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


async def test_an_answer_about_someone_named_stays_in_its_session_but_for_the_same_conversation(
    proxy: Proxy, upstream: Upstream
) -> None:
    text = "Tell me a joke about my friend Alice"
    _, answer, _ = await chat(proxy.client(**{"x-smartcache-session": "p-1"}), ask(text))
    assert await _scopes(proxy) == ["session"]
    status, _, _ = await chat(proxy.client(**{"x-smartcache-session": "p-2"}), ask(f"{text}, please"))
    assert status == "miss"  # reworded, it is another conversation: the answer stays in p-1
    calls = len(upstream.script.calls)
    status, served, _ = await chat(proxy.client(**{"x-smartcache-session": "p-3"}), ask(text))
    assert (status, served, len(upstream.script.calls)) == ("hit", answer, calls)
    status, _, _ = await chat(proxy.client("key-B", **{"x-smartcache-session": "p-3"}), ask(text))
    assert status == "miss" and len(upstream.script.calls) == calls + 1  # never across tenants


# After these five travel turns, a turn of another topic is signed without the trip, so nothing but
# this very conversation may answer it.
TRIP = list(HANGZHOU_TRIP)


def _conversation(*turns: str) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


async def test_a_turn_that_left_its_topic_is_served_only_to_the_same_conversation(
    proxy: Proxy, upstream: Upstream
) -> None:
    switched = _conversation(*TRIP, "明天的会议纪要帮我整理一下")
    status, answer, raw = await chat(proxy.client(**{"x-smartcache-session": "s-1"}), switched)
    assert (status, raw.headers.get("x-cache-reason")) == ("miss", "topic_switch")
    status, served, _ = await chat(proxy.client(**{"x-smartcache-session": "s-2"}), switched)
    assert (status, served) == ("hit", answer)
    other_trip = _conversation(*TRIP[:-1], "西湖免费。", "明天的会议纪要帮我整理一下")
    status, _, raw = await chat(proxy.client(**{"x-smartcache-session": "s-3"}), other_trip)
    assert (status, raw.headers.get("x-cache-reason")) == ("miss", "topic_switch")  # another reply before it


def _not_sharing(tmp_path: Path) -> Path:
    text = DEFAULT_POLICY.read_text(encoding="utf-8")
    assert "  repeats_widen_to: tenant\n" in text
    path = tmp_path / "no-repeats.yaml"
    path.write_text(text.replace("  repeats_widen_to: tenant\n", "  repeats_widen_to: session\n"), encoding="utf-8")
    return path


async def test_repeats_kept_to_the_session_stay_in_their_session(
    make_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path
) -> None:
    proxy = await make_proxy(policy=_not_sharing(tmp_path))
    text = "Tell me a joke about my friend Alice"
    await chat(proxy.client(**{"x-smartcache-session": "n-1"}), ask(text))
    status, _, _ = await chat(proxy.client(**{"x-smartcache-session": "n-2"}), ask(text))
    assert status == "miss"
    switched = _conversation(*TRIP, "明天的会议纪要帮我整理一下")
    await chat(proxy.client(**{"x-smartcache-session": "n-1"}), switched)
    status, _, raw = await chat(proxy.client(**{"x-smartcache-session": "n-2"}), switched)
    assert (status, raw.headers.get("x-cache-reason")) == ("miss", "topic_switch")


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
