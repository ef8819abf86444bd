"""Two proxies over one Redis, in front of one router: the turns of a conversation carry the same
routing key (``x-session-id`` for the vllm flavour) through whichever proxy they pass, for a
client that sends no session of its own, since the derived session is a function of the tenant
(whose salt both read from Redis) and of how the conversation opens."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ProxyFactory, Upstream
from tests.e2e.test_redis_replicas import redis  # noqa: F401 (the fixture)
from tests.storage.redis_server import RedisServer

OPENINGS = ["How do tides work?", "Suggest a name for a bakery.", "What is a prime number?"]


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
async def test_a_conversations_turns_carry_one_routing_key_through_either_proxy(
    make_proxy: ProxyFactory,
    upstream: Upstream,
    tmp_path: Path,
    redis: RedisServer,  # noqa: F811
    flavour: str,
) -> None:
    proxies = [
        await make_proxy(store="redis", redis_url=redis.url, data_dir=tmp_path / name, upstream_flavour=flavour)
        for name in ("a", "b")
    ]
    header = {"vllm": "x-session-id", "sglang": "x-smg-routing-key"}[flavour]
    keys_of: dict[str, set[str]] = {}
    for opening in OPENINGS:
        history: list[dict[str, str]] = []
        for n in range(4):  # turns alternate between the two proxies
            history.append({"role": "user", "content": opening if n == 0 else f"Go on, part {n}."})
            client = proxies[n % 2].client()  # the same API key, no session header
            done = await client.chat.completions.create(
                model="m",
                messages=history,  # type: ignore[arg-type]
                extra_headers={"cache-control": "no-cache"},  # every turn goes upstream
            )
            history.append({"role": "assistant", "content": done.choices[0].message.content or ""})
            keys_of.setdefault(opening, set()).add(upstream.script.headers[-1][header])
    assert all(len(keys) == 1 for keys in keys_of.values()), keys_of
    assert len(set.union(*keys_of.values())) == len(OPENINGS)  # one key a conversation
