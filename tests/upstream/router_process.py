"""A real ``vllm-router`` process on a free loopback port, in front of given worker URLs, for the
tests and benchmarks of the proxy behind a router (benchmarks/bench_router.py).

The router comes from the ``router`` extra (``pip install -e '.[router]'``, a wheel from the
registry); where it is not installed, ``find_binary`` says so and the tests skip with that reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.storage.redis_server import free_port

BINARY = "vllm-router"
INSTALL_HINT = "vllm-router is not installed (pip install -e '.[router]')"

# A dead replica's circuit breaker opens within one request: the router's own retries (5 by
# default) then reach a live replica, and the proxy's one retry covers what was in flight when
# it died. With the defaults (10 failures to open, 5 tries a request) the first request to a dead
# replica and its retry both fail.
RESILIENT = ("--cb-failure-threshold", "3", "--retry-max-retries", "5", "--retry-initial-backoff-ms", "10")


def find_binary() -> str | None:
    """The router beside this interpreter (a venv not on PATH), else on PATH."""
    beside = Path(sys.executable).parent / BINARY
    return str(beside) if beside.is_file() else shutil.which(BINARY)


@dataclass
class VllmRouter:
    workers: Sequence[str]
    policy: str = "consistent_hash"
    extra: Sequence[str] = RESILIENT
    log: Path | None = None
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The OpenAI base URL the proxy (or a client) is pointed at."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 60.0) -> None:
        binary = find_binary()
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        command = [
            binary,
            *("--host", "127.0.0.1", "--port", str(self.port), "--policy", self.policy),
            *("--prometheus-port", str(free_port()), "--log-level", "warning"),
            *("--worker-urls", *self.workers),
            *self.extra,
        ]
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL  # noqa: SIM115 (closed with the process)
        self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {self.process.returncode} (log: {self.log})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"vllm-router did not answer on port {self.port} within {timeout:g} s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
