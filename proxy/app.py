"""The aiohttp application factory. The app owns every part; each resource opens and closes in
one cleanup context, so start-up and shutdown are written once, side by side."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import structlog
from aiohttp import web

from proxy import keys
from proxy.admin import add_admin_routes
from proxy.cache import SemanticCache
from proxy.chat import ChatService, HitJudge, PolicyBox
from proxy.embedder import BatchingEmbedder
from proxy.embedding_backends import SyncEmbedder
from proxy.embedding_packs import load_embedder
from proxy.engine import LocalEngine
from proxy.intent import IntentClassifier
from proxy.lifecycle import Capacity, Lifecycle, running
from proxy.metrics import Metrics
from proxy.middlewares import error_middleware
from proxy.policy import load_policy
from proxy.routes import add_routes
from proxy.settings import Settings
from proxy.signer import ContextSigner, SignerSettings
from proxy.store import SqliteStore
from proxy.upstream import Upstream
from proxy.vector_index import HnswIndex

log = structlog.get_logger("smartcache")
UPSTREAM_URL = web.AppKey("upstream_url", str)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
BACKEND = web.AppKey("backend", SyncEmbedder)


def tenant_salt(data_dir: Path) -> str:
    """A per-installation salt, so a leaked database cannot be matched against known API keys."""
    path = data_dir / "tenant_salt"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(16))
        path.chmod(0o600)
    return path.read_text().strip()


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[keys.SETTINGS]
    if settings.upstream:
        app[UPSTREAM_URL] = settings.upstream
        yield
        return
    engine = LocalEngine(ctx_size=settings.engine_ctx, parallel=settings.engine_parallel,
                         threads=settings.engine_threads or None,
                         log_path=settings.data_dir / "engine.log")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    async with engine:
        app[UPSTREAM_URL] = engine.base_url
        log.info("engine.started", url=engine.base_url, model=engine.model_id)
        yield


async def _parts_ctx(app: web.Application) -> AsyncIterator[None]:
    s = app[keys.SETTINGS]
    app[keys.TENANT_SALT] = tenant_salt(s.data_dir)
    backend = app.get(BACKEND) or await asyncio.to_thread(
        load_embedder, s.embedding_model, s.models_root, threads=s.embed_threads or None, auto_install=True)
    embedder = BatchingEmbedder(backend, max_batch=s.embed_max_batch, max_wait_s=s.embed_max_wait_ms / 1000)
    policy = load_policy(s.policy)
    classifier = await IntentClassifier.build(policy, embedder)
    store = await SqliteStore.open(s.db_path)
    cache = SemanticCache(store, HnswIndex(backend.dim), ready_after=s.ready_after, top_k=s.top_k)
    loaded = await cache.load()
    flavour = s.upstream_flavour if s.upstream else "llamacpp"
    upstream = Upstream(app[UPSTREAM_URL], timeout=s.upstream_timeout, connect_timeout=s.upstream_connect_timeout)
    judge = HitJudge(window=max(s.ready_after, 1.0))
    box = PolicyBox(policy, classifier)
    signer = ContextSigner(embedder, classifier, SignerSettings())
    app[keys.EMBEDDER], app[keys.CACHE], app[keys.UPSTREAM] = embedder, cache, upstream
    app[keys.POLICY_BOX], app[keys.SIGNER], app[keys.JUDGE] = box, signer, judge
    app[keys.CHAT] = ChatService(
        cache=cache, signer=signer, policy_box=box, upstream=upstream, flavour=flavour,
        slot_count=s.engine_parallel if flavour == "llamacpp" else None, metrics=app[keys.METRICS],
        judge=judge, debug_headers=s.debug_headers, regenerate_window=s.regenerate_window,
    )
    lifecycle = Lifecycle(cache, app[keys.METRICS], judge, Capacity(s.max_records, s.max_answer_bytes))
    app[LIFECYCLE] = lifecycle
    log.info("cache.ready", records=loaded, model=s.embedding_model, policy=str(s.policy),
             policy_version=policy.version, upstream=app[UPSTREAM_URL])
    interval = min(s.sweep_interval, max(0.2, s.ready_after / 4)) if s.ready_after else s.sweep_interval
    try:
        async with running(lifecycle, interval):
            yield
    finally:
        await upstream.close()
        await embedder.close()
        await store.close()


def create_app(settings: Settings, *, backend: SyncEmbedder | None = None) -> web.Application:
    """``backend``: an already loaded embedding model to share (tests, replay); default: load the
    configured pack."""
    # client_max_size is a backstop: routes.read_body enforces the configured limit with a clear error
    app = web.Application(middlewares=[error_middleware], client_max_size=settings.max_body_bytes + 1024)
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = Metrics()
    if backend is not None:
        app[BACKEND] = backend
    app.cleanup_ctx.append(_engine_ctx)
    app.cleanup_ctx.append(_parts_ctx)
    add_routes(app)
    add_admin_routes(app)
    return app
