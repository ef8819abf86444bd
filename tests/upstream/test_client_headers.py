"""Which headers cross the proxy, each way: a table per direction (pure, no sockets)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.upstream.client import chat_headers, forward_headers, response_headers

UPSTREAM = CIMultiDictProxy(
    CIMultiDict(
        [
            ("X-Request-Id", "req-1"),
            ("x-ratelimit-remaining-tokens", "900"),
            ("openai-processing-ms", "12"),
            ("Set-Cookie", "a=1"),
            ("Set-Cookie", "b=2"),
            ("Connection", "keep-alive, X-Hop"),
            ("X-Hop", "only this connection"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Content-Length", "10"),
            ("Content-Encoding", "gzip"),
            ("Content-Type", "text/event-stream"),
            ("Cache-Control", "no-store"),
            ("x-cache-status", "hit"),
        ]
    )
)
HOP = {"connection", "x-hop", "keep-alive", "transfer-encoding", "content-length"}


@pytest.mark.parametrize(
    ("name", "relayed_raw", "on_chat"),
    [
        ("x-request-id", True, True),
        ("x-ratelimit-remaining-tokens", True, True),
        ("openai-processing-ms", True, True),
        ("set-cookie", True, True),
        ("connection", False, False),
        ("x-hop", False, False),  # named by Connection: hop-by-hop too
        ("keep-alive", False, False),
        ("transfer-encoding", False, False),
        ("content-length", False, False),
        ("content-encoding", True, False),  # raw bytes keep their encoding; a decoded body does not
        ("content-type", True, False),  # the chat path sets its own
        ("cache-control", True, False),
        ("x-cache-status", True, False),  # ours, on the chat path
    ],
)
def test_upstream_headers_each_way(name: str, relayed_raw: bool, on_chat: bool) -> None:
    assert (name in response_headers(UPSTREAM)) is relayed_raw
    assert (name in chat_headers(UPSTREAM)) is on_chat


def test_a_raw_relay_keeps_repeated_headers_apart() -> None:
    assert response_headers(UPSTREAM).getall("set-cookie") == ["a=1", "b=2"]


@pytest.mark.parametrize(
    ("name", "kept", "kept_on_passthrough"),
    [
        ("Authorization", True, True),
        ("Content-Type", True, True),
        ("Host", False, False),
        ("Content-Length", False, True),
        ("Accept-Encoding", False, True),
        ("Connection", False, False),
        ("X-Hop", False, False),
        ("TE", False, False),
        ("Proxy-Authorization", False, False),
        ("x-smartcache-session", False, False),
    ],
)
def test_client_headers_going_upstream(name: str, kept: bool, kept_on_passthrough: bool) -> None:
    client = {name: "v", "Connection": "X-Hop"} if name != "Connection" else {name: "close"}
    assert (name in forward_headers(client)) is kept
    passthrough = forward_headers(client, keep=frozenset({"content-length", "accept-encoding"}))
    assert (name in passthrough) is kept_on_passthrough
