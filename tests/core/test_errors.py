"""proxy/core/errors.py: one error tree. Every exception class the package defines derives from
``SmartCacheError``, and those that callers catch by a builtin base keep it. An upstream error
reaches the client as an OpenAI-style JSON error with the upstream's headers."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import httpx
import openai
import pytest

import proxy
from proxy.core.errors import ClientError, ConfigError, ServiceError, SmartCacheError, UpstreamError
from proxy.core.policy import PolicyError
from proxy.core.policy_values import BadValue
from proxy.embedding.errors import PackError
from proxy.microbatch import Overloaded
from proxy.settings import SettingsError
from proxy.storage.base import StoreMismatch, StoreUnavailable
from proxy.tools.datasets.traces import TraceError
from proxy.upstream.engine import EngineError
from proxy.verify import VerifierError
from tests.conftest import ProxyFactory, Upstream


def _package_modules() -> list[str]:
    """Every module of the package that imports here; ``__main__`` modules run a CLI on import."""
    names = []
    for info in pkgutil.walk_packages(proxy.__path__, "proxy."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:  # an optional extra (train, report, engine) not installed
            if (exc.name or "").startswith("proxy"):
                raise
            continue
        names.append(info.name)
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    found = {}
    for name in _package_modules():
        for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass):
            # a Warning is issued through warnings.warn as a category, never raised as an error
            if cls.__module__ == name and issubclass(cls, BaseException) and not issubclass(cls, Warning):
                found[f"{name}.{cls.__qualname__}"] = cls
    return found


def test_every_exception_class_is_in_the_tree() -> None:
    found = _exception_classes()
    assert len(found) >= 20  # the walk found the package, not an empty list
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, SmartCacheError))
    assert outside == []


@pytest.mark.parametrize(
    ("cls", "branch", "builtin"),
    [
        (SettingsError, ConfigError, ValueError),
        (PolicyError, ConfigError, ValueError),
        (BadValue, ConfigError, Exception),
        (PackError, ConfigError, Exception),
        (StoreMismatch, ConfigError, ValueError),
        (TraceError, ConfigError, ValueError),
        (VerifierError, ConfigError, Exception),
        (StoreUnavailable, ServiceError, RuntimeError),
        (EngineError, ServiceError, RuntimeError),
        (Overloaded, ServiceError, Exception),
    ],
)
def test_branch_and_builtin_base(cls: type[Exception], branch: type[SmartCacheError], builtin: type[Exception]) -> None:
    assert issubclass(cls, branch)
    assert issubclass(cls, builtin)
    assert not issubclass(cls, ClientError | UpstreamError)  # never answered to a client as its own fault


def test_domain_errors_keep_their_fields_and_message() -> None:
    settings = SettingsError("env", "port", "expected int")
    assert (str(settings), settings.message, settings.key) == ("env: port: expected int",) * 2 + ("port",)
    policy = PolicyError("p.yaml", "intents.x", "bad")
    assert (str(policy), policy.file) == ("p.yaml: intents.x: bad", "p.yaml")
    busy = Overloaded("embedder", "full")
    assert (str(busy), busy.name, busy.why) == ("embedder overloaded: full", "embedder", "full")
    assert str(PackError("missing")) == "missing"


# An upstream error reaches the client as an OpenAI-style JSON error whatever the upstream sent:
# its own OpenAI error passes as it came, anything else (a plain-text 404 from a base URL that
# misses the API path) is wrapped with the status kept.
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
