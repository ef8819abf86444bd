"""The endpoint behind us: one pooled aiohttp client per app, errors translated at the boundary.

Bytes are relayed as they arrive; nothing is buffered but a non-streamed JSON answer. aiohttp's
client rather than httpx: on loopback httpx costs several times aiohttp's CPU for a JSON call and
for a stream (benchmarks/bench_upstream_client.py), on every miss and half-hit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.errors import SmartCacheError, UpstreamStatus, UpstreamTimeout, UpstreamUnavailable

# RFC 9110 7.6.1: headers of one connection, never relayed either way (nor those Connection names)
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Upstream is asked for identity: the chat path reads the body (tee, write-back), and a body we
# decode must not carry its old content-encoding on to the client.
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "accept-encoding", "cache-control"}
# A chat answer is framed by us: its type, length, encoding, caching and cache headers are ours.
_NOT_ON_CHAT = HOP_BY_HOP | {"content-length", "content-encoding", "content-type", "cache-control", "age"}
_OURS = ("x-cache-", "x-smartcache")
CHAT_PATH = "chat/completions"


def _named_by_connection(headers: Mapping[str, str]) -> set[str]:
    named = (value for key, value in headers.items() if key.lower() == "connection")
    return {token.strip().lower() for value in named for token in value.split(",")}


def forward_headers(headers: Mapping[str, str], *, keep: frozenset[str] = frozenset()) -> dict[str, str]:
    """The client's headers as they go upstream. ``keep``: names otherwise dropped that this
    route relays (a streamed body keeps its declared length, a raw relay the client's encodings)."""
    drop = (_NOT_FORWARDED - keep) | _named_by_connection(headers)
    return {k: v for k, v in headers.items() if k.lower() not in drop and not k.lower().startswith("x-smartcache")}


UpstreamHeaders = CIMultiDict[str] | CIMultiDictProxy[str]
# a query string as (name, value) pairs in the client's order, repeats kept
Query = Sequence[tuple[str, str]]


def response_headers(headers: UpstreamHeaders) -> CIMultiDict[str]:
    """An upstream answer's end-to-end headers, for a body relayed as it came (raw bytes: its
    content-encoding stays with it; repeated headers such as set-cookie stay apart); the length
    is recomputed."""
    drop = HOP_BY_HOP | {"content-length"} | _named_by_connection(headers)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


def chat_headers(headers: UpstreamHeaders) -> dict[str, str]:
    """An upstream chat answer's headers the client keeps (request id, rate limits, timing) on a
    miss or half-hit, whatever our framing replaces."""
    drop = _NOT_ON_CHAT | _named_by_connection(headers)
    return {k.lower(): v for k, v in headers.items() if k.lower() not in drop and not k.lower().startswith(_OURS)}


@contextlib.contextmanager
def translated_errors() -> Any:
    try:
        yield
    # aiohttp's socket timeouts are ClientErrors as well as TimeoutErrors: the timeout is what they mean
    except TimeoutError as exc:
        raise UpstreamTimeout(f"upstream did not answer in time: {type(exc).__name__}") from exc
    except (aiohttp.ClientError, ConnectionError) as exc:
        # aiohttp sends a request body from its own task and wraps what the body's iterator raised
        # (a client's upload past our limit) as a connection error: that failure is the client's
        if isinstance(exc.__cause__, SmartCacheError):
            raise exc.__cause__ from None
        raise UpstreamUnavailable(f"upstream unreachable: {type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class JsonAnswer:
    status: int
    body: Any
    raw: bytes
    headers: dict[str, str]


def env_proxy(base_url: str) -> str | None:
    """The proxy that ``HTTP_PROXY``/``HTTPS_PROXY`` name for the upstream's scheme, unless
    ``NO_PROXY`` names its host: the SDKs and httpx honour them, so a proxy in front of a paid API
    keeps working behind a corporate proxy."""
    url = urlsplit(base_url)
    if not url.hostname or proxy_bypass(url.hostname):
        return None
    return getproxies().get(url.scheme)


# h11's limit on a response head, which the httpx client had: aiohttp's own is 8 KiB a line
_HEAD_LIMIT = 65536


class Upstream:
    def __init__(self, base_url: str, *, timeout: float, connect_timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        # a socket read timeout bounds each read, so an upstream that trickles a byte a second never
        # trips it: the chat path also holds a whole answer to ``timeout`` seconds
        self.timeout = timeout
        connector = aiohttp.TCPConnector(limit=512, limit_per_host=0, keepalive_timeout=15)
        common: dict[str, Any] = {
            "connector": connector,
            "connector_owner": False,
            "timeout": aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=timeout),
            # a reverse proxy keeps no cookies: one client's set-cookie must never ride on another's call
            "cookie_jar": aiohttp.DummyCookieJar(),
            "headers": {"accept-encoding": "identity"},
            # the environment's proxy is read once, below: aiohttp's trust_env reads it on every call
            "trust_env": False,
            "max_line_size": _HEAD_LIMIT,
            "max_field_size": _HEAD_LIMIT,
            # a body goes with the client's content-type or none, never one aiohttp guessed
            "skip_auto_headers": ("content-type",),
        }
        self._connector = connector
        self._proxy = env_proxy(self.base_url)
        # two views of one pool: the chat path reads bodies decoded, a passthrough relays them raw
        self._decoding = aiohttp.ClientSession(auto_decompress=True, **common)
        self._raw = aiohttp.ClientSession(auto_decompress=False, **common)

    async def close(self) -> None:
        await self._decoding.close()
        await self._raw.close()
        await self._connector.close()

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    async def chat_json(
        self, body: Mapping[str, Any], headers: Mapping[str, str], *, params: Query = (), path: str = CHAT_PATH
    ) -> JsonAnswer:
        """``params``: the client's query string, sent on as it came (Azure's ``api-version``);
        ``path``: the route, chat's unless another API's request is forwarded (``responses``)."""
        with translated_errors():
            try:
                status, raw, got = await asyncio.wait_for(self._post_json(body, headers, params, path), self.timeout)
            except TimeoutError as exc:
                raise UpstreamTimeout(f"upstream did not answer within {self.timeout:g} s") from exc
        if status >= 400:
            raise UpstreamStatus(status, raw, got.get("content-type"), headers=chat_headers(got))
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UpstreamUnavailable("upstream answered with invalid JSON") from exc
        return JsonAnswer(status, parsed, raw, chat_headers(got))

    async def _post_json(
        self, body: Mapping[str, Any], headers: Mapping[str, str], params: Query, path: str
    ) -> tuple[int, bytes, CIMultiDictProxy[str]]:
        sent = {**{k: v for k, v in headers.items() if k.lower() != "content-type"}, "content-type": "application/json"}
        url = self.url(path)
        async with self._decoding.post(
            url, data=orjson.dumps(body), headers=sent, params=params or None, allow_redirects=False, proxy=self._proxy
        ) as resp:
            return resp.status, await resp.read(), resp.headers

    @contextlib.asynccontextmanager
    async def open_stream(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        content: bytes | AsyncIterator[bytes] | None,
        params: Query = (),
        raw: bool = False,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A response whose body is still to be read. ``content`` may be an async iterator: the
        request body then streams upstream as it is produced (chunked unless the headers declare
        its length). ``raw``: the body is read as it came (``iter_raw``), not decoded."""
        session = self._raw if raw else self._decoding
        with translated_errors():
            resp = await session.request(
                method,
                self.url(path),
                headers=dict(headers),
                data=content,
                params=params or None,
                allow_redirects=False,
                proxy=self._proxy,
            )
        try:
            yield resp
        finally:
            # a body left unread closes its connection, which is how an engine learns its client went
            if resp.content.is_eof():
                resp.release()
            else:
                resp.close()

    async def iter_bytes(self, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """The body decoded (an upstream may compress though asked for identity), all of it
        within ``timeout`` seconds of the first byte however steadily it trickles."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        chunks = resp.content.iter_any()
        with translated_errors():
            while True:
                try:
                    chunk = await asyncio.wait_for(anext(chunks), max(0.0, deadline - loop.time()))
                except StopAsyncIteration:
                    return
                except TimeoutError as exc:
                    raise UpstreamTimeout(f"upstream stream not complete within {self.timeout:g} s") from exc
                yield chunk

    async def iter_raw(self, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """The body as it came (from ``open_stream(raw=True)``), to relay with its own content-encoding."""
        with translated_errors():
            async for chunk in resp.content.iter_any():
                yield chunk

    async def probe(self, timeout: float) -> int:
        """The status of ``GET models`` within ``timeout`` seconds, body unread: any status means
        the upstream is reachable (a 401 too: the probe carries no key). Unreachable raises."""
        with translated_errors():
            async with asyncio.timeout(timeout):
                async with self._decoding.get(self.url("models"), allow_redirects=False, proxy=self._proxy) as resp:
                    return resp.status

    async def read_error(self, resp: aiohttp.ClientResponse) -> UpstreamStatus:
        with translated_errors():
            body = await resp.read()
        return UpstreamStatus(resp.status, body, resp.headers.get("content-type"), headers=chat_headers(resp.headers))


def cached_tokens_of(usage: Mapping[str, Any]) -> int:
    """``usage.prompt_tokens_details.cached_tokens``: prompt tokens the engine served from its own
    prefix cache (0 when it does not say)."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
