"""A full disk under the data dir: writes fail closed. Every request is still answered (no 5xx),
an answer that cannot be stored is relayed and simply not kept, nothing is half-written (SQLite
stays consistent and holds no trace of the unstored answers), records written before the disk
filled are still served as hits, and writing resumes once there is room again.

The data dir is a small tmpfs mounted for the test; where mounting is not permitted (not root,
no CAP_SYS_ADMIN) the test skips and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.http import keys
from proxy.storage.base import Selector
from tests.conftest import Proxy, ProxyFactory, Upstream

DISK_BYTES = 8 * 1024 * 1024


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({done.stderr.strip() or done.returncode}); needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> Path:
    """Take every free byte of the mount; the file is removed to make room again."""
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 64 * 1024, 4096, 512, 1):  # down to the last partial block
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    assert os.statvfs(mount).f_bavail == 0, "the mount still has room"
    return filler


def checkpoint(db: Path) -> None:
    """Empty the WAL into the database and truncate it, so the next write needs new disk space
    instead of reusing room the WAL already holds."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def integrity(db: Path) -> str:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


async def ask(proxy: Proxy, text: str, *, stream: bool = False, key: str = "key-A") -> tuple[int, str, str]:
    body: dict[str, Any] = {"model": "m-disk", "messages": [{"role": "user", "content": text}], "stream": stream}
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(
            f"{proxy.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
    if stream:
        events = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
        content = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices") or [])
    else:
        content = resp.json()["choices"][0]["message"]["content"] if resp.status_code == 200 else resp.text
    return resp.status_code, resp.headers.get("x-cache-status", ""), content


async def stored(proxy: Proxy) -> int:
    await proxy.settled()
    return len(await proxy.app[keys.CACHE].store.find(Selector(model="m-disk", states=None), limit=1000))


@pytest.mark.slow
async def test_a_full_disk_fails_writes_closed_and_keeps_serving(
    small_disk: Path, make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    proxy = await make_proxy(data_dir=small_disk / "data")
    db = proxy.settings.db_path
    before = ["How do bees make honey?", "Why is the ocean salty?"]
    answers = {}
    for text in before:
        status, cache, answers[text] = await ask(proxy, text)
        assert (status, cache) == (200, "miss")
    assert await stored(proxy) == 2

    checkpoint(db)
    filler = fill(small_disk)
    calls = len(upstream.script.calls)
    full = [f"Question {i} asked on a full disk, about {topic}?" for i, topic in enumerate(("owls", "moss", "tides"))]
    for text in full:
        upstream.script.answers[text] = f"{text} -> answered fresh " + "with some length " * 200
    for i, text in enumerate(full):
        status, cache, content = await ask(proxy, text, stream=i == 1)
        assert status == 200, content[:300]
        assert cache == "miss" and content == upstream.script.answers[text]
    assert len(upstream.script.calls) == calls + len(full)
    for text in before:  # what was there before is still served
        status, cache, content = await ask(proxy, text.lower().rstrip("?"), key="key-A")
        assert (status, cache, content) == (200, "hit", answers[text])
    assert await stored(proxy) == 2  # nothing of the full-disk answers was kept

    filler.unlink()
    status, cache, _ = await ask(proxy, "What causes earthquakes?")
    assert (status, cache) == (200, "miss")
    assert await stored(proxy) == 3  # writing resumes once there is room
    await proxy.stop()
    assert integrity(db) == "ok"
    with sqlite3.connect(db) as conn:
        texts = [row[0] for row in conn.execute("SELECT answer_text FROM records")]
    assert not any("full disk" in t for t in texts)
