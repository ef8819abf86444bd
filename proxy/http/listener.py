"""The listening socket in front of aiohttp's connection handler, with a hard cap on open client
connections.

aiohttp accepts every connection the kernel hands it. Past the process's descriptor limit,
``accept`` fails, asyncio stops accepting for a while, and the proxy can no longer open upstream
connections or its own files either: the whole proxy stalls rather than the excess clients. Here a
connection beyond ``max_connections`` is answered at once with an OpenAI-style 503 and closed, and
every other connection is served as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from proxy.http import keys
from proxy.settings import SettingsError

# descriptors kept back from client connections: the upstream pool (512), the store, the model
# files; a quarter of a limit too small for that
RESERVED_DESCRIPTORS = 1024
# how long a refused client has to finish sending its request head before the socket is closed
REFUSAL_LINGER_S = 2.0
# refusals waiting for their request head; past it a refused socket is closed at once, unanswered,
# so a flood of connections cannot spend the descriptors the cap keeps for the proxy
MAX_REFUSING = 256
_MAX_REFUSED_HEAD = 64 * 1024


def connection_limit(wanted: int, descriptor_limit: int | None = None) -> int:
    """``wanted``, lowered to what the soft descriptor limit leaves once the proxy's own (and
    the refusals') are kept."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if descriptor_limit is None else descriptor_limit
    if soft == resource.RLIM_INFINITY:
        return wanted
    reserved = min(RESERVED_DESCRIPTORS, soft // 4) + min(MAX_REFUSING, soft // 8)
    return max(1, min(wanted, soft - reserved))


def raise_descriptor_limit() -> int:
    """Lift the soft descriptor limit to the hard one, as servers that hold many sockets do; the
    soft limit many shells start with (1,024) caps a proxy at a few hundred clients."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def refusal_bytes(limit: int) -> bytes:
    body = orjson.dumps(
        {
            "error": {
                "message": f"SmartCache is serving its limit of {limit} connections; retry shortly",
                "type": "server_error",
                "param": None,
                "code": "connection_limit",
            }
        }
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Refusal(asyncio.Protocol):
    """Reads the request head (closing before it arrives would reset the socket, and the client
    would see a reset instead of the 503), answers 503 and closes."""

    def __init__(self, answer: bytes, release: Callable[[], None]) -> None:
        self._answer, self._seen, self._release = answer, b"", release
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, self._answer_and_close)

    def data_received(self, data: bytes) -> None:
        self._seen = (self._seen + data)[-_MAX_REFUSED_HEAD:]
        if b"\r\n\r\n" in self._seen or b"\n\n" in self._seen:
            self._answer_and_close()

    def eof_received(self) -> bool:
        self._answer_and_close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None
        self._release()

    def _answer_and_close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        transport, self._transport = self._transport, None
        if transport is not None and not transport.is_closing():
            transport.write(self._answer)
            transport.close()


class _Dropped(asyncio.Protocol):
    """A connection refused while ``MAX_REFUSING`` others wait for their answer: closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Counted(asyncio.Protocol):
    """aiohttp's handler for one connection, counted open until it is lost."""

    def __init__(self, inner: asyncio.Protocol, release: Callable[[], None]) -> None:
        self._inner, self._release = inner, release

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._inner.connection_lost(exc)
        finally:
            self._release()


@dataclass
class ConnectionCap:
    """A protocol factory: aiohttp's handler while fewer than ``limit`` connections are open,
    a refusal after."""

    factory: Callable[[], asyncio.Protocol]
    limit: int
    open: int = 0
    refusing: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {"accepted": 0, "refused": 0, "dropped": 0})

    def __call__(self) -> asyncio.Protocol:
        if self.open < self.limit:
            self.open += 1
            self.counts["accepted"] += 1
            return _Counted(self.factory(), self._release)
        if self.refusing < MAX_REFUSING:
            self.refusing += 1
            self.counts["refused"] += 1
            return _Refusal(refusal_bytes(self.limit), self._refused)
        self.counts["dropped"] += 1
        return _Dropped()

    def _release(self) -> None:
        self.open -= 1

    def _refused(self) -> None:
        self.refusing -= 1


class PortUnavailable(SettingsError):
    """The address to listen on cannot be had: in use, not this machine's, or a privileged port."""


def _unavailable(host: str, port: int, exc: OSError) -> PortUnavailable:
    key, why = "port", f"cannot listen there: {exc.strerror or exc}; choose another --host or --port"
    if exc.errno == errno.EADDRINUSE:
        why = (
            "in use by another process (another SmartCache?): stop it, or choose another port with "
            "--port or SMARTCACHE_PORT (0: any free port)"
        )
    elif exc.errno == errno.EACCES:
        why = "not allowed to listen there (ports below 1024 need privileges): choose one above 1023 with --port"
    elif exc.errno == errno.EADDRNOTAVAIL:
        key, why = "host", "not an address of this machine: listen on 127.0.0.1, 0.0.0.0 or one of its own with --host"
    return PortUnavailable(f"{host}:{port}", key, why)


@dataclass
class Listener:
    server: asyncio.Server
    cap: ConnectionCap

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop accepting. Not waiting for the connections to close (``wait_closed`` does, on
        Python 3.12+): ``runner.cleanup()`` closes them, after it."""
        self.server.close()


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str, port: int, *, max_connections: int) -> AsyncIterator[Listener]:
    """``app`` started and listening on ``host:port`` until the block ends; then no new
    connections, the open ones closed and the app's cleanup run, also when listening failed.

    The address is taken before the app starts (models, engine, store): one that cannot be had
    fails at once, as ``PortUnavailable``, and nothing is started for nothing. Connections are
    accepted once the app has started."""
    runner = web.AppRunner(app, access_log=None)
    listener = await bind(runner, host, port, max_connections=max_connections)
    try:
        await runner.setup()
        await start(runner, listener)
        yield listener
    finally:
        listener.close()
        # also after a failed start: what had started (the engine) stops
        await runner.cleanup()


async def bind(runner: web.AppRunner, host: str, port: int, *, max_connections: int) -> Listener:
    """Take ``host:port`` for ``runner`` (set up or not), not accepting yet: ``start`` does."""

    def handler() -> asyncio.Protocol:
        assert runner.server is not None, "runner.setup() before start()"
        return runner.server()

    cap = ConnectionCap(handler, connection_limit(max_connections))
    try:
        server = await asyncio.get_running_loop().create_server(cap, host, port, backlog=1024, start_serving=False)
    except OSError as exc:
        raise _unavailable(host, port, exc) from exc
    return Listener(server, cap)


async def start(runner: web.AppRunner, listener: Listener) -> None:
    """Accept connections on a bound ``listener`` for ``runner``, set up by now."""
    assert runner.server is not None, "runner.setup() first"
    if keys.METRICS in runner.app:
        cap = listener.cap
        runner.app[keys.METRICS].tally(
            "smartcache_connections",
            "Client connections: accepted, refused with a 503 at the connection cap (max_connections), "
            "or dropped unanswered while too many refusals were waiting.",
            "outcome",
            lambda: dict(cap.counts),
        )
    await listener.server.start_serving()


async def listen(runner: web.AppRunner, host: str, port: int, *, max_connections: int) -> Listener:
    """Serve ``runner`` (already set up) on ``host:port``. Close the listener before
    ``runner.cleanup()``, which then closes the connections still open."""
    listener = await bind(runner, host, port, max_connections=max_connections)
    await start(runner, listener)
    return listener
