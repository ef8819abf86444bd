"""What one chat request came to: the response headers that say it, and the canonical log line
and metrics that count it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import structlog

from proxy.core.identity import Identity
from proxy.core.model import Decision, Reason, Signature, Status
from proxy.observability.metrics import Metrics
from proxy.service.judging import Verdicts

log = structlog.get_logger("smartcache")

# Every reason is said in x-cache-reason, a hit's too: which rule decided, the same word the log
# line and the metrics use. What the decision weighed (the score beyond a hit's similarity, the
# intent, the tags, the stage timings) stays behind the debug headers. README.md lists each one
# (tests/http/test_outcome.py holds the two together).
PUBLIC_REASONS = frozenset(Reason)


class Ending(StrEnum):
    """How a request ended when it did not end as planned; its reason still says what was planned."""

    UPSTREAM_CUT = "upstream_cut"  # the upstream stream broke after the status line went out
    CLIENT_GONE = "client_gone"  # the client hung up mid-stream
    STORE_UNAVAILABLE = "store_unavailable"  # the answer was relayed but could not be kept


@dataclass
class Outcome:
    """Everything the canonical log line and the metrics need to know about one request."""

    status: Status = Status.MISS
    reason: str = ""
    ending: Ending | None = None
    intent: str = "-"
    score: float | None = None
    cache_id: str | None = None
    upstream_status: int | None = None
    # why the first upstream attempt was sent again (proxy.upstream.retry), None when it was not
    retried: str | None = None
    saved_prompt_tokens: int = 0
    saved_completion_tokens: int = 0
    upstream_cached_tokens: int = 0
    stored: bool = False
    prewarmed: bool = False
    judged: bool = False  # the model judge was asked about this request's candidates
    verdicts: Verdicts | None = None  # what it said, told the forwarded answer for its labels
    stages: dict[str, float] = field(default_factory=dict)
    signature: Signature | None = None
    response_id: str | None = None
    decision: Decision | None = None
    # the bookkeeping still running after the reply (proxy.service.settling); the log line waits for it
    settling: asyncio.Task[None] | None = None


def public_reason(reason: str) -> str | None:
    return reason if reason in PUBLIC_REASONS else None


def cache_headers(out: Outcome, *, debug: bool) -> dict[str, str]:
    """``x-cache-*`` for the client; with ``debug``, the decision's inside too."""
    headers = {"x-cache-status": out.status.value}
    if public := public_reason(out.reason):
        headers["x-cache-reason"] = public
    if out.status is Status.HIT and out.score is not None:
        headers["x-cache-similarity"] = f"{out.score:.4f}"
    if debug:
        headers.update(_debug_headers(out))
    return headers


def _debug_headers(out: Outcome) -> Mapping[str, str]:
    headers = {"x-smartcache-reason": out.reason, "x-smartcache-intent": out.intent}
    if out.ending is not None:
        headers["x-smartcache-ending"] = out.ending.value
    if out.score is not None:
        headers["x-smartcache-score"] = f"{out.score:.4f}"
    if out.signature is not None:
        headers["x-smartcache-tags"] = json.dumps(out.signature.tags.to_json())  # ASCII-escaped
    headers["x-smartcache-timings"] = ",".join(f"{k}={v * 1000:.1f}ms" for k, v in out.stages.items())
    if out.decision is not None:
        headers["x-smartcache-stage"] = out.decision.stage
        if out.decision.verified is not None:
            headers["x-smartcache-verified"] = f"{out.decision.verified:.4f}"
    return headers


def account(metrics: Metrics, out: Outcome, who: Identity, elapsed: float) -> None:
    """The metrics of one request and its canonical log line."""
    status = out.status.value.replace("-", "_")
    metrics.observe_request(status, out.intent, out.reason or "-", elapsed)  # type: ignore[arg-type]
    for stage, seconds in out.stages.items():
        metrics.observe_stage(stage, seconds)  # type: ignore[arg-type]
    if out.decision is not None:
        metrics.decided(out.decision.stage, out.decision.reason)
    if out.saved_prompt_tokens or out.saved_completion_tokens:
        metrics.saved_tokens(out.saved_prompt_tokens, out.saved_completion_tokens)
    if out.upstream_cached_tokens:
        metrics.upstream_cached(out.upstream_cached_tokens)
    log.info(
        "chat.request",
        status=out.status.value,
        reason=out.reason,
        ending=out.ending,
        intent=out.intent,
        score=None if out.score is None else round(out.score, 4),
        cache_id=out.cache_id,
        upstream_status=out.upstream_status,
        retried=out.retried,
        stored=out.stored,
        latency_ms=round(elapsed * 1000, 2),
        saved_tokens=out.saved_prompt_tokens + out.saved_completion_tokens,
        upstream_cached_tokens=out.upstream_cached_tokens,
        prewarmed=out.prewarmed,
        tenant=who.tenant[:12],
        stages_ms={k: round(v * 1000, 2) for k, v in out.stages.items()},
        # which decision stage decided, what varied within its reason, the verifier's probability
        decided_by=out.decision.stage if out.decision else None,
        detail=out.decision.detail if out.decision else None,
        verified=out.decision.verified if out.decision else None,
    )
