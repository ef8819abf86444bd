"""An upstream error reaches the client as an OpenAI-style JSON error whatever the upstream sent:
its own OpenAI error passes as it came, anything else (a plain-text 404 from a base URL that
misses the API path) is wrapped with the status kept."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import ProxyFactory, Upstream


@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_404_in_plain_text_reaches_the_client_as_openai_json(
    make_proxy: ProxyFactory, upstream: Upstream, stream: bool
) -> None:
    # a path, so it passes the start-up check, but not the API's: the scripted server answers
    # aiohttp's own text/plain "404: Not Found"
    proxy = await make_proxy(upstream=str(upstream.server.make_url("/api")))
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hello there"}], "stream": stream},
        )
    assert resp.status_code == 404
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert error["type"] == "not_found_error"
    assert error["code"] == "upstream_404"
    assert "/v1" in error["message"]


async def test_the_sdk_reads_a_wrapped_upstream_404(make_proxy: ProxyFactory, upstream: Upstream) -> None:
    proxy = await make_proxy(upstream=str(upstream.server.make_url("/api")))
    with pytest.raises(openai.NotFoundError) as err:
        await proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi there"}])
    assert "upstream" in err.value.message


async def test_an_upstream_openai_error_passes_as_it_came(make_proxy: ProxyFactory, upstream: Upstream) -> None:
    upstream.script.mode = "error400"
    proxy = await make_proxy()
    with pytest.raises(openai.BadRequestError) as err:
        await proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi there"}])
    assert err.value.code == "context_length_exceeded"


RATE_LIMITED = {
    "retry-after": "7",
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "7s",
    "x-request-id": "req-7f3a",
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("mode", "status"), [("error429", 429), ("error500", 500), ("error400", 400)])
async def test_an_upstream_error_keeps_the_upstreams_headers(
    make_proxy: ProxyFactory, upstream: Upstream, stream: bool, mode: str, status: int
) -> None:
    """Back-off (retry-after, x-ratelimit-*) and support tickets (x-request-id) need them."""
    upstream.script.mode, upstream.script.error_headers = mode, RATE_LIMITED
    proxy = await make_proxy()
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hello there"}], "stream": stream},
            headers={"Authorization": "Bearer k"},
        )
    assert resp.status_code == status
    assert {k: resp.headers.get(k) for k in RATE_LIMITED} == RATE_LIMITED
    assert resp.headers["x-cache-status"] == "miss" and resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error"]["code"] in {"rate_limit_exceeded", "boom", "context_length_exceeded"}


async def test_the_sdk_sees_a_rate_limits_retry_after_and_request_id(
    make_proxy: ProxyFactory, upstream: Upstream
) -> None:
    upstream.script.mode, upstream.script.error_headers = "error429", RATE_LIMITED
    proxy = await make_proxy()
    with pytest.raises(openai.RateLimitError) as err:
        await proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi there"}])
    assert err.value.response.headers["retry-after"] == "7"
    assert err.value.request_id == "req-7f3a"
