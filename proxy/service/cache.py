"""SemanticCache: look up, write back and take feedback, composing index, store and policy
(``proxy.service.reach`` says which records a caller may see and where an answer is written).

Isolation is enforced twice: the index filter only admits labels of the request's allowed
pools, and every candidate row read from the store is checked again before it can be served.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import structlog

from proxy.core.decision.context import same_request
from proxy.core.decision.decide import DecisionContext, decide_in, verification_rounds
from proxy.core.decision.judging import AskJudge, ask_judge, ranked_by_verifier
from proxy.core.decision.validate import extract_key_facts
from proxy.core.identity import Identity
from proxy.core.model import SCOPES, Candidate, Decision, Reason, Record, RecordState, SessionLast, Signature, Status
from proxy.core.openai.request import ChatRequest
from proxy.core.policy import IntentPolicy
from proxy.core.text.normalize import Cutter
from proxy.service.index_load import read_index
from proxy.service.new_record import new_record
from proxy.service.reach import fits_limit, held, nearest_of_both, reach, repeated, visible
from proxy.service.verdicts import VerdictMemory
from proxy.storage.base import IndexKey, IndexRow, RecordStore, Ref, Selector, StoreUnavailable
from proxy.storage.mirror import SCOPE_WIDTH, Pools, Want
from proxy.storage.vectors import Hits, VectorIndex
from proxy.verify.batching import BatchingVerifier, VerifierBusy

NEGATIVE_FEEDBACK = -0.6
POSITIVE_FEEDBACK = 0.1


@dataclass(frozen=True, slots=True)
class Found:
    """What one search brought back: the ready candidates the decision reads, and the best score
    of a visible pending record of the request's intent (an answer still in its feedback window)."""

    ready: list[Candidate]
    best_pending: float | None = None
    # a turn that left its topic (``repeats_only``): the session's own earlier answers, which the
    # decision does not read but the judge may (a question of an earlier topic asked again)
    own: list[Candidate] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Lookup:
    decision: Decision
    best_pending: float | None = None
    # what the judge should read, where the decision did not serve and a qualified judge may decide:
    # in score order, ranked by the verifier once the judging starts (``ranked``)
    ask: AskJudge | None = None


# a lookup scanning up to this many rows runs on the event loop, not in the executor: the scan
# costs less than the hop (bench_store.py times the scan, bench_request_parts.py the hop;
# tests/storage/test_hnsw.py keeps both paths alike)
INLINE_ROWS = 1024
# an add of this many records into exact partitions runs on the event loop too (``VectorIndex.add_now``):
# a write-back's one row costs tens of microseconds, a thread hop more, and under load its wake-ups
INLINE_ADDS = 16
# An exact repeat embeds to the very vector its record holds; the index keeps rows in bfloat16,
# which moves a cosine of 1 by under 1e-3. The request hash, not this score, decides.
REPEAT_SCORE = 0.99
REPEAT_K = 4  # one conversation asked in a few sessions; the newest records come first among equals
# the index's bfloat16 rows move a cosine by under 1e-3 (above); a floor on scores from it leaves this
SCORE_SLACK = 0.01


def decisive_floor(policy: IntentPolicy) -> float:
    """The lowest index score at which a record of another session can change a lookup's decision
    under ``policy``: below ``candidate`` the best record is a miss, only named in its reason; a
    pending one counts from ``accept``; an exact repeat scores about 1 (the session's own records,
    which the restatement nets read, are waited for whatever their score)."""
    return min(policy.candidate, policy.accept, REPEAT_SCORE) - SCORE_SLACK


@dataclass
class _Rebuild:
    """What lands while the index is rebuilt off the loop: replayed onto the new graph after the swap."""

    added: list[tuple[int, np.ndarray, IndexKey]] = field(default_factory=list)
    forgotten: set[int] = field(default_factory=set)


