"""Response chains in the Redis the replicas share (proxy.storage.chains), so a follow-up naming a
response one replica gave is resolved by whichever replica it reaches.

One string key a chain, ``<prefix>resp:<tenant>:<response id>``, written with a time to live: the
chains are bounded by time, and by the server's own memory policy, never by a sweep of ours. A
follow-up after that is forwarded untouched and not cached, as any unknown id is. Redis errors leave
as ``StoreUnavailable``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from proxy.core.openai.responses import Chain
from proxy.storage.chains import decode_chain, encode_chain
from proxy.storage.redis_codec import unavailable

# a day to continue a conversation through the proxy: long enough for a client's session, short
# enough that chains never hold the server's memory for long
CHAIN_TTL_S = 86_400


class RedisChains:
    def __init__(self, client: aioredis.Redis, *, prefix: str = "sc:", ttl_s: int = CHAIN_TTL_S) -> None:
        self._r, self.prefix, self.ttl_s = client, prefix, ttl_s

    @classmethod
    async def open(cls, url: str, *, prefix: str = "sc:", timeout: float = 2.0) -> RedisChains:
        # a connection pooled before an outage fails its next command once: retried, as the store's
        client = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 1)
        )
        return cls(client, prefix=prefix)

    def _key(self, tenant: str, response_id: str) -> str:
        return f"{self.prefix}resp:{tenant}:{response_id}"

    async def get(self, tenant: str, response_id: str) -> Chain | None:
        with unavailable():
            raw: bytes | str | None = await self._r.get(self._key(tenant, response_id))
        return None if raw is None else decode_chain(raw)

    async def put(self, tenant: str, response_id: str, chain: Chain) -> None:
        with unavailable():
            await self._r.set(self._key(tenant, response_id), encode_chain(chain), ex=self.ttl_s)

    async def forget(self, tenant: str) -> int:
        pattern = self._key(_glob_escaped(tenant), "*")
        forgotten = 0
        with unavailable():
            async for batch in _batches(self._r.scan_iter(match=pattern, count=500)):
                forgotten += int(await self._r.delete(*batch))
        return forgotten

    async def close(self) -> None:
        await self._r.aclose()


def _glob_escaped(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


async def _batches(keys: AsyncIterator[bytes], size: int = 500) -> AsyncIterator[list[bytes]]:
    batch: list[bytes] = []
    async for key in keys:
        batch.append(key)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
