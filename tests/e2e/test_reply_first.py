"""A miss replies before its answer is written back; whoever reads what the write-back writes
waits for it (proxy.service.settling). The store's insert is held here, so the reply is known to come
first and every reader is known to arrive while the write is still under way."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import structlog
from structlog.testing import capture_logs

from proxy.core.model import Record
from proxy.http import keys
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat, chat_stream

QUESTION = "What is the boiling point of water at sea level?"
ADMIN = "admin-token-reply-first"


@dataclass
class HeldStore:
    """The proxy's store with ``insert`` held until ``release``."""

    gate: asyncio.Event
    entered: asyncio.Event

    def release(self) -> None:
        self.gate.set()


def hold_inserts(proxy: Proxy) -> HeldStore:
    store = proxy.app[keys.CACHE].store
    insert = store.insert
    held = HeldStore(asyncio.Event(), asyncio.Event())

    async def slow_insert(record: Record) -> Any:
        held.entered.set()
        await held.gate.wait()
        return await insert(record)

    store.insert = slow_insert  # type: ignore[method-assign]
    return held


@pytest.fixture
async def held_proxy(make_proxy: ProxyFactory) -> AsyncIterator[tuple[Proxy, HeldStore]]:
    proxy = await make_proxy(ready_after=0.0, admin_token=ADMIN)
    held = hold_inserts(proxy)
    yield proxy, held
    held.release()


async def live(proxy: Proxy) -> list[Record]:
    return [r async for r in proxy.app[keys.CACHE].store.iter_live()]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_the_answer_arrives_while_its_write_back_is_held(
    held_proxy: tuple[Proxy, HeldStore], streamed: bool
) -> None:
    proxy, held = held_proxy
    client = proxy.client(settled=False, **{"x-smartcache-session": "first"})
    if streamed:
        status, answer, _ = await asyncio.wait_for(chat_stream(client, ask(QUESTION)), 10)
    else:
        status, answer, _ = await asyncio.wait_for(chat(client, ask(QUESTION)), 10)
    assert status == "miss" and answer
    await asyncio.wait_for(held.entered.wait(), 5)
    assert await live(proxy) == [] and proxy.app[keys.CHAT].settling.in_flight == 1
    held.release()
    await proxy.settled()
    (record,) = await live(proxy)
    assert record.answer_text == answer


async def test_a_regenerate_sent_before_the_write_ends_still_rejects_the_answer(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    proxy = await make_proxy(ready_after=30.0)
    held = hold_inserts(proxy)
    client = proxy.client(settled=False, **{"x-smartcache-session": "regen"})
    _, first, _ = await chat(client, ask(QUESTION))
    again = asyncio.create_task(chat(client, ask(QUESTION)))
    await asyncio.sleep(0.2)
    assert not again.done()  # it waits for the session's last answer to be written
    held.release()
    status, second, raw = await asyncio.wait_for(again, 10)
    assert (status, raw.headers.get("x-cache-reason")) == ("miss", "regenerate") and second != first
    await proxy.settled()
    assert await live(proxy) == []  # the first answer is rejected, the regenerated one never stored


async def test_another_session_asking_before_the_write_ends_is_served_from_it(
    held_proxy: tuple[Proxy, HeldStore], upstream: Upstream
) -> None:
    proxy, held = held_proxy
    _, answer, _ = await chat(proxy.client(settled=False, **{"x-smartcache-session": "a"}), ask(QUESTION))
    # the shipped policy keeps general answers in their session, but a repeat of the very
    # conversation reaches the tenant's other sessions
    structlog.reset_defaults()
    with capture_logs() as logs:
        other = asyncio.create_task(chat(proxy.client(settled=False, **{"x-smartcache-session": "b"}), ask(QUESTION)))
        await asyncio.sleep(0.2)
        assert not other.done()
        held.release()
        status, served, _ = await asyncio.wait_for(other, 10)
        await proxy.settled()
    assert (status, served) == ("hit", answer) and len(upstream.script.calls) == 1
    # the first request's line is written once its held write-back is done, so it is here too
    (line,) = [entry for entry in logs if entry["event"] == "chat.request" and entry["status"] == "hit"]
    assert line["stages_ms"]["settle"] >= 150  # the wait is the log line's, apart from the lookup's


async def test_an_unrelated_question_of_the_tenant_does_not_wait_for_the_write(
    held_proxy: tuple[Proxy, HeldStore], upstream: Upstream
) -> None:
    proxy, held = held_proxy
    await chat(proxy.client(settled=False, **{"x-smartcache-session": "a"}), ask(QUESTION))
    await asyncio.wait_for(held.entered.wait(), 5)
    # another session of the tenant, another subject: no record being written could answer it
    other = proxy.client(settled=False, **{"x-smartcache-session": "b"})
    status, answer, _ = await asyncio.wait_for(chat(other, ask("Recommend a hiking trail near Zurich.")), 10)
    assert status == "miss" and answer and proxy.app[keys.CHAT].settling.in_flight >= 1
    assert not held.gate.is_set()  # the first write is still held: it was not waited for


async def test_the_admin_api_reads_after_the_write(held_proxy: tuple[Proxy, HeldStore]) -> None:
    proxy, held = held_proxy
    await chat(proxy.client(settled=False, **{"x-smartcache-session": "admin"}), ask(QUESTION))
    async with aiohttp.ClientSession() as http:
        listing = asyncio.create_task(
            http.get(proxy.server.make_url("/admin/records"), headers={"Authorization": f"Bearer {ADMIN}"})
        )
        await asyncio.sleep(0.2)
        assert not listing.done()
        held.release()
        async with await asyncio.wait_for(listing, 10) as resp:
            body = await resp.json()
    assert resp.status == 200 and len(body["records"]) == 1


async def test_a_shutdown_finishes_the_write_under_way(held_proxy: tuple[Proxy, HeldStore]) -> None:
    proxy, held = held_proxy
    _, answer, _ = await chat(proxy.client(settled=False, **{"x-smartcache-session": "bye"}), ask(QUESTION))
    asyncio.get_running_loop().call_later(0.2, held.release)
    await proxy.stop()
    assert held.gate.is_set()
    with sqlite3.connect(proxy.settings.db_path) as db:
        assert [row[0] for row in db.execute("SELECT answer_text FROM records")] == [answer]
