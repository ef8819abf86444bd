"""The endpoint behind us: one pooled httpx client per app, errors translated at the boundary.

Bytes are relayed as they arrive; nothing is buffered but a non-streamed JSON answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from multidict import CIMultiDict

from proxy.errors import UpstreamStatus, UpstreamTimeout, UpstreamUnavailable

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


def _named_by_connection(headers: Mapping[str, str]) -> set[str]:
    named = (value for key, value in headers.items() if key.lower() == "connection")
    return {token.strip().lower() for value in named for token in value.split(",")}


def forward_headers(headers: Mapping[str, str], *, keep: frozenset[str] = frozenset()) -> dict[str, str]:
    """The client's headers as they go upstream. ``keep``: names otherwise dropped that this
    route relays (a streamed body keeps its declared length, a raw relay the client's encodings)."""
    drop = (_NOT_FORWARDED - keep) | _named_by_connection(headers)
    return {k: v for k, v in headers.items() if k.lower() not in drop and not k.lower().startswith("x-smartcache")}


def response_headers(headers: httpx.Headers) -> CIMultiDict[str]:
    """An upstream answer's end-to-end headers, for a body relayed as it came (raw bytes: its
    content-encoding stays with it; repeated headers such as set-cookie stay apart); the length
    is recomputed."""
    drop = HOP_BY_HOP | {"content-length"} | _named_by_connection(headers)
    return CIMultiDict((k, v) for k, v in headers.multi_items() if k not in drop)


def chat_headers(headers: httpx.Headers) -> dict[str, str]:
    """An upstream chat answer's headers the client keeps (request id, rate limits, timing) on a
    miss or half-hit, whatever our framing replaces."""
    drop = _NOT_ON_CHAT | _named_by_connection(headers)
    return {k: v for k, v in headers.items() if k not in drop and not k.startswith(_OURS)}


@contextlib.contextmanager
def translated_errors() -> Any:
    try:
        yield
    except httpx.TimeoutException as exc:
        raise UpstreamTimeout(f"upstream did not answer in time: {type(exc).__name__}") from exc
    except (
        httpx.ConnectError,
        httpx.RemoteProtocolError,
        httpx.ReadError,
        httpx.WriteError,
        httpx.NetworkError,
    ) as exc:
        raise UpstreamUnavailable(f"upstream unreachable: {type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class JsonAnswer:
    status: int
    body: Any
    raw: bytes
    headers: dict[str, str]


class Upstream:
    def __init__(self, base_url: str, *, timeout: float, connect_timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        # httpx's read timeout bounds each read, so an upstream that trickles a byte a second never
        # trips it: the chat path also holds a whole answer to ``timeout`` seconds
        self.timeout = timeout
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
            headers={"accept-encoding": "identity"},
        )

    async def close(self) -> None:
        await self._client.aclose()

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    async def chat_json(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> JsonAnswer:
        post = self._client.post(
            self.url("chat/completions"),
            content=orjson.dumps(body),
            headers={
                **{k: v for k, v in headers.items() if k.lower() != "content-type"},
                "content-type": "application/json",
            },
        )
        with translated_errors():
            try:
                resp = await asyncio.wait_for(post, self.timeout)
            except TimeoutError as exc:
                raise UpstreamTimeout(f"upstream did not answer within {self.timeout:g} s") from exc
        if resp.status_code >= 400:
            raise UpstreamStatus(resp.status_code, resp.content, resp.headers.get("content-type"))
        try:
            parsed = orjson.loads(resp.content)
        except orjson.JSONDecodeError as exc:
            raise UpstreamUnavailable("upstream answered with invalid JSON") from exc
        return JsonAnswer(resp.status_code, parsed, resp.content, chat_headers(resp.headers))

    @contextlib.asynccontextmanager
    async def open_stream(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        content: bytes | AsyncIterator[bytes] | None,
        params: Any = None,
    ) -> AsyncIterator[httpx.Response]:
        """A response whose body is still to be read. ``content`` may be an async iterator: the
        request body then streams upstream as it is produced (chunked unless the headers declare
        its length)."""
        request = self._client.build_request(
            method, self.url(path), headers=dict(headers), content=content, params=params
        )
        with translated_errors():
            resp = await self._client.send(request, stream=True)
        try:
            yield resp
        finally:
            await resp.aclose()

    async def iter_bytes(self, resp: httpx.Response) -> AsyncIterator[bytes]:
        """The body decoded (an upstream may compress though asked for identity), all of it
        within ``timeout`` seconds of the first byte however steadily it trickles."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        chunks = resp.aiter_bytes()
        with translated_errors():
            while True:
                try:
                    chunk = await asyncio.wait_for(anext(chunks), max(0.0, deadline - loop.time()))
                except StopAsyncIteration:
                    return
                except TimeoutError as exc:
                    raise UpstreamTimeout(f"upstream stream not complete within {self.timeout:g} s") from exc
                yield chunk

    async def iter_raw(self, resp: httpx.Response) -> AsyncIterator[bytes]:
        """The body as it came, to relay with its own content-encoding."""
        with translated_errors():
            async for chunk in resp.aiter_raw():
                yield chunk

    async def read_error(self, resp: httpx.Response) -> UpstreamStatus:
        with translated_errors():
            body = await resp.aread()
        return UpstreamStatus(resp.status_code, body, resp.headers.get("content-type"))


def cached_tokens_of(usage: Mapping[str, Any]) -> int:
    """``usage.prompt_tokens_details.cached_tokens``: prompt tokens the engine served from its own
    prefix cache (0 when it does not say)."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
