"""Offline replay: conversations turn by turn through the real signer, index, store, policy and
decision, with upstream answers taken from the trace (the shipped thresholds are calibrated on it).

Two modes share one loop:
- *evaluate*: the policy as it is; hits are served and judged against the trace's answer keys.
- *shadow*: nothing is served; every request goes "upstream" and we record the best candidate
  that passed the hard filters, change detection and validation, with its score and whether its
  key matches. Calibration sweeps thresholds over these rows.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from proxy.core.identity import Identity
from proxy.core.model import Status
from proxy.core.openai.request import parse_chat_request
from proxy.core.policy import Policy, check_embedding_model, load_policy
from proxy.embedding.backends import SyncEmbedder
from proxy.observability.metrics import Metrics
from proxy.service.compose import NOWHERE, Parts, open_parts
from proxy.settings import Settings, load_settings
from proxy.tools.datasets.traces import Conversation
from proxy.verify import Verifier


@dataclass(frozen=True, slots=True)
class Row:
    conversation: str
    category: str
    turn: int
    intent: str
    status: str
    reason: str
    score: float | None  # best surviving candidate's score
    candidate_key_ok: bool | None  # does that candidate's key match this request's?
    nets_ok: bool  # did that candidate pass change detection and validation?
    expect_no_hit: bool
    session_reusable: bool
    tenant_reusable: bool
    saved_tokens: int
    verified: float | None = None  # the pair verifier's probability for that candidate, when it was asked

    @property
    def hit(self) -> bool:
        return self.status == Status.HIT.value

    @property
    def false_hit(self) -> bool:
        return self.hit and (self.expect_no_hit or not self.candidate_key_ok)


def shadow_policy(policy: Policy, *, verify_all: bool = False) -> Policy:
    """Every cacheable intent accepts from 0: the nets still run, the threshold is what we sweep. An
    intent that verifies has every candidate verified, so its verify_accept can be swept too; one
    that verifies the previous turn has it judged first, whatever its probability, so its
    verify_previous can be swept (those rows carry reason verified_previous). ``verify_all``: every
    cacheable intent is read so, whether the policy verifies it or not, to see where the verifier
    could serve."""

    def opened(level: float | None) -> float | None:
        return None if level is None and not verify_all else 0.0

    intents = {
        n: dataclasses.replace(p, accept=0.0, candidate=0.0, direct_hit=True, verify_accept=opened(p.verify_accept),
                               verify_previous=opened(p.verify_previous)) if p.cache else p
        for n, p in policy.intents.items()
    }  # fmt: skip
    return dataclasses.replace(policy, intents=intents)


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)  # the trace has no usage: a rough count, the same for every mode


async def replay_conversations(
    parts: Parts,
    convs: Sequence[Conversation],
    *,
    shadow: bool,
    model: str = "replay",
    progress: Callable[[int], None] | None = None,
) -> list[Row]:
    keys: dict[str, str] = {}  # cache_id -> answer key
    seen_session: dict[tuple[str, str], set[str]] = defaultdict(set)
    seen_tenant: dict[str, set[str]] = defaultdict(set)
    rows: list[Row] = []
    for conv in convs:
        history: list[dict[str, str]] = [{"role": "system", "content": conv.system}] if conv.system else []
        last: list[dict[str, str]] | None = None
        who = Identity(tenant=conv.tenant, session=conv.session, user=None, session_explicit=True)
        for i, turn in enumerate(conv.turns):
            msgs = last if turn.regenerate and last is not None else [*history, {"role": "user", "content": turn.user}]
            req = parse_chat_request(orjson.dumps({"model": model, "messages": msgs}))
            plan = await parts.planner.plan(req, who)
            decision = plan.decision
            record = decision.record if decision else None
            key_ok = None if record is None else keys.get(record.cache_id) == turn.key
            serve = plan.status is Status.HIT and record is not None and not shadow
            status = plan.status.value if not shadow or plan.status is not Status.HIT else "shadow_hit"
            rows.append(
                Row(
                    conv.id,
                    conv.category,
                    i,
                    plan.signature.tags.intent if plan.signature else "-",
                    status if not serve else Status.HIT.value,
                    plan.reason,
                    decision.score if decision and record else None,
                    key_ok,
                    plan.status is Status.HIT,
                    turn.expect == "no_hit",
                    turn.key in seen_session[(conv.tenant, conv.session)],
                    turn.key in seen_tenant[conv.tenant],
                    (record.prompt_tokens + record.completion_tokens) if serve and record else 0,
                    decision.verified if decision else None,
                )
            )
            if serve and record is not None:
                await parts.cache.served(record, who, plan.signature)  # type: ignore[arg-type]
                text = record.answer_text
            else:
                text = turn.answer or f"Answer for {turn.key}."
                usage = {"prompt_tokens": sum(_tokens(m["content"]) for m in msgs), "completion_tokens": _tokens(text)}
                kept = await parts.write_back.keep(req, who, plan, text, usage)
                if kept.record is not None:
                    keys[kept.record.cache_id] = turn.key
            seen_session[(conv.tenant, conv.session)].add(turn.key)
            seen_tenant[conv.tenant].add(turn.key)
            last = msgs
            history = [*msgs, {"role": "assistant", "content": text}]
        if progress:
            progress(1)
    return rows


async def run_replay(
    convs: Sequence[Conversation],
    *,
    settings: Settings | None = None,
    policy_path: Path | None = None,
    shadow: bool = False,
    backend: SyncEmbedder | None = None,
    progress: Callable[[int], None] | None = None,
    verifier: Verifier | None = None,
    verify_all: bool = False,
) -> list[Row]:
    """A fresh cache in a temporary directory, so a replay never touches a live one. ``verifier``
    stands in for the shipped pair verifier (used where the policy sets verify_accept);
    ``verify_all``: in shadow, every cacheable intent is verified (``shadow_policy``)."""
    with tempfile.TemporaryDirectory(prefix="smartcache-replay-") as tmp:
        base = settings or load_settings()
        # offline, an answer is worth waiting for: a timed-out embedding or verdict would turn a
        # request into a bypass or a half-hit that no live proxy would have made, and skew calibration
        s = base.replace(
            data_dir=Path(tmp),
            ready_after=0.0,
            model_home=base.models_root,
            policy=policy_path or base.policy,
            verify_timeout_ms=0.0,
            embed_timeout_ms=max(base.embed_timeout_ms, 600_000.0),
        )
        policy = load_policy(s.policy_file)
        if shadow:
            # Shadow rows feed calibration, which replaces the thresholds: a template calibrated
            # under another model is how a new model gets its first policy.
            policy = shadow_policy(policy, verify_all=verify_all)
        else:
            check_embedding_model(policy, s.embedding_model)
        async with open_parts(
            s, upstream_url=NOWHERE, metrics=Metrics(), backend=backend, policy=policy, verifier=verifier
        ) as parts:
            return await replay_conversations(parts, convs, shadow=shadow, progress=progress)


def summarize(rows: Sequence[Row], by: Callable[[Row], str]) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for r in rows:
        c = out[by(r)]
        c["requests"] += 1
        c[r.status] += 1
        c["reusable"] += r.tenant_reusable and not r.expect_no_hit
        c["session_reusable"] += r.session_reusable and not r.expect_no_hit
        c["false_hits"] += r.false_hit
        c["correct_hits"] += r.hit and not r.false_hit
        c["saved_tokens"] += r.saved_tokens
    return dict(out)
