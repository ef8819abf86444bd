"""Each proxy service waits for the engine it forwards to: llama.cpp for the proxy of a plain
`docker compose up`, vLLM (whose model load takes minutes: requests before it would 502) for the
proxy of `--profile gpu`; and no service of the default set depends on one that a profile
switches off, which would make a plain `up` refuse to start."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from proxy.cli import build_parser, settings_from
from tests.deploy.test_compose import argv, listens_on, load_compose, option


def _enabled(compose: dict[str, Any], profiles: set[str]) -> set[str]:
    return {n for n, s in compose["services"].items() if not s.get("profiles") or set(s["profiles"]) & profiles}


@pytest.mark.parametrize(("proxy", "engine"), [("smartcache", "llamacpp"), ("smartcache-gpu", "vllm")])
def test_each_proxy_waits_for_the_engine_it_forwards_to(proxy: str, engine: str) -> None:
    compose = load_compose()
    service = compose["services"][proxy]
    upstream = urlsplit(option(argv(service), "--upstream"))
    assert upstream.hostname == engine and upstream.port == listens_on(compose, engine)
    assert service["depends_on"][engine]["condition"] == "service_healthy"
    assert "healthcheck" in compose["services"][engine]


def test_the_gpu_proxy_parses_as_a_vllm_flavoured_serve() -> None:
    command = argv(load_compose()["services"]["smartcache-gpu"])
    settings = settings_from(build_parser().parse_args(command[1:]))
    assert settings.upstream_flavour == "vllm" and settings.upstream == "http://vllm:8000/v1"


@pytest.mark.parametrize("profiles", [set(), {"gpu"}, {"replicas"}, {"gpu", "replicas"}])
def test_no_started_service_depends_on_one_its_profiles_leave_off(profiles: set[str]) -> None:
    compose = load_compose()
    enabled = _enabled(compose, profiles)
    for name in enabled:
        for dependency in compose["services"][name].get("depends_on", {}):
            assert dependency in enabled, (name, dependency, profiles)


def test_vllm_healthcheck_probes_its_own_port() -> None:
    compose = load_compose()
    probe = " ".join(compose["services"]["vllm"]["healthcheck"]["test"])
    assert f"http://127.0.0.1:{listens_on(compose, 'vllm')}/health" in probe
