"""Which policy versions the replicas sharing a Redis serve, so that a rolling deploy neither
serves nor wipes across versions.

A record carries the policy version it was written under. With one process per store, the proxy
invalidates every other version at start (a policy that changed while it was down). With a shared
store that would be wrong twice over: replica A restarting on v2 would wipe the records replica B
still serves under v1, and B would go on writing v1 records that A, having swept them once,
would then serve. So on a shared store:

- a replica's index holds only records of the version it serves (``RedisStore.follow_policy``
  filters what the start-up load and the change feed adopt), so it never serves another
  version's answer, whoever wrote it and whenever;
- every replica stamps its version in one sorted set with the server's clock, at each write and
  every ``BEAT_S``; a version no replica has stamped for ``GRACE_S`` is one nobody serves any
  more, and the first replica to see that retires its records (the stream then takes them out
  of every index). A replica down for longer than the grace finds its version's records gone:
  it costs hits, never a wrong answer.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from proxy.storage.redis_codec import text, unavailable

BEAT_S = 10.0
GRACE_S = 120.0

# ARGV: prefix, version, grace seconds. Stamps the version with the server's time and returns the
# versions nobody stamped within the grace.
BEAT = """
local key = ARGV[1] .. 'versions'
local now = tonumber(redis.call('TIME')[1])
redis.call('ZADD', key, now, ARGV[2])
return redis.call('ZRANGEBYSCORE', key, '-inf', '(' .. (now - tonumber(ARGV[3])))
"""

# ARGV: prefix, version, grace seconds. Drops the version when it is still unstamped within the
# grace (a replica on it may have come back while its records were retired).
FORGET = """
local key = ARGV[1] .. 'versions'
local now = tonumber(redis.call('TIME')[1])
local at = redis.call('ZSCORE', key, ARGV[2])
if at and tonumber(at) < now - tonumber(ARGV[3]) then return redis.call('ZREM', key, ARGV[2]) end
return 0
"""


class PolicyVersions:
    """The shared register of served policy versions (see the module's docstring)."""

    def __init__(self, client: aioredis.Redis, prefix: str, *, grace_s: float = GRACE_S) -> None:
        self.prefix, self.grace_s = prefix, grace_s
        self._beat = client.register_script(BEAT)
        self._forget = client.register_script(FORGET)

    async def beat(self, version: str) -> list[str]:
        """Say ``version`` is served; returns the versions nobody serves any more."""
        with unavailable():
            dead = await self._beat(args=[self.prefix, version, repr(self.grace_s)])
        return [text(v) for v in dead]

    async def forget(self, version: str) -> bool:
        """Drop a version whose records were retired, unless a replica stamped it meanwhile."""
        with unavailable():
            return bool(await self._forget(args=[self.prefix, version, repr(self.grace_s)]))
