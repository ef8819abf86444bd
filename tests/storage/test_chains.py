"""The chains Responses follow-ups continue: one process's bounded memory, and the Redis the
replicas share (one replica's chain read by another, a damaged value read as none, an outage as
``StoreUnavailable``)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from proxy.core.openai.request import Message
from proxy.core.openai.responses import Chain
from proxy.storage.base import StoreUnavailable
from proxy.storage.chains import MemoryChains, chars_of, decode_chain, encode_chain
from proxy.storage.redis_chains import RedisChains
from tests.storage.redis_server import BINARY, RedisServer, free_port

CHAIN = Chain((Message("user", "Capital of Japan?"), Message("assistant", "Tokyo.")), served=True)


def test_the_codec_round_trips_and_reads_a_damaged_value_as_none() -> None:
    assert decode_chain(encode_chain(CHAIN)) == CHAIN
    assert decode_chain(b"{") is None and decode_chain(b'{"m": 3}') is None and decode_chain(b"[]") is None


async def test_memory_chains_are_kept_by_tenant_and_forgotten_least_recent_first() -> None:
    chains = MemoryChains(max_chars=3 * chars_of(CHAIN))
    await chains.put("t1", "resp_a", CHAIN)
    assert await chains.get("t1", "resp_a") == CHAIN
    assert await chains.get("t2", "resp_a") is None  # another tenant's ids are not this one's
    for name in ("resp_b", "resp_c"):
        await chains.put("t1", name, CHAIN)
    await chains.get("t1", "resp_a")  # read: now the most recent
    await chains.put("t1", "resp_d", CHAIN)
    assert await chains.get("t1", "resp_b") is None and await chains.get("t1", "resp_a") == CHAIN
    assert len(chains) == 3
    await chains.put("t1", "resp_d", CHAIN)  # written again: counted once
    assert len(chains) == 3
    await chains.put("t2", "resp_e", CHAIN)
    assert await chains.forget("t1") == 2  # a revoked key's purge
    assert len(chains) == 1 and await chains.get("t2", "resp_e") == CHAIN


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which(BINARY) is None:
        pytest.skip(f"{BINARY} is not installed (Debian: apt-get install redis-server)")
    server = RedisServer(free_port(), tmp_path / "redis")
    server.dir.mkdir()
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def two_replicas(redis_server: RedisServer) -> AsyncIterator[tuple[RedisChains, RedisChains]]:
    a, b = await RedisChains.open(redis_server.url), await RedisChains.open(redis_server.url)
    yield a, b
    await a.close()
    await b.close()


async def test_one_replicas_chain_is_read_by_another_with_a_time_to_live(
    two_replicas: tuple[RedisChains, RedisChains], redis_server: RedisServer
) -> None:
    a, b = two_replicas
    await a.put("t1", "resp_a", CHAIN)
    assert await b.get("t1", "resp_a") == CHAIN
    assert await b.get("t2", "resp_a") is None
    ttl = await b._r.ttl(b._key("t1", "resp_a"))
    assert 0 < ttl <= b.ttl_s
    await a.put("t1", "resp_b", CHAIN)
    await a.put("t*", "resp_c", CHAIN)
    assert await b.forget("t*") == 1  # a tenant is matched as it is spelled, never as a pattern
    assert await b.forget("t1") == 2
    assert await b.get("t1", "resp_a") is None
    redis_server.stop()
    with pytest.raises(StoreUnavailable):
        await b.get("t1", "resp_a")
