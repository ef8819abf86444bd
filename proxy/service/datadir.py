"""The data directory's ownership: one process serves from it at a time (a proxy, or ``smartcache
warm``), and its tenant salt, made once per installation."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from proxy.settings import SettingsError

__all__ = ["LOCK_FILE", "PROXY_ADVICE", "DataDirInUse", "data_dir_lock", "tenant_salt"]

LOCK_FILE = "smartcache.lock"


class DataDirInUse(SettingsError):
    """Another process serves from this data dir (SQLite, the index snapshot, the salt)."""


# what a second proxy on a data dir in use is told
PROXY_ADVICE = (
    "two proxies on one data dir would each miss what the other writes. Give each proxy its own "
    "--data-dir, and to share one cache between them use the Redis store (store: redis, redis_url: ...)"
)


@contextlib.contextmanager
def data_dir_lock(data_dir: Path, *, advice: str = PROXY_ADVICE) -> Iterator[None]:
    """Hold an exclusive lock on the data dir while a proxy (or ``smartcache warm``) runs from it.
    Two proxies on one directory would each keep their own in-memory index, so each misses what
    the other writes, and the last one to stop overwrites the other's index snapshot. The kernel
    drops the lock when the process ends, however it ends; the file stays (removing it would race
    a starter). ``advice``: what the one refused is told to do."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            raise DataDirInUse(
                str(data_dir), "data_dir", f"in use by another SmartCache process (pid {holder}); {advice}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        yield
    finally:
        os.close(fd)


def tenant_salt(data_dir: Path) -> str:
    """A per-installation salt, so a leaked database cannot be matched against known API keys."""
    path = data_dir / "tenant_salt"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(16))
        path.chmod(0o600)
    return path.read_text().strip()
