"""Frozen settings, built once: defaults, then a YAML file, then ``SMARTCACHE_*`` environment
variables, then command-line flags. Validated at load: a bad value fails at start with the
source, the key and the fix, never mid-request."""

from __future__ import annotations

import dataclasses
import difflib
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_type_hints

import yaml

from proxy.core.errors import ConfigError
from proxy.storage.backends import BACKENDS
from proxy.upstream.hints import FLAVOURS

PREFIX = "SMARTCACHE_"  # of the environment variables read as settings


def _policies_dir() -> Path:
    """Shipped policies: package data of an installed wheel (proxy/policies), else the checkout's
    top-level policies/ (where an editable install and the tests read them)."""
    here = Path(__file__).resolve().parent
    installed = here / "policies"
    return installed if installed.is_dir() else here.parent / "policies"


POLICIES = _policies_dir()
DEFAULT_POLICY = POLICIES / "default.yaml"  # calibrated for the default embedding pack


def shipped_policy(embedding_model: str) -> Path:
    """The shipped policy calibrated for a pack (``policies/<pack>.yaml``), else the default one."""
    own = POLICIES / f"{embedding_model}.yaml"
    return own if "/" not in embedding_model and own.is_file() else DEFAULT_POLICY


class SettingsError(ConfigError, ValueError):
    def __init__(self, source: str, key: str, reason: str) -> None:
        super().__init__(f"{source}: {key}: {reason}")
        self.source, self.key, self.reason = source, key, reason


@dataclass(frozen=True)
class Settings:
    upstream: str | None = None  # None: start the embedded llama.cpp engine and proxy to it
    upstream_flavour: str = "generic"
    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path = field(default_factory=lambda: Path(".smartcache"))
    # where records live, a name of proxy/storage/backends.py: "sqlite" (data_dir, one replica) or
    # "redis" (redis_url, shared by replicas)
    store: str = "sqlite"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # auto: probe the Redis server for vector search (FT.*) at start and report it (log, /metrics);
    # off: do not probe. The replica's own HNSW index searches either way (proxy/storage/redis_probe.py)
    redis_vector_search: str = "auto"
    policy: Path | None = None  # None: the shipped policy for the embedding pack (shipped_policy)
    embedding_model: str = "use-multilingual"
    model_home: Path | None = None  # model packs live in <model_home>/models; default: data_dir
    embed_threads: int = 0  # 0: half the cores (service.compose.model_threads)
    embed_max_batch: int = 32
    embed_max_wait_ms: float = 2.0
    # requests waiting for the embedder, and how long one waits; beyond either it is forwarded uncached
    embed_max_pending: int = 128
    embed_timeout_ms: float = 1000.0
    # tokens of the conversation's view that are embedded (0: the model's length). A view's cost
    # grows with its length (bench_view_length.py); the turns past it still count through chunk
    # vectors, their entities through the hard filters, their words through the history key.
    # 128, 256 and the model's 504 made the same decisions on the replay harness's traces and on
    # ours (docs/architecture.md, "The encoding view")
    view_tokens: int = 128
    ready_after: float = 60.0  # feedback window before a pending answer becomes reusable
    regenerate_window: float = 600.0  # the identical request re-sent within this is a regenerate
    max_body_bytes: int = 10 * 1024 * 1024  # chat requests, which are read whole
    # messages in one chat request; the body limit alone lets through hundreds of thousands of
    # empty turns, each normalised and tagged
    max_messages: int = 4096
    # other /v1 routes stream both ways, so this guards the upstream, not our memory; OpenAI's
    # own file uploads go up to 512 MB
    passthrough_max_body_bytes: int = 512 * 1024 * 1024
    # the HTTP server's own limits, applied by aiohttp's parser before any handler runs: a request
    # past them is refused with 400 and its connection closed
    max_request_line_bytes: int = 8190  # method, path and query string
    max_header_bytes: int = 8190  # one header line (its name or its value)
    max_headers: int = 128
    # an idle client connection (before its first request or between two) is closed after this;
    # aiohttp's own default is an hour, which lets idle sockets pile up to the descriptor limit.
    # Above a load balancer's idle timeout (60 s on AWS's ALB), so the balancer lets go first
    keepalive_timeout: float = 75.0
    # open client connections; one more is answered 503 and closed. Lowered at start to what the
    # descriptor limit leaves once the upstream pool and the store have theirs
    max_connections: int = 16_384
    upstream_timeout: float = 600.0
    upstream_connect_timeout: float = 10.0
    top_k: int = 8
    max_records: int = 100_000
    max_answer_bytes: int = 512 * 1024 * 1024
    sweep_interval: float = 30.0
    admin_token: str | None = None
    debug_headers: bool = False
    log_level: str = "info"
    # from which level stdlib (third-party) loggers reach the log, never below log_level: at debug,
    # aiosqlite alone writes a line per SQL statement
    log_libraries: str = "warning"
    engine_ctx: int = 4096
    engine_parallel: int = 4
    engine_threads: int = 0
    # KV prewarm after every direct hit, whatever the intent's policy says (see proxy/prewarm.py)
    prewarm: bool = False
    prewarm_concurrency: int = 2  # prewarms in flight at once; more are dropped, never queued
    coalesce: bool = True  # concurrent identical requests share one upstream call (proxy/coalesce.py)
    # send the upstream call while the cache decides, and cancel it on a hit (proxy/http/race.py):
    # auto races the engines that abort a cancelled request (vllm, sglang, llamacpp), not a paid API
    race_upstream: str = "auto"
    # an upstream attempt that failed before the client got a byte (refused connection, 500, 502,
    # 503, 504) is sent once more with the same routing key: behind a router, a replica that has
    # just died costs no client error (proxy/upstream/retry.py)
    upstream_retry: bool = True
    # a half-hit is routed by its related record's session when they share this many characters of
    # prompt (system prompt, and the history when it is the same): the replica that holds that
    # prefix serves it (proxy/upstream/routing.py). 0: whenever they share any; a huge value: never
    route_related_min_chars: int = 4096
    # the pair verifier, loaded at start when an intent of the policy sets verify_accept (proxy/verify);
    # off: those intents serve no hits. Local files only, never a download.
    verify: bool = True
    verify_threads: int = 0  # 0: half the cores (service.compose.model_threads)
    verify_max_batch: int = 16
    verify_max_pending: int = 64  # verifications waiting; beyond it a lookup half-hits instead of queueing
    verify_timeout_ms: float = 1000.0  # 0: wait for every verdict (offline replay and calibration)
    # the judge (docs/architecture.md, "The judge"): the model behind the proxy reads the gray zone
    # of the intents whose policy sets `judge`, once it has passed its exam. The upstream and the
    # request's model by default; a judge URL and model of its own (a smaller model on the engine)
    judge: bool = True
    judge_url: str | None = None
    judge_model: str | None = None
    judge_max_concurrent: int = 8  # judge calls in flight; over it a gray-zone request is a plain miss
    judge_timeout: float = 5.0
    judge_exam_interval: float = 3600.0  # seconds between a model's exams

    @property
    def policy_file(self) -> Path:
        return self.policy if self.policy is not None else shipped_policy(self.embedding_model)

    @property
    def models_root(self) -> Path:
        return self.model_home or self.data_dir

    @property
    def db_path(self) -> Path:
        return self.data_dir / "cache.sqlite3"

    @property
    def index_snapshot_path(self) -> Path:
        return self.data_dir / "index.hnsw"

    def replace(self, **changes: Any) -> Settings:
        return load_settings(base=self, overrides=changes, environ={}, source="arguments")


