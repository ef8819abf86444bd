"""The compose stack's two-replica profile, checked without a Docker engine: two proxy replicas
store in the stack's Redis, each with its own data dir, behind an nginx that balances over both
at the port each listens on."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest

from proxy.cli import build_parser, settings_from
from proxy.settings import load_settings
from tests.deploy.test_compose import argv, host_path, listens_on, load_compose

REPLICAS = ("replica-a", "replica-b")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def test_the_profile_holds_redis_the_replicas_and_the_balancer(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {name for name, s in services.items() if s.get("profiles") == ["replicas"]} == {*REPLICAS, "redis", "lb"}
    assert "profiles" not in services["llamacpp"]  # the engine they forward to starts with them


@pytest.mark.parametrize("name", REPLICAS)
def test_each_replica_serves_from_the_stacks_redis(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    args = build_parser().parse_args(argv(service)[1:])
    assert args.command == "serve" and args.host == "0.0.0.0"
    served = settings_from(args)
    settings = load_settings(environ=service["environment"], overrides={"port": served.port})
    assert settings.store == "redis"
    url = urlsplit(settings.redis_url)
    assert url.hostname == "redis" and url.port == listens_on(compose, "redis")
    assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    assert f"127.0.0.1:{served.port}/readyz" in " ".join(service["healthcheck"]["test"])


def test_replicas_differ_only_in_their_data_dir(compose: dict[str, Any]) -> None:
    a, b = (compose["services"][name] for name in REPLICAS)
    assert {k: v for k, v in a.items() if k != "volumes"} == {k: v for k, v in b.items() if k != "volumes"}
    assert a["volumes"] != b["volumes"] and all(
        v.split(":")[0] in compose["volumes"] for v in a["volumes"] + b["volumes"]
    )


def test_redis_keeps_its_records_and_answers_its_healthcheck(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    command = argv(redis)
    assert command[0] == "redis-server" and command[command.index("--appendonly") + 1] == "yes"
    assert str(listens_on(compose, "redis")) in redis["healthcheck"]["test"]


def test_the_balancer_spreads_over_both_replicas(compose: dict[str, Any]) -> None:
    lb = compose["services"]["lb"]
    conf = host_path(lb, "/etc/nginx/nginx.conf").read_text(encoding="utf-8")
    servers = re.findall(r"^\s*server\s+([\w-]+):(\d+);", conf, flags=re.M)
    assert sorted(servers) == sorted((name, str(listens_on(compose, name))) for name in REPLICAS)
    (listen,) = re.findall(r"^\s*listen\s+(\d+);", conf, flags=re.M)
    assert lb["ports"] == [f"8081:{listen}"]
    assert set(lb["depends_on"]) == set(REPLICAS)
