"""The endpoint behind us: one pooled httpx client per app, errors translated at the boundary.

Bytes are relayed as they arrive; nothing is buffered but a non-streamed JSON answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from proxy.errors import UpstreamStatus, UpstreamTimeout, UpstreamUnavailable

# hop-by-hop and our own headers never go upstream; the body length is recomputed
_DROP = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
        "cache-control",
    }
)
_DROP_BACK = frozenset({"content-length", "connection", "keep-alive", "transfer-encoding", "content-encoding"})


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP and not k.lower().startswith("x-smartcache")}


def response_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP_BACK}


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
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
        )

    async def close(self) -> None:
        await self._client.aclose()

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    async def chat_json(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> JsonAnswer:
        with translated_errors():
            resp = await self._client.post(
                self.url("chat/completions"),
                content=orjson.dumps(body),
                headers={
                    **{k: v for k, v in headers.items() if k.lower() != "content-type"},
                    "content-type": "application/json",
                },
            )
        if resp.status_code >= 400:
            raise UpstreamStatus(resp.status_code, resp.content, resp.headers.get("content-type"))
        try:
            parsed = orjson.loads(resp.content)
        except orjson.JSONDecodeError as exc:
            raise UpstreamUnavailable("upstream answered with invalid JSON") from exc
        return JsonAnswer(resp.status_code, parsed, resp.content, response_headers(resp.headers))

    @contextlib.asynccontextmanager
    async def open_stream(
        self, method: str, path: str, *, headers: Mapping[str, str], content: bytes | None, params: Any = None
    ) -> AsyncIterator[httpx.Response]:
        """A response whose body is still to be read; non-2xx chat answers raise UpstreamStatus."""
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
