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