def _coerce(source: str, key: str, value: Any, hint: Any) -> Any:
    kinds = [k for k in (get_args(hint) or (hint,)) if k is not type(None)]
    kind = kinds[0]
    if value is None:
        if type(None) in get_args(hint):
            return None
        raise SettingsError(source, key, "must not be empty")
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            lowered = str(value).strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise SettingsError(source, key, f"expected true or false, got {value!r}")
            return lowered in ("1", "true", "yes", "on")
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        if kind in (int, float) and isinstance(value, bool):
            raise ValueError(value)
        if kind is Path:
            return Path(str(value)).expanduser()
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise SettingsError(source, key, f"expected {getattr(kind, '__name__', kind)}, got {value!r}") from exc


def _validate(s: Settings, source_of: Callable[[str], str]) -> None:
    """``source_of(key)``: the layer the value of ``key`` came from, for the error."""
    checks = [
        ("upstream_flavour", s.upstream_flavour in FLAVOURS, f"one of {', '.join(FLAVOURS)}"),
        ("port", 0 <= s.port <= 65535, "a port number 0-65535"),
        ("store", s.store in BACKENDS, f"one of {', '.join(BACKENDS)}"),
        ("redis_url", s.redis_url.startswith(("redis://", "rediss://", "unix://")), "a redis:// URL"),
        ("redis_vector_search", s.redis_vector_search in ("auto", "off"), "auto or off"),
        ("race_upstream", s.race_upstream in ("auto", "on", "off"), "auto, on or off"),
        ("judge_max_concurrent", s.judge_max_concurrent >= 1, ">= 1"),
        ("judge_timeout", s.judge_timeout > 0, "> 0 seconds"),
        ("judge_exam_interval", s.judge_exam_interval > 0, "> 0 seconds"),
        ("ready_after", s.ready_after >= 0, ">= 0 seconds (0 promotes at once)"),
        ("max_body_bytes", s.max_body_bytes >= 1024, ">= 1024"),
        ("max_messages", s.max_messages >= 1, ">= 1"),
        ("passthrough_max_body_bytes", s.passthrough_max_body_bytes >= 1024, ">= 1024"),
        ("top_k", 1 <= s.top_k <= 256, "between 1 and 256"),
        ("max_records", s.max_records >= 1, ">= 1"),
        ("max_request_line_bytes", s.max_request_line_bytes >= 1024, ">= 1024"),
        ("max_header_bytes", s.max_header_bytes >= 1024, ">= 1024"),
        ("max_headers", s.max_headers >= 16, ">= 16"),
        ("keepalive_timeout", s.keepalive_timeout > 0, "> 0 seconds"),
        ("max_connections", s.max_connections >= 1, ">= 1"),
        ("upstream_timeout", s.upstream_timeout > 0, "> 0 seconds"),
        ("embed_max_batch", s.embed_max_batch >= 1, ">= 1"),
        ("embed_max_pending", s.embed_max_pending >= 1, ">= 1"),
        ("embed_timeout_ms", s.embed_timeout_ms > 0, "> 0 milliseconds"),
        ("view_tokens", s.view_tokens == 0 or s.view_tokens >= 64, "0 (the model's length) or >= 64"),
        ("prewarm_concurrency", s.prewarm_concurrency >= 1, ">= 1"),
        ("route_related_min_chars", s.route_related_min_chars >= 0, ">= 0"),
        ("log_level", s.log_level in ("debug", "info", "warning", "error"), "debug, info, warning or error"),
        ("log_libraries", s.log_libraries in ("debug", "info", "warning", "error"), "debug, info, warning or error"),
    ]
    for key, ok, want in checks:
        if not ok:
            raise SettingsError(source_of(key), key, f"must be {want}, got {getattr(s, key)!r}")
    if s.upstream is not None:
        _validate_upstream(s.upstream, source_of("upstream"))


