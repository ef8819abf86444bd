"""The data dir's lock holds across processes and is released on exit; its tenant salt is made
once and kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from proxy.service.datadir import data_dir_lock, tenant_salt


def test_the_lock_is_held_across_processes(tmp_path: Path) -> None:
    with data_dir_lock(tmp_path):
        probe = "from pathlib import Path; from proxy.service.datadir import data_dir_lock; "
        probe += "data_dir_lock(Path(%r)).__enter__()"
        child = subprocess.run(
            [sys.executable, "-c", probe % str(tmp_path)], capture_output=True, text=True, timeout=120
        )
        assert child.returncode != 0
        assert "DataDirInUse" in child.stderr
    with data_dir_lock(tmp_path):  # released on exit
        pass


def test_the_tenant_salt_is_made_once_and_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    salt = tenant_salt(data)
    assert len(salt) == 32 and tenant_salt(data) == salt
    assert (data / "tenant_salt").stat().st_mode & 0o777 == 0o600