class SemanticCache:
    def __init__(
        self,
        store: RecordStore,
        index: VectorIndex,
        *,
        ready_after: float,
        top_k: int,
        clock: Callable[[], float] = time.time,
        verifier: BatchingVerifier | None = None,
        segmenter: Cutter | None = None,
    ) -> None:
        """``segmenter``: the app's, which reads an answer's key facts (None: the default one)."""
        self.store = store
        self.segmenter = segmenter
        self.verifier = verifier  # None: no verdicts, so intents that verify serve no hits
        self.index = index
        self.ready_after = ready_after
        self.top_k = top_k
        self.clock = clock
        self.pools = Pools()
        self._index_lock = asyncio.Lock()  # adopts one at a time (a write adds its own new label unlocked)
        self._rebuild: _Rebuild | None = None
        self.verdicts = VerdictMemory(store, clock)  # the judge's refusals, by tenant and wording

    async def load(
        self, *, snapshot: VectorIndex | None = None, saved_keys: Mapping[int, IndexKey] | None = None
    ) -> int:
        """Rebuild the index from the store, the source of truth: at start, and to compact it. At start
        a ``snapshot`` of the graph (saved at the last shutdown) can stand in for the rebuild: it is
        brought level with the store, adding what was written and dropping what died since, so even
        a stale one from before a crash serves exactly the live records. With the snapshot, the
        keys saved beside it (``saved_keys``, proxy.storage.keyfile) stand in for reading every
        live record's key: only the live labels are read, and the keys of those not saved.

        Requests go on meanwhile against the old graph; writes and deletes that land during the
        rebuild are logged and replayed onto the new one, so none is lost and none comes back."""
        if self._rebuild is not None:
            return len(self.index)
        log = self._rebuild = _Rebuild()
        try:
            index, pools = await read_index(self.store, self.index, snapshot=snapshot, saved_keys=saved_keys)
            self.index, self.pools = index, pools
            for label, vector, key in log.added:
                if label not in log.forgotten:
                    self.index.add([label], vector.reshape(1, -1), [key])
                    pools.add(label, key)
            self._forget_now(list(log.forgotten))
        finally:
            self._rebuild = None
        return len(pools.keys)

    @property
    def keys(self) -> dict[int, IndexKey]:
        return self.pools.keys

    def _remember(self, label: int, key: IndexKey, vector: np.ndarray) -> None:
        self.pools.add(label, key)
        if self._rebuild is not None:
            self._rebuild.added.append((label, vector, key))

    async def retire(self, selector: Selector, *, to: RecordState | None = RecordState.INVALID) -> list[Ref]:
        """Take the selected records out of service: moved to ``to`` (kept a while for audit) or, with
        None, deleted. Every invalidation, reset, rejection, delete and eviction comes through here,
        because the order matters: the store first, then the index, so a rebuild reading the store
        meanwhile cannot bring them back. Returns the records this call changed."""
        refs = await (self.store.delete(selector) if to is None else self.store.set_state(selector, to))
        self.forget([ref.label for ref in refs])
        return refs

    async def adopt(self, rows: Sequence[IndexRow]) -> int:
        """Put records written elsewhere (another replica sharing the store) into the index; labels
        already in it are left alone. Returns how many were added."""
        async with self._index_lock:
            new = [r for r in rows if r.vector is not None and r.label not in self.pools.keys]
            if not new:
                return 0
            matrix = np.frombuffer(b"".join(r.vector or b"" for r in new), dtype=np.float32).reshape(len(new), -1)
            await self._add([r.label for r in new], matrix, [r.key for r in new])
        return len(new)

    async def _add(self, labels: list[int], vectors: np.ndarray, keys: list[IndexKey]) -> None:
        """Into the index, then into the pools (and a rebuild's log). A few rows into exact
        partitions go in on the loop; the rest off it, and a rebuild that swapped in its new graph
        while such an add was off the loop had replayed its log already, without these: they go
        into the new graph too, or they would be unsearchable until the next."""
        index = self.index
        if len(labels) > INLINE_ADDS or not index.add_now(labels, vectors, keys):
            await asyncio.to_thread(index.add, labels, vectors, keys)
            if self.index is not index:
                self.index.add(labels, vectors, keys)
        for label, vector, key in zip(labels, vectors, keys, strict=True):
            self._remember(label, key, vector)

    def forget(self, labels: list[int]) -> None:
        """Take records out of the index and its filter maps. Call after the store no longer has them
        live, so a concurrent rebuild cannot read them back."""
        if self._rebuild is not None:
            self._rebuild.forgotten.update(labels)
        self._forget_now(labels)

    def _forget_now(self, labels: list[int]) -> None:
        for label in labels:
            self.pools.discard(label)
        self.index.delete(labels)

    async def candidates(
        self, sig: Signature, request: ChatRequest, who: Identity, policy: IntentPolicy, *, repeats_only: bool = False
    ) -> Found:
        """The records the decision reads: the nearest ones the policy's pools let this caller see,
        and, within the intent's ``repeats_widen_to``, the record of this very conversation asked in
        another session, whatever pool it was written to. ``repeats_only``: a turn that left its
        topic is judged on nothing but that record, or this very turn re-sent in its own session
        with its courtesy framing edited (``same_request``); the session's other answers come back
        apart, for the judge alone (``Found.own``)."""
        namespace = request.record_namespace  # the caller's, and the parameters that shape the answer

        def admit(label: int) -> bool:
            key = self.pools.keys.get(label)
            return (
                key is not None
                and key.model == request.model
                and key.namespace == namespace
                and key.system_prompt_version == sig.system_prompt_version
                and visible(key, who, policy.widen_to)
            )

        widen_to = reach(who, policy.widen_to)
        want = Want(who.tenant, who.user, request.model, namespace, sig.system_prompt_version, widen_to)
        top: Hits = []
        if not repeats_only:
            own, wider = await self.nearest(sig.vector, who, widen_to, admit, want)
            top = nearest_of_both(own, wider, self.top_k)
        else:  # the session's own records, of which only this very turn, reframed, may answer
            top, _ = await self.nearest(sig.vector, who, "session", admit, want)
            top = top[: self.top_k]
        near = len(top)
        if policy.shares_repeats:
            seen = {label for label, _ in top}
            repeats = replace(want, widen_to=reach(who, policy.repeats_widen_to), any_scope=True)
            top += [hit for hit in await self._repeats(sig.vector, repeats) if hit[0] not in seen]
        rows = {r.label: r for r in await self.store.get_many([lab for lab, _ in top])}
        now = self.clock()
        # the request's own max-age / ttl also bounds the age of what it is served, as in HTTP
        oldest = -float("inf") if request.controls.ttl is None else now - request.controls.ttl
        ready, pending, earlier = [], [], []
        for at, (label, score) in enumerate(top):
            r = rows.get(label)
            if r is None or r.expires_at <= now or r.created_at < oldest:
                continue
            if not (visible(r, who, policy.widen_to) if at < near else repeated(r, sig, who, policy)):
                continue
            if not held(r, who, request):
                continue
            if not fits_limit(r, request.answer_cap, sig.request_hash):
                continue
            if r.state == "ready" and r.feedback_score >= policy.feedback_floor:
                same = r.tenant == who.tenant and r.session == who.session
                gap = sig.turn_index - r.coarse_tags.turn if same else None
                question = float(r.qvector_array() @ sig.question_vector)
                cand = Candidate(r, score, question, same_session=same, turn_gap=gap)
                if repeats_only and at < near and not same_request(sig, cand):
                    if same:
                        earlier.append(cand)
                    continue
                ready.append(cand)
            elif r.state == "pending" and r.intent == sig.tags.intent:
                pending.append(min(score, float(r.qvector_array() @ sig.question_vector)))
        return Found(ready, max(pending, default=None), earlier)

    async def nearest(
        self, vector: np.ndarray, who: Identity, widen_to: str, admit: Callable[[int], bool], want: Want
    ) -> tuple[Hits, Hits]:
        """(label, cosine) of admitted records, best first: the session's own, scored exactly, and,
        when the policy widens the lookup, the nearest ``want`` admits in the caller's tenant and
        the shared partition (``admit`` and ``want`` say the same of every record outside the
        session)."""
        session = [lab for lab in self.pools.sessions.get((who.tenant, who.session), ()) if admit(lab)]
        index, k = self.index, self.top_k
        wider = None if SCOPE_WIDTH[widen_to] == 0 else want
        now = index.search_both_now(vector, session, k, wider, max_rows=INLINE_ROWS)
        return now if now is not None else await asyncio.to_thread(index.search_both, vector, session, k, wider)

    async def _repeats(self, vector: np.ndarray, want: Want) -> Hits:
        """Records of the tenant, in any pool, whose conversation vector is this one: the candidates
        for an exact repeat (``_repeated`` then compares the conversations themselves)."""
        index = self.index
        now = index.search_both_now(vector, (), REPEAT_K, want, max_rows=INLINE_ROWS)
        _, hits = now if now is not None else await asyncio.to_thread(index.search_both, vector, (), REPEAT_K, want)
        return [hit for hit in hits if hit[1] >= REPEAT_SCORE]

    async def lookup(
        self,
        sig: Signature,
        request: ChatRequest,
        who: Identity,
        policy: IntentPolicy,
        stages: dict[str, float] | None = None,
        *,
        repeats_only: bool = False,
        judge: bool = False,
    ) -> Lookup:
        """``judge``: a qualified judge may read what the decision does not serve (``ask_judge``);
        the command comes back unranked: the verifier ranks it (``ranked``) as the judge starts."""
        found = await self.candidates(sig, request, who, policy, repeats_only=repeats_only)
        found = await self._aliases_alive(found, policy)
        # one context throughout: what it judged to choose the verifier's pairs is not judged again
        ctx = DecisionContext(found.ready, sig, policy)
        verdicts = await self._verdicts(ctx, stages)
        t0 = time.perf_counter()
        decision = decide_in(ctx.with_verdicts(verdicts))
        if stages is not None:
            stages["decide"] = time.perf_counter() - t0
        if decision.status is Status.MISS and decision.reason is Reason.VALIDATION_FAILED and decision.record:
            await self.store.add_feedback(decision.record.cache_id, NEGATIVE_FEEDBACK / 2)
        ask = None
        if judge and decision.status is not Status.HIT and (not repeats_only or found.own):
            refused = await self.verdicts.refused(who.tenant, sig.request_hash)
            # a turn that left its topic may return to an earlier one of its own session: the judge
            # reads that conversation whole, so the session's own answers are its to judge
            judged_in = DecisionContext(found.own, sig, policy) if repeats_only else ctx
            ask = ask_judge(judged_in, decision, refused=refused)
        return Lookup(decision, found.best_pending, ask or None)

    async def _aliases_alive(self, found: Found, policy: IntentPolicy) -> Found:
        """An alias lives as long as the record it was approved for, and stands as that record
        does: one whose record was invalidated, reset, expired or penalised under the feedback
        floor (a regenerate, a correction) is dropped (rare among candidates: a store read each)."""
        aliases = {c.record.coarse_tags.alias_of for c in found.ready if c.record.coarse_tags.alias_of}
        if not aliases:
            return found
        now = self.clock()
        alive = set()
        for cache_id in aliases:
            assert cache_id is not None
            original = await self.store.get(cache_id)
            if (
                original is not None
                and original.state == RecordState.READY
                and original.expires_at > now
                and original.feedback_score >= policy.feedback_floor
            ):
                alive.add(cache_id)
        ready = [c for c in found.ready if c.record.coarse_tags.alias_of in (None, *alive)]
        return replace(found, ready=ready)

    async def ranked(
        self, ask: AskJudge, sig: Signature, policy: IntentPolicy, stages: dict[str, float] | None = None
    ) -> AskJudge:
        """What the judge reads, ranked and filtered by the pair verifier where the intent says so
        (``judge_verify``); none without a verifier's word."""
        if policy.judge_verify is None or not ask:
            return ask
        probabilities: dict[str, float] = {}
        if self.verifier is not None:
            t0 = time.perf_counter()
            try:
                probabilities = await self.verifier.verdicts(list(ask.candidates), sig)
            except VerifierBusy:
                pass
            except Exception as exc:  # a broken model costs hits, never the request
                structlog.get_logger("smartcache").warning("verify.failed", error=repr(exc)[:200])
            if stages is not None:
                stages["verify"] = stages.get("verify", 0.0) + time.perf_counter() - t0
        return ranked_by_verifier(ask, probabilities, policy)

    async def _verdicts(self, ctx: DecisionContext, stages: dict[str, float] | None) -> dict[str, float]:
        """The verifier's probabilities for the candidates decide will read. None come back when it
        is off, overloaded or failing: the verification stage then half-hits, it never serves."""
        rounds = verification_rounds(ctx)
        sig = ctx.sig
        if not rounds.first or self.verifier is None:
            return {}
        t0 = time.perf_counter()
        verdicts: dict[str, float] = {}
        try:
            verdicts.update(await self.verifier.verdicts(rounds.first, sig))
            if rounds.then and not rounds.settled(verdicts):
                verdicts.update(await self.verifier.verdicts(rounds.then, sig))
        except VerifierBusy:
            pass  # what was judged stands; the rest half-hits
        except Exception as exc:  # a broken model costs hits, never the request
            structlog.get_logger("smartcache").warning("verify.failed", error=repr(exc)[:200])
        finally:
            if stages is not None:
                stages["verify"] = time.perf_counter() - t0
        return verdicts

    async def served(self, record: Record, who: Identity, sig: Signature) -> None:
        """Count the hit and remember it as the session's last answer. Best effort: the answer is in
        hand, and a store gone since the lookup must not cost the client its reply."""
        with contextlib.suppress(StoreUnavailable):
            last = SessionLast(record.cache_id, True, sig.request_hash)
            await self.store.record_served(record.cache_id, self.clock(), who.tenant, who.session, last)

    async def note_unstored(self, who: Identity, request_hash: str) -> None:
        """An answer we did not store still becomes the session's last: a regenerate of it is known,
        and a correction of it penalises no record (``request_hash``: its request's, as signed)."""
        with contextlib.suppress(StoreUnavailable):
            await self.store.set_session_last(who.tenant, who.session, SessionLast("", False, request_hash))

    async def write(
        self,
        *,
        request: ChatRequest,
        who: Identity,
        sig: Signature,
        policy: IntentPolicy,
        policy_version: str,
        answer: str,
        usage: dict[str, Any],
        cut: bool = False,
    ) -> Record:
        """Store ``answer`` as the record ``new_record`` builds and index it; ``cut``: the engine
        ended it at the request's token limit."""
        # jieba over a long answer would hold up the event loop (bench_request_parts.py)
        facts = await asyncio.to_thread(extract_key_facts, answer, segmenter=self.segmenter)
        record = new_record(
            request=request, who=who, sig=sig, policy=policy, policy_version=policy_version, answer=answer,
            key_facts=facts, usage=usage, now=self.clock(), ready_after=self.ready_after, cut=cut,
        )  # fmt: skip
        label = await self.store.insert(record)
        record = replace(record, label=label)
        vector = np.asarray(sig.vector, dtype=np.float32)
        key = IndexKey.of(record)
        # not under _index_lock: a new label is this write's alone, and the index and the pools
        # each take a label they already hold as a no-op, so an adopt racing it adds nothing twice;
        # a lock held across this hop queued every write-back behind the others under load
        await self._add([label], vector.reshape(1, -1), [key])
        await self.store.set_session_last(
            who.tenant, who.session, SessionLast(record.cache_id, False, sig.request_hash)
        )
        return record

    async def alias(
        self,
        original: Record,
        *,
        request: ChatRequest,
        who: Identity,
        sig: Signature,
        policy: IntentPolicy,
        policy_version: str,
        own: bool = False,
    ) -> Record | None:
        """The judge said ``original`` answers this wording: the wording becomes an alias of it, a
        record with its answer reached by this wording (an exact repeat) and its restatements,
        judged for another only where the session asks it again (``ask_judge``), in no wider pool
        and for no longer than it. ``own``: the session was served another conversation's answer,
        and keeps it as its own turn, in the session's pool alone, so that a question it asks again
        later finds it. An alias of an alias points at the record itself."""
        root = original.coarse_tags.alias_of or original.cache_id
        record = new_record(
            request=request, who=who, sig=sig, policy=policy, policy_version=policy_version,
            answer=original.answer_text, key_facts=original.key_facts, now=self.clock(), ready_after=0.0, cut=False,
            usage={"prompt_tokens": original.prompt_tokens, "completion_tokens": original.completion_tokens},
        )  # fmt: skip
        scope = "session" if own else min(record.scope, original.scope, key=SCOPES.index)
        tags = replace(record.coarse_tags, alias_of=root, cut_at=original.coarse_tags.cut_at)
        record = replace(record, scope=scope, coarse_tags=tags, expires_at=min(record.expires_at, original.expires_at))
        if record.expires_at <= self.clock():
            return None
        with contextlib.suppress(StoreUnavailable):
            label = await self.store.insert(record)
            record = replace(record, label=label)
            await self._add([label], np.asarray(sig.vector, dtype=np.float32).reshape(1, -1), [IndexKey.of(record)])
            return record
        return None

    async def penalise(self, cache_id: str, *, reject_pending: bool = True) -> Record | None:
        """A correction or a regenerate: a pending answer is rejected, a ready one loses score."""
        record = await self.store.get(cache_id)
        if record is None:
            return None
        # the rejection is conditional on the record still being pending: one promoted meanwhile
        # (here or on another replica) loses score instead, so the objection is never lost
        pending = Selector(cache_ids=(cache_id,), states=(RecordState.PENDING,))
        if (
            record.state == RecordState.PENDING
            and reject_pending
            and await self.retire(pending, to=RecordState.REJECTED)
        ):
            return record
        await self.store.add_feedback(cache_id, NEGATIVE_FEEDBACK)
        return record

    async def reward(self, cache_id: str) -> None:
        await self.store.add_feedback(cache_id, POSITIVE_FEEDBACK)

    async def invalidate_session(self, tenant: str, session: str, *, shared_too: bool = True) -> int:
        """Retire the records a session wrote. ``shared_too=False`` (a user's own reset) keeps those
        written to the tenant or wider: they were stored there because their answer does not depend
        on this conversation, and one user starting over must not take them from everyone."""
        private = None if shared_too else SCOPES[: SCOPES.index("tenant")]
        return len(await self.retire(Selector(tenant=tenant, session=session, scopes=private)))
