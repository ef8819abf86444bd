"""The compose stack's router profile, checked without a Docker engine: a proxy in front of
vllm-router, which hashes the proxy's x-session-id over two engine replicas of the stack's own
engine, each command parsed by its own program's parser."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from proxy.cli import build_parser, settings_from
from proxy.upstream.engine import _parse_args as engine_args
from tests.deploy.test_compose import argv, listens_on, load_compose

ENGINES = ("engine-a", "engine-b")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def test_the_profile_holds_the_proxy_the_router_and_two_engines(compose: dict[str, Any]) -> None:
    profiled = {name for name, s in compose["services"].items() if s.get("profiles") == ["router"]}
    assert profiled == {"smartcache-router", "router", *ENGINES}


def test_the_proxy_forwards_to_the_router_with_the_vllm_flavour(compose: dict[str, Any]) -> None:
    service = compose["services"]["smartcache-router"]
    settings = settings_from(build_parser().parse_args(argv(service)[1:]))
    upstream = urlsplit(settings.upstream or "")
    assert upstream.hostname == "router" and upstream.port == listens_on(compose, "router") and upstream.path == "/v1"
    assert settings.upstream_flavour == "vllm"  # x-session-id, which consistent_hash reads first
    assert settings.upstream_retry
    assert service["depends_on"]["router"]["condition"] == "service_healthy"


def test_the_router_hashes_sessions_over_both_engines(compose: dict[str, Any]) -> None:
    launch = pytest.importorskip("vllm_router.launch_router", reason="vllm-router is not installed (the router extra)")
    service = compose["services"]["router"]
    command = argv(service)
    assert command[0] == "vllm-router"
    args = launch.parse_router_args(command[1:])
    assert args.policy == "consistent_hash" and args.host == "0.0.0.0"
    # a dead engine's breaker opens within one request's tries: the next try reaches the live one
    assert args.cb_failure_threshold < args.retry_max_retries
    workers = [urlsplit(url) for url in args.worker_urls]
    assert sorted((w.hostname, w.port) for w in workers) == sorted((e, listens_on(compose, e)) for e in ENGINES)
    assert {e: service["depends_on"][e]["condition"] for e in ENGINES} == dict.fromkeys(ENGINES, "service_healthy")
    assert f"127.0.0.1:{args.port}/health" in " ".join(service["healthcheck"]["test"])


@pytest.mark.parametrize("name", ENGINES)
def test_each_engine_is_the_stacks_own_engine(compose: dict[str, Any], name: str) -> None:
    service, reference = compose["services"][name], compose["services"]["llamacpp"]
    args = engine_args(argv(service)[3:])
    assert argv(service)[:3] == ["python", "-m", "proxy.upstream.engine"] and args.host == "0.0.0.0"
    assert service["image"] == reference["image"] and service["command"] == reference["command"]
    assert f"127.0.0.1:{args.port}/health" in " ".join(service["healthcheck"]["test"])
