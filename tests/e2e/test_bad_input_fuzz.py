"""Generated bad input: bodies and headers of every shape reach only a 4xx in OpenAI's error
shape or a correct answer; never a 5xx, never a crash, and never a record for a refused request.

Two levels: the pure parser and identity over many cases (fast), and the whole proxy over HTTP
against a scripted upstream (real sockets, real SQLite, the real embedding model). The HTTP test's
case count comes from ``SMARTCACHE_FUZZ_EXAMPLES`` so the soak run can raise it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.errors import InvalidRequest
from proxy.core.identity import identify
from proxy.core.openai.request import parse_chat_request
from proxy.embedding.backends import SyncEmbedder
from proxy.http.app import create_app
from proxy.settings import load_settings
from tests.scripted_upstream import Script, scripted_app

PARSER_EXAMPLES = 10_000
HTTP_EXAMPLES = int(os.environ.get("SMARTCACHE_FUZZ_EXAMPLES", "600"))
ROLES = ["system", "developer", "user", "assistant", "tool", "function", "", "User", "bot", "\u0000"]

# --- generated JSON-ish values ------------------------------------------------------------------

odd_text = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()),  # includes lone surrogates and controls
    max_size=40,
) | st.sampled_from(["", " ", "\u200b", "𝓗𝓮𝓵𝓵𝓸", "你好，世界", "\ud800", "\udfff", "a\u0000b", "\ufeff", "🙂" * 30])
numbers = st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=True, allow_infinity=True)
scalars = st.none() | st.booleans() | numbers | odd_text
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(odd_text, inner, max_size=4), max_leaves=12
)
parts = (
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url", "input_audio", "file", "refusal", "", "TEXT"])},
        optional={"text": scalars, "image_url": st.just({"url": "data:image/png;base64,AAAA"})},
    )
    | json_values
)
contents = odd_text | st.lists(parts, max_size=3) | json_values
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES) | json_values},
    optional={
        "content": contents,
        "tool_calls": st.just([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
        "name": odd_text,
        "tool_call_id": odd_text,
    },
)
good_messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": odd_text}),
    min_size=1,
    max_size=4,
)
bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "model": st.sampled_from(["m", "", " ", "gpt-4o"]) | json_values,
            "messages": good_messages | st.lists(messages, max_size=4) | json_values,
            "stream": st.booleans() | json_values,
            "stream_options": st.just({"include_usage": True}) | json_values,
            "n": st.integers(min_value=-2, max_value=3) | json_values,
            "logprobs": st.booleans(),
            "tools": st.just([{"type": "function", "function": {"name": "f"}}]) | json_values,
            "cache": st.fixed_dictionaries(
                {},
                optional={
                    "no_cache": json_values,
                    "no_store": json_values,
                    "ttl": json_values,
                    "namespace": json_values,
                },
            )
            | json_values,
            "user": json_values,
            "temperature": numbers,
            "max_tokens": numbers,
        },
    )
    | json_values
)


@st.composite
def raw_bodies(draw: st.DrawFn) -> bytes:
    """A body as bytes, mangled the ways clients and attackers mangle them."""
    value = draw(bodies)
    try:
        text = json.dumps(value, allow_nan=True)  # NaN / Infinity tokens, \\ud800 escapes
    except (ValueError, TypeError):
        text = "{}"
    raw = text.encode("utf-8", "surrogatepass")
    mangle = draw(st.sampled_from(["none"] * 6 + ["dup", "utf8", "cut", "deep", "huge", "empty", "bom", "nul"]))
    if mangle == "dup" and raw.startswith(b"{") and len(raw) > 2:
        raw = b'{"model": "m", "model": 7, ' + raw[1:]
    elif mangle == "utf8":
        at = draw(st.integers(min_value=0, max_value=len(raw)))
        raw = raw[:at] + b"\xff\xfe\xc3" + raw[at:]
    elif mangle == "cut":
        raw = raw[: draw(st.integers(min_value=0, max_value=max(0, len(raw) - 1)))]
    elif mangle == "deep":
        depth = draw(st.sampled_from([64, 1024, 100_000]))
        raw = b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    elif mangle == "huge":
        raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 2_000_000}]}).encode()
    elif mangle == "empty":
        raw = b""
    elif mangle == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif mangle == "nul":
        raw = raw + b"\x00"
    return raw


# h11 refuses to send a header value with surrounding whitespace, so those are not generated
header_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60).map(
    str.strip
) | st.sampled_from(
    ["", "no-cache, no-store", "max-age=-1", "max-age=99999999999999999999", "Bearer", "Bearer  x", "x" * 5000]
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "authorization": header_text | st.just("Bearer key-A"),
        "cache-control": header_text,
        "x-smartcache-session": header_text,
        "x-smartcache-user": header_text,
        "x-smartcache-system-version": header_text,
        "content-type": st.sampled_from(["application/json", "text/plain", "", "application/json; charset=latin-1"]),
    },
)

# --- the pure level -----------------------------------------------------------------------------


@settings(max_examples=PARSER_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(raw=raw_bodies(), hdrs=headers)
@pytest.mark.slow
def test_parser_and_identity_refuse_bad_bodies_with_invalid_request_only(raw: bytes, hdrs: dict[str, str]) -> None:
    try:
        request = parse_chat_request(raw, cache_control=hdrs.get("cache-control"))
        identity = identify(hdrs, request, salt="s")
    except InvalidRequest as exc:
        assert exc.status == 400 and exc.message
        return
    assert request.messages and isinstance(request.model, str) and request.model.strip()
    assert identity.tenant and identity.session


# --- the HTTP level -----------------------------------------------------------------------------


@dataclass
class Stack:
    """Proxy and scripted upstream on their own event loop in a thread, so that the synchronous
    hypothesis test can drive them over real sockets."""

    proxy_url: str
    db: Path
    loop: asyncio.AbstractEventLoop
    runners: list[web.AppRunner] = field(default_factory=list)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_home: Path, sync_embedder: SyncEmbedder) -> Iterator[Stack]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    data_dir = tmp_path_factory.mktemp("fuzz") / "data"

    async def start() -> Stack:
        upstream = web.AppRunner(scripted_app(Script()))
        await upstream.setup()
        up_site = web.TCPSite(upstream, "127.0.0.1", 0)
        await up_site.start()
        up_port = upstream.addresses[0][1]
        overrides = {
            "upstream": f"http://127.0.0.1:{up_port}/v1",
            "data_dir": data_dir,
            "model_home": model_home,
            "ready_after": 0.0,
            "upstream_timeout": 5.0,
        }
        settings_ = load_settings(environ={}, overrides=overrides)
        proxy = web.AppRunner(create_app(settings_, backend=sync_embedder))
        await proxy.setup()
        site = web.TCPSite(proxy, "127.0.0.1", 0)
        await site.start()
        port = proxy.addresses[0][1]
        return Stack(f"http://127.0.0.1:{port}", data_dir, loop, [proxy, upstream])

    built = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=120)
    yield built

    async def stop() -> None:
        for runner in built.runners:
            await runner.cleanup()

    asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


@dataclass
class Tally:
    refused: int = 0
    answered_upstream: int = 0  # 200s the upstream produced (the only ones that may be stored)
    answered: int = 0


def _record_count(data_dir: Path) -> int:
    dbs = list(data_dir.rglob("*.db")) + list(data_dir.rglob("*.sqlite*"))
    total = 0
    for db in {p for p in dbs if not p.name.endswith(("-wal", "-shm"))}:
        with sqlite3.connect(db) as conn:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'").fetchone():
                total += conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    return total


def _check_error_shape(response: httpx.Response) -> None:
    assert response.headers.get("content-type", "").startswith("application/json"), (
        response.status_code,
        response.text[:300],
    )
    body = response.json()
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    assert "param" in error and "code" in error


def _check_answer(response: httpx.Response) -> None:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        lines = [ln for ln in response.text.splitlines() if ln.startswith("data: ")]
        assert lines and lines[-1] == "data: [DONE]", response.text[-300:]
        for line in lines[:-1]:
            chunk = json.loads(line[6:])
            assert chunk.get("object") == "chat.completion.chunk" or "error" in chunk
        return
    body = response.json()
    assert body["object"] == "chat.completion" and isinstance(body["choices"][0]["message"]["content"], str)


def test_the_proxy_answers_generated_bad_input_with_4xx_or_a_correct_answer(stack: Stack) -> None:
    tally = Tally()
    client = httpx.Client(base_url=stack.proxy_url, timeout=30)

    @settings(max_examples=HTTP_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(raw=raw_bodies(), hdrs=headers)
    def one(raw: bytes, hdrs: dict[str, str]) -> None:
        response = client.post("/v1/chat/completions", content=raw, headers=hdrs)
        assert response.status_code < 500, (response.status_code, response.text[:500], raw[:300])
        if response.status_code >= 400:
            tally.refused += 1
            _check_error_shape(response)
            return
        tally.answered += 1
        if response.headers.get("x-cache-status") in ("miss", "half-hit"):
            tally.answered_upstream += 1
        _check_answer(response)

    try:
        one()
    finally:
        client.close()
    assert tally.refused > HTTP_EXAMPLES // 4, tally  # the generator mostly builds bad input
    assert httpx.get(stack.proxy_url + "/healthz", timeout=10).status_code == 200
    # a refused request never leaves a record: every record comes from an answer the upstream gave
    assert _record_count(stack.db) <= tally.answered_upstream, tally


def test_bad_input_error_bodies_never_echo_credentials(stack: Stack) -> None:
    secret = "sk-fuzz-secret-0123456789"
    for raw in (b"{", b'{"model": 1}', b'{"model": "m", "messages": []}', b"\xff"):
        response = httpx.post(
            stack.proxy_url + "/v1/chat/completions",
            content=raw,
            headers={"authorization": f"Bearer {secret}", "x-smartcache-session": secret},
            timeout=10,
        )
        assert response.status_code == 400
        assert secret not in response.text
        _check_error_shape(response)
