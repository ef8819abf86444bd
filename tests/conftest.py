from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web_app
import httpx
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from proxy.embedding.backends import SyncEmbedder
from proxy.embedding.packs import install_pack, load_embedder
from proxy.http import keys
from proxy.http.app import create_app
from proxy.observability.metrics import Metrics
from proxy.service.compose import Parts, open_parts
from proxy.settings import Settings, load_settings
from tests.scripted_upstream import Script, scripted_app

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DEFAULT_PACK = Settings.embedding_model  # the tests run the shipped default
# Markers follow from the fixtures a test asks for, directly or through another fixture, so a new
# test that needs a model or the engine is marked without anyone remembering to. Tests that start
# the engine without its fixture carry `pytest.mark.engine` themselves.
MODEL_FIXTURES = frozenset({"model_home", "sync_embedder", "packs_dir", "embedders"})
ENGINE_FIXTURES = frozenset({"engine"})


# Every test fails past pyproject's `timeout` (near 30 s) unless it opts in to more: a test of one
# of these markers gets its marker's limit, and a test that knows its own need says so with
# `pytest.mark.timeout(N)`, which wins. The limit covers fixture setup, so the first model test
# of a run also builds the embedding pack.
MARKER_TIMEOUTS = {"engine": 600, "slow": 600, "model": 180}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & MODEL_FIXTURES:
            item.add_marker(pytest.mark.model)
        if used & ENGINE_FIXTURES:
            item.add_marker(pytest.mark.engine)
        limits = [limit for name, limit in MARKER_TIMEOUTS.items() if item.get_closest_marker(name)]
        if limits and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(max(limits)))


@pytest.fixture(autouse=True)
def _aiohttp_forgets_finished_apps() -> Iterator[None]:
    """aiohttp keeps the middleware chains of the last 1024 applications in an lru_cache keyed by
    the applications themselves (``web_app._cached_build_middleware``), and so every part each
    one owns: one process serves one app, but a test session builds hundreds, each with its own
    index and segmenter, and would hold them all until it runs out of memory."""
    yield
    cached = getattr(aiohttp.web_app, "_cached_build_middleware", None)
    if cached is not None:
        cached.cache_clear()


@pytest.fixture(scope="session")
def model_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Packs are built once per run (or taken from SMARTCACHE_TEST_MODEL_HOME to share across runs)."""
    home = Path(os.environ.get("SMARTCACHE_TEST_MODEL_HOME") or tmp_path_factory.mktemp("model_home"))
    install_pack(DEFAULT_PACK, home, progress=False)
    return home


@pytest.fixture(scope="session")
def sync_embedder(model_home: Path) -> SyncEmbedder:
    return load_embedder(DEFAULT_PACK, model_home, auto_install=False)


@pytest.fixture
async def parts(tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path) -> AsyncIterator[Parts]:
    """The app's parts (the real signer, store, index and policy) on the shipped settings, with no
    upstream: for tests of signing and deciding without HTTP."""
    settings = load_settings(
        environ={}, overrides={"data_dir": tmp_path, "model_home": model_home, "upstream": "http://127.0.0.1:9/v1"}
    )
    async with open_parts(
        settings, upstream_url="http://127.0.0.1:9/v1", metrics=Metrics(), backend=sync_embedder
    ) as p:
        yield p


@dataclass
class Upstream:
    script: Script
    server: TestServer

    @property
    def url(self) -> str:
        return str(self.server.make_url("/v1"))


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    script = Script()
    server = TestServer(scripted_app(script), host="127.0.0.1")
    await server.start_server()
    yield Upstream(script, server)
    await server.close()


class _SettledBody(httpx.AsyncByteStream):
    def __init__(self, body: httpx.AsyncByteStream, settle: Callable[[], Awaitable[None]]) -> None:
        self.body, self.settle = body, settle

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.body:
            yield chunk

    async def aclose(self) -> None:
        await self.body.aclose()
        await self.settle()


class SettledTransport(httpx.AsyncBaseTransport):
    """httpx's own transport, each response closing only once the proxy's bookkeeping after its
    replies is done (proxy.service.settling).

    In process, the proxy and the test share one event loop, so that bookkeeping would run between
    the test's statements; a client elsewhere sees it done a round trip later. Tests of reading
    the store right after a reply use a client made with ``settled=False``."""

    def __init__(self, settle: Callable[[], Awaitable[None]]) -> None:
        self.inner, self.settle = httpx.AsyncHTTPTransport(), settle

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_SettledBody(response.stream, self.settle),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Proxy:
    server: TestServer
    settings: Settings
    app: web.Application

    @property
    def base_url(self) -> str:
        return str(self.server.make_url("/v1"))

    def client(self, api_key: str = "key-A", *, settled: bool = True, **headers: str) -> openai.AsyncOpenAI:
        """The official SDK pointed at the proxy; ``settled``: through :class:`SettledTransport`."""
        http = httpx.AsyncClient(transport=SettledTransport(self.settled), timeout=30) if settled else None
        return openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=api_key,
            max_retries=0,
            timeout=30,
            default_headers=headers or None,
            http_client=http,
        )

    async def settled(self) -> None:
        """Until the bookkeeping after every reply given so far is done."""
        await self.app[keys.CHAT].settling.everything()

    async def metric(self, name: str, **labels: str) -> float | None:
        """One sample of the proxy's /metrics as a Prometheus scrape reads it, None when absent."""
        async with aiohttp.ClientSession() as session, session.get(self.server.make_url("/metrics")) as resp:
            text = await resp.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return None

    async def stop(self) -> None:
        await self.server.close()


ProxyFactory = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def make_proxy(
    tmp_path: Path, model_home: Path, sync_embedder: SyncEmbedder, upstream: Upstream
) -> AsyncIterator[ProxyFactory]:
    started: list[Proxy] = []

    async def factory(*, backend: SyncEmbedder | None = None, **overrides: Any) -> Proxy:
        values: dict[str, Any] = {
            "upstream": upstream.url,
            "data_dir": tmp_path / "data",
            "model_home": model_home,
            "ready_after": 0.0,
            "upstream_timeout": 5.0,
            # the shipped 1 s embedder deadline turns requests into overload bypasses when the
            # suite shares the cores with other work; the tests of that deadline set their own
            "embed_timeout_ms": 30_000.0,
            # the model judge examines the upstream's model on its first request, which would add
            # calls to every test that counts or scripts its upstream's; the judge's own tests
            # (tests/e2e/test_judge.py, the default experience's reworded question) turn it on
            "judge": False,
        }
        values.update(overrides)
        settings = load_settings(environ={}, overrides=values)
        server = TestServer(create_app(settings, backend=backend or sync_embedder), host="127.0.0.1")
        await server.start_server()
        proxy = Proxy(server, settings, server.app)
        started.append(proxy)
        return proxy

    yield factory
    for proxy in started:
        await proxy.stop()


@pytest.fixture
async def proxy(make_proxy: ProxyFactory) -> Proxy:
    return await make_proxy()
