"""The conversations Responses API requests continue (``previous_response_id``), by response id
within the tenant: the seam, its codec, and the memory of one process.

A response the proxy served or relayed is remembered here as the ``Chain`` it closes, so a
follow-up naming it is read as the whole conversation (proxy.core.openai.responses). The memory
is bounded: the least recently used chains are forgotten past a budget of text, and a follow-up of
one forgotten is forwarded untouched and not cached, as any unknown id is. Where replicas share a
Redis, they share the chains too (proxy.storage.redis_chains): a follow-up may reach another.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import orjson

from proxy.core.openai.request import Message
from proxy.core.openai.responses import Chain

# about 16 MB of English text: thousands of conversations at the length the cache reads
DEFAULT_MAX_CHARS = 16 * 1024 * 1024


class ResponseChains(Protocol):
    """Chains by tenant and response id. Reads and writes may raise ``StoreUnavailable``."""

    async def get(self, tenant: str, response_id: str) -> Chain | None: ...

    async def put(self, tenant: str, response_id: str, chain: Chain) -> None: ...

    async def forget(self, tenant: str) -> int:
        """Every chain of ``tenant`` gone (a revoked key's purge); how many there were."""
        ...

    async def close(self) -> None: ...


def encode_chain(chain: Chain) -> bytes:
    return orjson.dumps({"m": [[m.role, m.text] for m in chain.messages], "s": chain.served})


def decode_chain(raw: bytes | str) -> Chain | None:
    """None for a value that is not a chain (written by another version, or damaged)."""
    try:
        data = orjson.loads(raw)
        messages = tuple(Message(str(role), str(text)) for role, text in data["m"])
        return Chain(messages, bool(data["s"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def chars_of(chain: Chain) -> int:
    return sum(len(m.text) for m in chain.messages) + len(chain.messages)


class MemoryChains:
    """One process's chains: what a store no other replica writes needs. Lost on restart, so a
    follow-up of a response given before it is forwarded untouched."""

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.max_chars = max_chars
        self._chains: OrderedDict[tuple[str, str], Chain] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._chains)

    async def get(self, tenant: str, response_id: str) -> Chain | None:
        key = (tenant, response_id)
        chain = self._chains.get(key)
        if chain is not None:
            self._chains.move_to_end(key)
        return chain

    async def put(self, tenant: str, response_id: str, chain: Chain) -> None:
        key = (tenant, response_id)
        if (old := self._chains.pop(key, None)) is not None:
            self._chars -= chars_of(old)
        self._chains[key] = chain
        self._chars += chars_of(chain)
        while self._chars > self.max_chars and self._chains:
            _, dropped = self._chains.popitem(last=False)
            self._chars -= chars_of(dropped)

    async def forget(self, tenant: str) -> int:
        doomed = [key for key in self._chains if key[0] == tenant]
        for key in doomed:
            self._chars -= chars_of(self._chains.pop(key))
        return len(doomed)

    async def close(self) -> None:
        self._chains.clear()
        self._chars = 0
