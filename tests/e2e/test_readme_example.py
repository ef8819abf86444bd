"""The README's first example does what the README says, with the shipped policy: its question
asked through the SDK with no session header is a miss, and then a hit both reworded in another
conversation of the same key (the README's curl, `x-smartcache-session: conv-42`) and asked again
in a new one."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.conftest import ProxyFactory, SettledTransport, Upstream

README = Path(__file__).resolve().parents[2] / "README.md"


def use_it_examples() -> tuple[str, str, str]:
    """The question of the README's Python example, the curl's, and the curl's session header."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Use it") :]
    python = re.search(r'"content": "([^"]+)"\}\]\)', section)
    curl = re.search(r"x-smartcache-session: ([\w-]+)'.*?\"content\": \"([^\"]+)\"", section, re.S)
    assert python and curl, "the README's Use it examples moved"
    return python.group(1), curl.group(2), curl.group(1)


async def test_the_readme_question_is_a_hit_in_another_conversation(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    question, reworded, session = use_it_examples()
    assert question != reworded
    proxy = await make_proxy()  # the shipped policy; ready_after 0 stands for the feedback window passed

    async def status(text: str, **headers: str) -> str:
        async with httpx.AsyncClient(timeout=30, transport=SettledTransport(proxy.settled)) as http:
            resp = await http.post(
                f"{proxy.base_url}/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": text}]},
                headers={"Authorization": "Bearer your-key", **headers},
            )
        assert resp.status_code == 200
        return resp.headers["x-cache-status"]

    assert await status(question) == "miss"
    assert await status(reworded, **{"x-smartcache-session": session}) == "hit"
    assert await status(question, **{"x-smartcache-session": "a-new-conversation"}) == "hit"
    assert len(upstream.script.calls) == 1
