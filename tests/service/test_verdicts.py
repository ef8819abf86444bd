"""VerdictMemory: the judge's refusals kept in the record store, and a store that cannot be
reached costs only a judge call asked again, never the request."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from proxy.service.verdicts import VerdictMemory
from proxy.storage.redis import RedisStore
from tests.storage.contract import put
from tests.storage.redis_server import RedisServer, redis_server, redis_url

__all__ = ["redis_server", "redis_url"]


async def test_a_refusal_goes_through_the_store(redis_url: str) -> None:
    store = await RedisStore.open(redis_url)
    record = await put(store, 1)
    await VerdictMemory(store, lambda: 5.0).refuse("t1", "w1", {record.cache_id})
    assert await VerdictMemory(store, lambda: 6.0).refused("t1", "w1") == {record.cache_id}
    await store.close()


@pytest.mark.parametrize("operation", ["refused", "refuse"])
async def test_a_store_that_is_down_knows_of_no_refusal(
    redis_server: RedisServer, redis_url: str, operation: str
) -> None:
    store = await RedisStore.open(redis_url, timeout=0.5)
    record = await put(store, 1)
    memory = VerdictMemory(store, lambda: 5.0)
    redis_server.stop()
    try:
        with capture_logs() as logs:
            if operation == "refused":
                assert await memory.refused("t1", "w1") == frozenset()
            else:
                await memory.refuse("t1", "w1", {record.cache_id})
    finally:
        redis_server.start()
    assert [log["log_level"] for log in logs] == ["warning"]
    await store.close()
