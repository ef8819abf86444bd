"""A policy version change invalidates older records whether it arrives by reload or by restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.http import keys
from proxy.settings import DEFAULT_POLICY
from tests.conftest import ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat

# each test restarts the proxy on its data directory
pytestmark = pytest.mark.slow


def _policy(tmp_path: Path, version: str) -> Path:
    text = DEFAULT_POLICY.read_text(encoding="utf-8")
    old = next(line for line in text.splitlines() if line.startswith("version:"))
    path = tmp_path / f"policy-{version}.yaml"
    path.write_text(text.replace(old, f"version: {version}"), encoding="utf-8")
    return path


async def test_a_restart_with_a_new_policy_version_invalidates_the_older_records(
    make_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path
) -> None:
    first = await make_proxy(policy=_policy(tmp_path, "v-old"))
    await chat(first.client(**{"x-smartcache-session": "restart-1"}), ask("What is the tallest mountain in Europe?"))
    (record,) = [r async for r in first.app[keys.CACHE].store.iter_live()]
    await first.stop()

    second = await make_proxy(policy=_policy(tmp_path, "v-new"))
    store = second.app[keys.CACHE].store
    assert [r async for r in store.iter_live()] == []
    assert (await store.get(record.cache_id)).state == "invalid"
    status, _, _ = await chat(
        second.client(**{"x-smartcache-session": "restart-1"}), ask("what is the tallest mountain in europe")
    )
    assert status == "miss"


async def test_a_restart_with_the_same_policy_version_keeps_the_records(
    make_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path
) -> None:
    policy = _policy(tmp_path, "v-same")
    first = await make_proxy(policy=policy)
    await chat(first.client(**{"x-smartcache-session": "restart-2"}), ask("What is the tallest mountain in Europe?"))
    await first.stop()
    second = await make_proxy(policy=policy)
    assert len([r async for r in second.app[keys.CACHE].store.iter_live()]) == 1