def _validate_upstream(url: str, source: str) -> None:
    """A base URL with no path is refused rather than completed: every OpenAI-compatible server
    we know (vLLM, SGLang, llama.cpp, OpenAI) serves under /v1, but gateways put the API under
    other paths (/api/v1, /openai/v1), so guessing could send traffic to the wrong place."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(source, "upstream", f"must be an http(s) URL such as http://vllm:8000/v1, got {url!r}")
    if parts.path in ("", "/"):
        raise SettingsError(
            source,
            "upstream",
            f"{url!r} has no API path, so every request would miss the API; OpenAI-compatible "
            f"servers serve under /v1: use {url.rstrip('/')}/v1",
        )


def unknown_environment(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``SMARTCACHE_*`` variables that name no setting, each with the closest known variable
    (None when nothing is close). They are ignored at load, so a typo would pass unnoticed."""
    known = [f.name.upper() for f in dataclasses.fields(Settings)]
    unknown = [name for name in sorted(environ) if name.startswith(PREFIX) and name[len(PREFIX) :] not in known]
    # compared without the shared prefix, which would make every name look close
    closest = {name: difflib.get_close_matches(name[len(PREFIX) :], known, n=1, cutoff=0.6) for name in unknown}
    return [(name, f"{PREFIX}{closest[name][0]}" if closest[name] else None) for name in unknown]


def load_settings(
    *,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    base: Settings | None = None,
    source: str = "flags",
) -> Settings:
    hints = get_type_hints(Settings)
    names = {f.name for f in dataclasses.fields(Settings)}
    values: dict[str, Any] = dataclasses.asdict(base) if base else {}
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if config_file is not None:
        try:
            data = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise SettingsError(str(config_file), "-", f"cannot read settings file: {exc}") from exc
        if not isinstance(data, dict):
            raise SettingsError(str(config_file), "-", "must be a mapping of setting: value")
        layers.append((str(config_file), data))
    env = os.environ if environ is None else environ
    layers.append(("environment", {k[len(PREFIX) :].lower(): v for k, v in env.items() if k.startswith(PREFIX)}))
    layers.append((source, {k: v for k, v in (overrides or {}).items() if v is not None}))
    sources: dict[str, str] = {}
    for layer_source, layer in layers:
        for key, value in layer.items():
            if key not in names:
                if layer_source == "environment":
                    continue  # other tools share the prefix (the CLI warns, unknown_environment)
                raise SettingsError(layer_source, key, f"unknown setting; known: {', '.join(sorted(names))}")
            values[key] = _coerce(layer_source, key, value, hints[key])
            sources[key] = layer_source
    settings = Settings(**values)
    _validate(settings, lambda key: sources.get(key, source))
    return settings
