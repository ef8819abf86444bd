"""The answer to a regenerate, and the answer that follows a correction, are never stored: the user
asked for an answer of their own, and it may carry what they said was wrong."""

from __future__ import annotations

from proxy.http import keys
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat

QUESTION = "What is the tallest mountain in Europe?"


async def _answers(proxy: Proxy) -> list[str]:
    return [r.answer_text async for r in proxy.app[keys.CACHE].store.iter_live()]


async def test_the_answer_after_a_correction_is_not_stored_nor_served_later(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    proxy = await make_proxy()
    client = proxy.client(**{"x-smartcache-session": "corr-1"})
    _, first, _ = await chat(client, ask(QUESTION))
    corrected = ask(
        "That's wrong, not what I asked.",
        [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": first}],
    )
    status, fixed, raw = await chat(client, corrected)
    assert (status, raw.headers.get("x-cache-reason")) == ("miss", "correction")
    assert fixed not in await _answers(proxy)
    # the same corrected conversation asked again elsewhere is answered anew, not from the cache
    status, _, _ = await chat(proxy.client(**{"x-smartcache-session": "corr-2"}), corrected)
    assert status != "hit"


async def test_the_answer_to_a_regenerate_is_not_stored_nor_served_later(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    proxy = await make_proxy()
    client = proxy.client(**{"x-smartcache-session": "regen-1"})
    await chat(client, ask(QUESTION))
    status, again, raw = await chat(client, ask(QUESTION))
    assert (status, raw.headers.get("x-cache-reason")) == ("miss", "regenerate")
    assert again not in await _answers(proxy)
    status, served, _ = await chat(proxy.client(**{"x-smartcache-session": "regen-2"}), ask(QUESTION.lower()))
    assert served != again
