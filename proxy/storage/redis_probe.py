"""What the Redis server offers beyond the core this store needs, probed at start and never
assumed: vector search (``FT.CREATE … VECTOR`` and ``FT.SEARCH``, from Redis 8's query engine or
the RediSearch module of Redis Stack). Debian's Redis 7 has neither.

The replica's own HNSW index does the search either way: a store-side search is not built, and
would only be worth building against a server this project can test it on. The probe says what
the server could do, so an operator sees it at start and in /metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.storage.redis_codec import text

SEARCH_COMMANDS = ("FT.CREATE", "FT.SEARCH")
# COMMAND INFO answers nil for a command the server does not have; a script turns that into a
# plain true/false (redis-py's own parser of COMMAND replies fails on the nil)
PROBE = """
local out = {}
for i, name in ipairs(ARGV) do out[i] = redis.call('COMMAND', 'INFO', name)[1] and 1 or 0 end
return out
"""
SEARCH_MODULES = ("search", "ft", "searchlight")


@dataclass(frozen=True, slots=True)
class VectorSearch:
    available: bool
    detail: str  # what the answer rests on, for the start-up log line

    @classmethod
    def from_probe(cls, commands: Sequence[Any], modules: Sequence[Mapping[Any, Any]]) -> VectorSearch:
        """From the probe's 0/1 per name of ``SEARCH_COMMANDS`` and the reply of MODULE LIST."""
        have = [name for name, ok in zip(SEARCH_COMMANDS, commands, strict=True) if int(ok)]
        loaded = [f"{text(m.get(b'name', m.get('name')))} {m.get(b'ver', m.get('ver'))}" for m in modules]
        search = [m for m in loaded if m.split(" ")[0].lower() in SEARCH_MODULES]
        if len(have) == len(SEARCH_COMMANDS):
            return cls(True, "commands " + ", ".join(have) + (f" (module {', '.join(search)})" if search else ""))
        missing = [n for n in SEARCH_COMMANDS if n not in have]
        return cls(False, f"no {', '.join(missing)}; modules: {', '.join(loaded) or 'none'}")
