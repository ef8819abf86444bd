"""The routes around the cache: the client's query string goes upstream on chat requests as on
passthrough ones; a route or a method nobody serves is an OpenAI-style JSON error, never an
upstream's plain text; /healthz is liveness and /readyz readiness, with the upstream's state."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.http import keys
from tests.conftest import Proxy, ProxyFactory, Upstream
from tests.e2e.test_e2e_core import ask, chat, chat_stream
from tests.scripted_upstream import scripted_app

AZURE = {"api-version": "2024-06-01"}


def body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": ask(text), **extra}


def assert_openai_error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return dict(error)


# --- the query string ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_requests_query_string_goes_upstream(proxy: Proxy, upstream: Upstream, stream: bool) -> None:
    client = proxy.client(**{"x-smartcache-session": f"q-{stream}"}).with_options(default_query=AZURE)
    if stream:
        status, _, _ = await chat_stream(client, ask("Name three primary colours."))
    else:
        status, _, _ = await chat(client, ask("Name three primary colours."))
    assert status == "miss"
    assert upstream.script.queries == ["api-version=2024-06-01"]


async def test_the_query_string_keeps_its_order_repeats_and_escapes(proxy: Proxy, upstream: Upstream) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(
            f"{proxy.base_url}/chat/completions?b=2&a=1&a=x%20y",
            json=body("Name three primary colours."),
            headers={"Authorization": "Bearer key-A"},
        )
    assert resp.status_code == 200
    (query,) = upstream.script.queries
    assert query.split("&") == ["b=2", "a=1", "a=x+y"] or query.split("&") == ["b=2", "a=1", "a=x%20y"]


async def test_a_key_in_the_query_is_a_tenant_of_its_own(proxy: Proxy, upstream: Upstream) -> None:
    """The query goes upstream, where a gateway may authenticate by it: two keys sent that way
    never share answers, as two Authorization keys never do."""

    async def status(key: str, text: str) -> str:
        async with httpx.AsyncClient(timeout=30, transport=proxy_transport(proxy)) as http:
            resp = await http.post(
                f"{proxy.base_url}/chat/completions?api-key={key}",
                json=body(text),
                headers={"x-smartcache-session": "shared-session-id"},
            )
        assert resp.status_code == 200
        return resp.headers["x-cache-status"]

    assert await status("key-one", "What is the tallest mountain in Europe?") == "miss"
    assert await status("key-two", "what is the tallest mountain in europe") == "miss"
    assert await status("key-one", "what is the tallest mountain in europe") == "hit"


def proxy_transport(proxy: Proxy) -> httpx.AsyncBaseTransport:
    from tests.conftest import SettledTransport

    return SettledTransport(proxy.settled)


# --- routes and methods nobody serves --------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
async def test_a_wrong_method_on_chat_completions_is_an_openai_error(
    proxy: Proxy, upstream: Upstream, method: str
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.request(method, f"{proxy.base_url}/chat/completions", headers={"Authorization": "Bearer k"})
    error = assert_openai_error(resp, 405)
    assert error["type"] == "invalid_request_error"
    assert error["message"] == f"Invalid method for URL ({method} /v1/chat/completions)"
    assert resp.headers["allow"] == "POST"
    assert upstream.script.calls == []


async def test_an_unknown_v1_route_is_an_openai_404_with_the_upstreams_headers(proxy: Proxy) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.get(f"{proxy.base_url}/no/such/route?x=1")
    error = assert_openai_error(resp, 404)
    assert error["message"].startswith("Invalid URL (GET /v1/no/such/route)")
    assert resp.headers["x-cache-status"] == "bypass"


async def test_the_sdk_reads_an_unknown_route(proxy: Proxy) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        await proxy.client().files.list()
    assert "Invalid URL (GET /v1/files)" in err.value.message


async def test_an_upstream_405_in_plain_text_is_an_openai_error(proxy: Proxy) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.delete(f"{proxy.base_url}/models")  # the scripted upstream serves GET only
    error = assert_openai_error(resp, 405)
    assert error["message"].startswith("Invalid method for URL (DELETE /v1/models)")
    assert resp.headers["allow"] == "GET,HEAD" or set(resp.headers["allow"].split(",")) >= {"GET"}


async def test_real_upstream_routes_still_pass_through(proxy: Proxy) -> None:
    client = proxy.client()
    assert [m.id for m in (await client.models.list()).data] == ["scripted"]
    assert (await client.embeddings.create(model="e", input="hi")).data[0].embedding == [0.1, 0.2]


# --- liveness and readiness ------------------------------------------------------------------------


async def test_healthz_is_liveness_and_readyz_says_the_upstream_answers(proxy: Proxy, upstream: Upstream) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        live = await http.get(str(proxy.server.make_url("/healthz")))
        ready = await http.get(str(proxy.server.make_url("/readyz")))
    assert live.status_code == 200 and live.json()["status"] == "ok"
    assert ready.status_code == 200
    state = ready.json()
    assert state["status"] == "ready"
    assert state["upstream"] | {"checked_s_ago": 0} == {
        "url": upstream.url,
        "reachable": True,
        "status": 200,
        "error": None,
        "checked_s_ago": 0,
    }


async def test_readyz_is_503_while_the_upstream_is_unreachable_and_healthz_stays_ok(
    make_proxy: ProxyFactory, unused_tcp_port: int
) -> None:
    proxy = await make_proxy(upstream=f"http://127.0.0.1:{unused_tcp_port}/v1")
    async with httpx.AsyncClient(timeout=30) as http:
        live = await http.get(str(proxy.server.make_url("/healthz")))
        ready = await http.get(str(proxy.server.make_url("/readyz")))
    assert live.status_code == 200
    assert ready.status_code == 503
    state = ready.json()
    assert state["status"] == "not_ready"
    assert state["upstream"]["reachable"] is False and state["upstream"]["status"] is None
    assert "unreachable" in state["upstream"]["error"]


async def test_readyz_probes_once_per_ttl(proxy: Proxy, upstream: Upstream) -> None:
    readiness = proxy.app[keys.READINESS]
    now = [1000.0]
    readiness.clock = lambda: now[0]
    readiness.last = None
    first = await readiness.check()
    await upstream.server.close()  # gone: a cached answer still says reachable, a fresh probe not
    assert await readiness.check() is first
    now[0] += readiness.ttl
    again = await readiness.check()
    assert not again.reachable and again.checked_at == now[0]


async def test_a_forward_that_finds_the_upstream_gone_makes_readyz_503_at_once(
    proxy: Proxy, upstream: Upstream
) -> None:
    ready_url = str(proxy.server.make_url("/readyz"))
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.get(ready_url)).status_code == 200  # kept for the probe's ttl
        port = upstream.server.port
        await upstream.server.close()
        with pytest.raises(openai.APIStatusError) as failed:
            await chat(proxy.client(), ask("What is the capital of France?"))
        assert failed.value.status_code == 502
        ready = await http.get(ready_url)  # no wait: the failed forward said it
        assert ready.status_code == 503 and ready.json()["upstream"]["reachable"] is False
        back = TestServer(scripted_app(upstream.script), host="127.0.0.1", port=port)
        await back.start_server()
        try:
            status, _, _ = await chat(proxy.client(), ask("What is the capital of Spain?"))
            assert status == "miss"
            ready = await http.get(ready_url)  # no wait either: the forward that came back said it
            assert ready.status_code == 200 and ready.json()["upstream"]["reachable"] is True
        finally:
            await back.close()
