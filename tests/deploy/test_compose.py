"""The compose stack and the Dockerfile, checked without a Docker engine.

docker-compose.yml: validated by `docker-compose config` where Debian's docker-compose is
installed (it parses without an engine), and always by structural checks: every service's
command parses with the parser of the program it runs, every URL one service uses names
another service and the port that service listens on, and every file a container reads is in
the repository at the path the container expects. Dockerfile: it installs the same package and
the same pinned extras as scripts/install.sh, copies what the package build needs, and brings
the native libraries our wheels link against.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from proxy.cli import build_parser, settings_from
from proxy.settings import Settings
from proxy.upstream.engine import _parse_args as engine_args

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")
GPU_ENV = {"SMARTCACHE_UPSTREAM": "http://vllm:8000/v1", "SMARTCACHE_FLAVOUR": "vllm"}
REPLICAS = {"replica-a", "replica-b", "redis", "lb"}
ROUTER = {"smartcache-router", "router", "engine-a", "engine-b"}  # test_compose_router.py


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ``${VAR:-default}`` substitution, over a whole parsed document."""
    if isinstance(value, str):
        return INTERPOLATION.sub(lambda m: env.get(m.group(1), m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    return interpolate(yaml.safe_load(COMPOSE.read_text(encoding="utf-8")), env or {})  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def argv(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def option(args: list[str], name: str) -> str:
    """The value of ``--name value`` or ``--name=value``."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {args}")


def bind_mounts(service: dict[str, Any]) -> Iterator[tuple[Path, PurePosixPath]]:
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            yield (ROOT / source).resolve(), PurePosixPath(target)


def host_path(service: dict[str, Any], container_path: str) -> Path:
    """Where, in the repository, a container path of a bind mount comes from."""
    wanted = PurePosixPath(container_path)
    for source, target in bind_mounts(service):
        if wanted == target or target in wanted.parents:
            return source / wanted.relative_to(target)
    raise AssertionError(f"{container_path} is not inside any bind mount of {service}")


def listens_on(compose: dict[str, Any], name: str) -> int:
    """The port a service binds inside its container, read from its own command line."""
    service = compose["services"][name]
    if name == "prometheus":
        return 9090  # Prometheus' default --web.listen-address, which the stack does not change
    return int(option(argv(service), "--port"))


def test_services_and_profiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    core = {"smartcache", "smartcache-gpu", "llamacpp", "vllm", "prometheus", "grafana"}
    assert set(services) == core | REPLICAS | ROUTER
    # everything but vLLM, its proxy, the replicas and the router's stack runs on a plain `docker
    # compose up`; vLLM and its proxy only with --profile gpu, the replicas with --profile replicas
    # (test_compose_replicas.py), the router's with --profile router (test_compose_router.py)
    assert {name for name, s in services.items() if "profiles" in s} == {"vllm", "smartcache-gpu"} | REPLICAS | ROUTER
    assert services["vllm"]["profiles"] == services["smartcache-gpu"]["profiles"] == ["gpu"]
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        if "build" in service:
            context = ROOT / service["build"]["context"]
            assert (context / service["build"].get("dockerfile", "Dockerfile")).is_file()
    published = [p.split(":")[0] for s in services.values() for p in s.get("ports", [])]
    assert len(published) == len(set(published))
    named = {v.split(":")[0] for s in services.values() for v in s.get("volumes", []) if not v.startswith(".")}
    assert named == set(compose["volumes"])


@pytest.mark.parametrize("env", [{}, GPU_ENV], ids=["cpu", "gpu"])
def test_smartcache_command_parses_and_points_at_an_engine_service(env: dict[str, str]) -> None:
    compose = load_compose(env)
    command = argv(compose["services"]["smartcache"])
    assert command[0] == "smartcache"
    args = build_parser().parse_args(command[1:])
    assert args.command == "serve" and args.host == "0.0.0.0"
    settings = settings_from(args)  # validated as at start-up: flavour known, upstream an http(s) URL
    upstream = urlsplit(settings.upstream or "")
    host = upstream.hostname or ""
    assert upstream.path == "/v1" and host in compose["services"]
    assert upstream.port == listens_on(compose, host)
    assert settings.upstream_flavour == ("vllm" if env else "llamacpp")
    assert settings.port == 8080 and "8080:8080" in compose["services"]["smartcache"]["ports"]


def test_llamacpp_runs_our_engine_on_all_interfaces(compose: dict[str, Any]) -> None:
    command = argv(compose["services"]["llamacpp"])
    assert command[:3] == ["python", "-m", "proxy.upstream.engine"]
    args = engine_args(command[3:])
    assert (args.host, args.port) == ("0.0.0.0", 8080)
    assert compose["services"]["llamacpp"]["image"] == compose["services"]["smartcache"]["image"]
    assert compose["services"]["smartcache"]["depends_on"]["llamacpp"]["condition"] == "service_healthy"


def test_healthchecks_probe_the_right_port(compose: dict[str, Any]) -> None:
    for name, path in (("smartcache", "/readyz"), ("llamacpp", "/health")):
        probe = " ".join(compose["services"][name]["healthcheck"]["test"])
        assert f"http://127.0.0.1:{listens_on(compose, name)}{path}" in probe


def test_vllm_reports_prefix_cache_hits_on_a_gpu(compose: dict[str, Any]) -> None:
    vllm = compose["services"]["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    command = argv(vllm)
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(command)
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def test_prometheus_reads_the_shipped_config_and_scrapes_smartcache(compose: dict[str, Any]) -> None:
    service = compose["services"]["prometheus"]
    config_file = host_path(service, option(argv(service), "--config.file"))
    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    for rule_file in config["rule_files"]:
        assert host_path(service, rule_file).is_file()
    targets = [t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    for target in targets:
        host, port = target.split(":")
        assert host in compose["services"] and int(port) == listens_on(compose, host)


def test_grafana_gets_the_datasource_and_the_dashboard(compose: dict[str, Any]) -> None:
    service = compose["services"]["grafana"]
    provisioning = host_path(service, "/etc/grafana/provisioning")
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text(encoding="utf-8"))
    url = urlsplit(datasources["datasources"][0]["url"])
    assert url.hostname in compose["services"] and url.port == listens_on(compose, str(url.hostname))
    providers = yaml.safe_load((provisioning / "dashboards" / "smartcache.yml").read_text(encoding="utf-8"))
    dashboards = host_path(service, providers["providers"][0]["options"]["path"])
    assert (dashboards / "smartcache.json").is_file()
    assert host_path(service, service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]).is_file()


def test_every_bind_mount_source_is_in_the_repository(compose: dict[str, Any]) -> None:
    mounts = [(name, source) for name, s in compose["services"].items() for source, _ in bind_mounts(s)]
    assert len(mounts) == 4
    for name, source in mounts:
        assert source.exists() and ROOT in source.parents, (name, source)


DOCKER_COMPOSE = shutil.which("docker-compose")


@pytest.mark.skipif(DOCKER_COMPOSE is None, reason="docker-compose (Debian package) is not installed")
@pytest.mark.parametrize("env", [{}, GPU_ENV], ids=["cpu", "gpu"])
def test_docker_compose_config_validates(env: dict[str, str], tmp_path: Path) -> None:
    assert DOCKER_COMPOSE is not None
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SMARTCACHE_", "VLLM_", "COMPOSE_"))}
    run = subprocess.run(
        [DOCKER_COMPOSE, "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**clean, **env},
    )
    assert run.returncode == 0, run.stderr
    rendered = yaml.safe_load(run.stdout)
    assert set(rendered["services"]) == set(load_compose()["services"])
    assert rendered["services"]["vllm"]["profiles"] == ["gpu"]
    # compose's own interpolation gives the command line the structural tests parse
    assert argv(rendered["services"]["smartcache"]) == argv(load_compose(env)["services"]["smartcache"])
    # the validator is not a rubber stamp: the same file with one misspelt key is refused
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text(encoding="utf-8").replace("    healthcheck:", "    healthchek:", 1))
    run = subprocess.run(
        [DOCKER_COMPOSE, "-f", str(broken), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=clean,
    )
    assert run.returncode != 0 and "healthchek" in run.stderr


# --- Dockerfile -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    stage: int
    op: str
    args: str


def dockerfile() -> list[Instruction]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text(encoding="utf-8"))
    out: list[Instruction] = []
    stage = -1
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        stage += op.upper() == "FROM"
        out.append(Instruction(stage, op.upper(), " ".join(rest.split())))
    return out


def env_of(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in instructions:
        if ins.op == "ENV" and ins.stage == instructions[-1].stage:
            env.update(dict(part.split("=", 1) for part in shlex.split(ins.args)))
    return env


def pins(text: str) -> set[str]:
    """``name==version`` requirements installed with --no-deps."""
    found: set[str] = set()
    for line in text.splitlines():
        if "pip install" in line and "--no-deps" in line:
            found |= {w.strip("\"'") for w in shlex.split(line, comments=True) if "==" in w}
    return found


def pip_lines(instructions: list[Instruction]) -> list[str]:
    return [
        part.strip()
        for ins in instructions
        if ins.op == "RUN"
        for part in ins.args.split("&&")
        if "pip install" in part
    ]


def test_dockerfile_base_image_satisfies_requires_python() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    minimum = tuple(int(n) for n in re.fullmatch(r">=(\d+)\.(\d+)", project["requires-python"]).groups())  # type: ignore[union-attr]
    bases = [ins.args.split()[0] for ins in dockerfile() if ins.op == "FROM"]
    assert bases and all(re.fullmatch(r"python:3\.\d+-slim", base) for base in bases)
    assert all(tuple(int(n) for n in base[len("python:") : -len("-slim")].split(".")) >= minimum for base in bases)


def test_dockerfile_installs_the_package_and_the_pins_of_install_sh() -> None:
    instructions = dockerfile()
    lines = pip_lines(instructions)
    # the source tree itself, with or without extras (`.` or `".[engine]"`)
    project = [
        line
        for line in lines
        if re.fullmatch(r"\.(\[[\w,-]+\])?", line.split()[-1].strip("\"'")) and "-e" not in line.split()
    ]
    assert project, "the image installs the project from its source tree, not an editable checkout"
    assert "engine" in project[0], "the compose stack's llamacpp service runs the engine from this image"
    install_sh = (ROOT / "scripts" / "install.sh").read_text(encoding="utf-8")
    assert pins(install_sh) and pins("\n".join(lines)) == pins(install_sh)


def test_dockerfile_copies_what_the_package_build_and_the_runtime_read() -> None:
    instructions = dockerfile()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    copied = {
        src
        for ins in instructions
        if ins.op == "COPY" and not ins.args.startswith("--from")
        for src in ins.args.split()[:-1]
    }
    tool = pyproject["tool"]["setuptools"]
    # a subpackage (proxy.core.text) is copied with the folder of its top-level package
    needed = {
        "pyproject.toml",
        pyproject["project"]["readme"],
        *(tool.get("package-dir", {}).get(p, p.split(".")[0]) for p in tool["packages"]),
    }
    assert "policies" in needed
    assert needed <= copied
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    for src in copied:
        assert (ROOT / src).exists(), src
        assert not dockerignored(src, ignored), f"{src} is copied but .dockerignore drops it from the context"
    for private in (".venv", ".git", ".smartcache", "tests/__pycache__"):
        assert dockerignored(private, ignored), private


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents decides."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for raw in patterns:
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        glob = rule.removeprefix("!")
        if glob.startswith("**/"):
            hit = any(fnmatch.fnmatch(PurePosixPath(p).name, glob[3:]) for p in prefixes)
        else:
            hit = any(fnmatch.fnmatch(p, glob) for p in prefixes)
        if hit:
            excluded = not rule.startswith("!")
    return excluded


def test_dockerfile_environment_names_real_settings_and_files() -> None:
    instructions = dockerfile()
    env = env_of(instructions)
    known = {f.name for f in fields(Settings)}
    for key in (k for k in env if k.startswith("SMARTCACHE_")):
        assert key.removeprefix("SMARTCACHE_").lower() in known, key
    # the image reads the policies shipped inside the wheel, so the one for its pack is picked
    assert "SMARTCACHE_POLICY" not in env
    commands = [ins.args for ins in instructions if ins.op == "RUN" and "smartcache models" in ins.args]
    (models,) = commands
    args = build_parser().parse_args(shlex.split(models)[1:])
    assert (args.action, args.name) == ("install", Settings().embedding_model)
    assert str(args.data_dir) == env["SMARTCACHE_MODEL_HOME"]
    (cmd,) = [ins.args for ins in instructions if ins.op == "CMD"]
    served = build_parser().parse_args(yaml.safe_load(cmd)[1:])
    assert served.command == "serve" and served.host == "0.0.0.0"


def native_libraries(distribution: str) -> set[str]:
    """Shared libraries the distribution's extension modules link against, by soname."""
    files = importlib.metadata.files(distribution) or []
    libs: set[str] = set()
    for file in files:
        if ".so" in file.name:
            out = subprocess.run(["ldd", str(file.locate())], capture_output=True, text=True, check=False).stdout
            libs |= {line.split()[0] for line in out.splitlines() if "=>" in line}
    return libs


# in python:3.11-slim already (glibc, and the C++ runtime the interpreter's own modules need)
SLIM_HAS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libgcc_s.so.1", "libstdc++.so.6"}
DEBIAN_PACKAGE = {"libgomp.so.1": "libgomp1"}


@pytest.mark.skipif(shutil.which("ldd") is None, reason="ldd is not available")
def test_runtime_image_has_the_native_libraries_the_engine_links() -> None:
    instructions = dockerfile()
    final = instructions[-1].stage
    apt = " ".join(ins.args for ins in instructions if ins.op == "RUN" and ins.stage == final and "apt-get" in ins.args)
    needed = {lib for lib in native_libraries("xllamacpp") if "xllamacpp" not in lib} - SLIM_HAS
    assert needed, "xllamacpp links against OpenMP on this platform"
    for lib in needed:
        assert lib in DEBIAN_PACKAGE, f"map {lib} to its Debian package and install it in the image"
        assert DEBIAN_PACKAGE[lib] in apt.split(), f"{lib}: the runtime stage must install {DEBIAN_PACKAGE[lib]}"


def test_build_stage_can_compile_what_has_no_wheel() -> None:
    """hnswlib has no wheel for this Python, so it was compiled here and will be in the image."""
    wheel = importlib.metadata.distribution("hnswlib").read_text("WHEEL") or ""
    if "manylinux" in wheel:
        pytest.skip("hnswlib came from a binary wheel here")
    instructions = dockerfile()
    builder = [ins for ins in instructions if ins.stage == 0]
    apt = " ".join(ins.args for ins in builder if ins.op == "RUN" and "apt-get" in ins.args).split()
    assert {"build-essential", "g++"} & set(apt)
    assert any("pip install" in ins.args for ins in builder if ins.op == "RUN")
    assert any(ins.op == "COPY" and ins.args.startswith("--from=") for ins in instructions if ins.stage > 0)
