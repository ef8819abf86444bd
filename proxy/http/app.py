"""The aiohttp application factory. The app owns every part; each resource opens and closes in
one cleanup context, so start-up and shutdown are written once, side by side."""

from __future__ import annotations

from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from proxy.embedding.backends import SyncEmbedder
from proxy.http import keys
from proxy.http.admin import add_admin_routes
from proxy.http.chat import ChatOptions, ChatService
from proxy.http.middlewares import error_middleware
from proxy.http.race import races
from proxy.http.routes import add_routes
from proxy.observability.metrics import Metrics
from proxy.service.compose import Parts, open_parts
from proxy.service.datadir import data_dir_lock, tenant_salt
from proxy.service.lifecycle import Capacity, Lifecycle, running
from proxy.settings import Settings
from proxy.upstream.engine import LocalEngine
from proxy.upstream.hints import as_flavour
from proxy.upstream.readiness import Readiness

log = structlog.get_logger("smartcache")
UPSTREAM_URL = web.AppKey("upstream_url", str)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
BACKEND = web.AppKey("backend", SyncEmbedder)


async def _lock_ctx(app: web.Application) -> AsyncIterator[None]:
    with data_dir_lock(app[keys.SETTINGS].data_dir):
        yield


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[keys.SETTINGS]
    if settings.upstream:
        app[UPSTREAM_URL] = settings.upstream
        yield
        return
    engine = LocalEngine(
        ctx_size=settings.engine_ctx,
        parallel=settings.engine_parallel,
        threads=settings.engine_threads or None,
        log_path=settings.data_dir / "engine.log",
    )
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    async with engine:
        app[UPSTREAM_URL] = engine.base_url
        log.info("engine.started", url=engine.base_url, model=engine.model_id)
        yield


async def _parts_ctx(app: web.Application) -> AsyncIterator[None]:
    s = app[keys.SETTINGS]
    app[keys.TENANT_SALT] = tenant_salt(s.data_dir)
    async with open_parts(
        s, upstream_url=app[UPSTREAM_URL], metrics=app[keys.METRICS], backend=app.get(BACKEND)
    ) as parts:
        app[keys.EMBEDDER], app[keys.CACHE], app[keys.UPSTREAM] = parts.embedder, parts.cache, parts.upstream
        app[keys.STORE] = parts.store
        app[keys.READINESS] = Readiness(parts.upstream)
        app[keys.TENANT_SALT] = await parts.cache.store.tenant_salt(app[keys.TENANT_SALT])  # one across replicas
        app[keys.POLICY_BOX], app[keys.SIGNER], app[keys.JUDGE] = parts.policy_box, parts.signer, parts.judge
        app[keys.CHAT] = chat_service(parts, s, app[keys.METRICS], app[keys.READINESS])
        lifecycle = Lifecycle(parts.cache, app[keys.METRICS], parts.judge, Capacity(s.max_records, s.max_answer_bytes))
        app[LIFECYCLE] = lifecycle
        log.info(
            "cache.ready",
            records=parts.loaded,
            model=s.embedding_model,
            policy=str(s.policy_file),
            policy_version=parts.policy_box.policy.version,
            upstream=app[UPSTREAM_URL],
            judge=judge_line(parts, s),
        )
        interval = min(s.sweep_interval, max(0.2, s.ready_after / 4)) if s.ready_after else s.sweep_interval
        async with running(lifecycle, interval):
            yield


def judge_line(parts: Parts, s: Settings) -> str:
    """What the startup line says of the judge: a model decides nothing before it passes its exam."""
    if parts.judging is None:
        return "off (judge: false)"
    if not parts.policy_box.policy.judges:
        return "off (no intent of the policy sets judge)"
    model = s.judge_model or "the request's model"
    where = s.judge_url or "the upstream"
    return f"{model} at {where}, deciding only once it passes its exam (on each model's first request)"


def chat_service(parts: Parts, s: Settings, metrics: Metrics, readiness: Readiness | None = None) -> ChatService:
    """The chat handler over the service parts, with the settings only serving reads."""
    flavour = as_flavour(s.upstream_flavour) if s.upstream else "llamacpp"
    options = ChatOptions(
        flavour=flavour,
        # llama.cpp restores a returning conversation from its RAM prompt cache only when it picks
        # the slot itself: pinning id_slot measured 27 % cached vs 83 % (tests/upstream/test_engine.py)
        slot_count=None,
        debug_headers=s.debug_headers,
        prewarm_all=s.prewarm,
        race=races(s.race_upstream, flavour),
        retry=s.upstream_retry,
        route_min_shared_chars=s.route_related_min_chars,
    )
    return ChatService(
        cache=parts.cache,
        planner=parts.planner,
        write_back=parts.write_back,
        settling=parts.settling,
        upstream=parts.upstream,
        metrics=metrics,
        judge=parts.judge,
        options=options,
        coalescer=parts.coalescer,
        prewarmer=parts.prewarmer,
        readiness=readiness,
        judging=parts.judging,
    )


def server_limits(settings: Settings) -> dict[str, float | int]:
    """The connection handler's limits. They travel with the app, so every runner that serves it
    (the CLI, the demo, a test server) applies them."""
    return {
        "max_line_size": settings.max_request_line_bytes,
        "max_field_size": settings.max_header_bytes,
        "max_headers": settings.max_headers,
        "keepalive_timeout": settings.keepalive_timeout,
    }


def create_app(settings: Settings, *, backend: SyncEmbedder | None = None) -> web.Application:
    """``backend``: an already loaded embedding model to share (tests, replay); default: load the
    configured pack."""
    # client_max_size is a backstop: routes.read_body enforces the configured limit with a clear error
    app = web.Application(
        middlewares=[error_middleware],
        client_max_size=settings.max_body_bytes + 1024,
        handler_args=server_limits(settings),
    )
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = Metrics()
    if backend is not None:
        app[BACKEND] = backend
    app.cleanup_ctx.append(_lock_ctx)  # first: nothing else starts on a data dir in use
    app.cleanup_ctx.append(_engine_ctx)
    app.cleanup_ctx.append(_parts_ctx)
    add_routes(app)
    add_admin_routes(app)
    return app
