"""The reading side of the Redis store's change stream: where it stands and the events after a
position, read so that a trim past the reader is never missed. The store's Lua scripts
(``redis_lua``) append one event per change of a record's life; each replica's change feed
(``proxy.storage.feed``) reads them through ``RedisStore.changes``.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from proxy.storage.redis_codec import Changes, Event, StreamPosition, text, unavailable


class EventStream:
    """The stream at ``key`` on one server."""

    def __init__(self, client: aioredis.Redis, key: str) -> None:
        self._r, self.key = client, key

    async def read(self, after: StreamPosition, count: int) -> Changes:
        """One atomic look: the stream's counters and the events after ``after``, in one MULTI, so
        no trim can fall between them. Trimming leaves no trace of the ids it dropped, only of how
        many (entries added minus entries kept): past the reader's own count, it missed one."""
        key = self.key
        with unavailable():
            pipe = self._r.pipeline(transaction=True)
            pipe.xinfo_stream(key)
            pipe.xread({key: after.id}, count=count)
            info, got = await pipe.execute(raise_on_error=False)
        if isinstance(info, Exception):  # no stream yet: nothing was ever written
            return Changes((), after, trimmed=False)
        head = StreamPosition(text(info["last-generated-id"]), int(info["entries-added"]))
        if int(info["entries-added"]) - int(info["length"]) > after.seq:
            return Changes((), after, trimmed=True, head=head)
        events = [
            Event(raw_id.decode(), text(fields.get(b"op")), int(fields[b"label"]), text(fields.get(b"state")))
            for _, entries in got or []
            for raw_id, fields in entries
        ]
        if not events:
            return Changes((), after, trimmed=False, head=head)
        return Changes(tuple(events), StreamPosition(events[-1].id, after.seq + len(events)), False, head)

    async def position(self) -> StreamPosition:
        """Where the stream stands: a replica that has read every record applies it from here."""
        with unavailable():
            try:
                info: Any = await self._r.xinfo_stream(self.key)
            except redis_errors.ResponseError:  # no stream yet
                return StreamPosition("0-0", 0)
        return StreamPosition(text(info["last-generated-id"]), int(info["entries-added"]))

    async def changes(self, after: StreamPosition, *, block_ms: int = 1000, count: int = 1000) -> Changes:
        """Events after ``after``, waiting up to ``block_ms`` for the first. ``trimmed`` when the
        stream has dropped an event after ``after``: the reader missed it and must rebuild."""
        found = await self.read(after, count)
        if found.events or found.trimmed or block_ms <= 0:
            return found
        with unavailable():  # wait for the next event, then read it atomically as above
            woke = await self._r.xread({self.key: after.id}, count=1, block=block_ms)
        return await self.read(after, count) if woke else found
