"""Typed application keys: the app owns its parts, handlers reach them through these."""

from __future__ import annotations

from aiohttp import web

from proxy.embedding.batching import BatchingEmbedder
from proxy.http.chat import ChatService
from proxy.observability.metrics import Metrics
from proxy.service.cache import SemanticCache
from proxy.service.feedback import HitJudge
from proxy.service.planner import PolicyBox
from proxy.settings import Settings
from proxy.signing.signer import ContextSigner
from proxy.storage.backends import Store
from proxy.upstream.client import Upstream
from proxy.upstream.readiness import Readiness

SETTINGS = web.AppKey("settings", Settings)
TENANT_SALT = web.AppKey("tenant_salt", str)
METRICS = web.AppKey("metrics", Metrics)
EMBEDDER = web.AppKey("embedder", BatchingEmbedder)
CACHE = web.AppKey("cache", SemanticCache)
STORE = web.AppKey("store", Store)  # the cache's store, with its shared face where replicas share it
SIGNER = web.AppKey("signer", ContextSigner)
POLICY_BOX = web.AppKey("policy_box", PolicyBox)
UPSTREAM = web.AppKey("upstream", Upstream)
READINESS = web.AppKey("readiness", Readiness)
CHAT = web.AppKey("chat", ChatService)
JUDGE = web.AppKey("judge", HitJudge)
