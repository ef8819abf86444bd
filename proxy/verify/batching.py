"""The async front of the pair verifier, micro-batched like the embedder (proxy.microbatch).

``Verifier.score`` blocks (model inference), so it runs on one worker thread, never on the event
loop. Pairs of requests that arrive while the worker is busy, or within ``max_wait_s`` of each
other, share one call: one call over many pairs costs far less than many calls. The queue is
bounded: when it is full, or a result takes longer than ``timeout_s``, the caller gets
:class:`VerifierBusy` at once and decides without the verifier (a half-hit, never a wait
without end and never an unverified hit).
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.core.decision.context import asked_again
from proxy.core.model import Candidate, Record, Signature
from proxy.microbatch import BatchedFront, MicroBatcher, Overloaded
from proxy.verify.protocol import Verifier
from proxy.verify.sides import PairSide

__all__ = ["BatchingVerifier", "VerifierBusy", "pairs_of", "record_side", "request_side"]

Pair = tuple[PairSide, PairSide]


# The verifier cannot answer in time: its queue is full or the answer would come too late.
VerifierBusy = Overloaded


def request_side(sig: Signature) -> PairSide:
    return PairSide(sig.question_raw or sig.current_text, sig.previous_question, sig.previous_reply_head)


def record_side(record: Record) -> PairSide:
    """The side a record stored when it was written; records from before the verifier kept only
    the normalised question and reply, which still read better than nothing."""
    tags = record.coarse_tags
    return PairSide(
        tags.question_raw or tags.question, tags.previous_question, tags.previous_reply_head or tags.previous_reply
    )


def pairs_of(sig: Signature, candidates: Sequence[Candidate]) -> list[Pair]:
    """The pairs the verifier reads for a request and its candidates. A question the session asks
    again after other turns is read alone, like the record's: the conversation moved on between
    them, so their sides' previous turns differ whatever the question means (the judge and the
    guards read what was said in between); a turn that leans on its context keeps it."""
    ours = request_side(sig)
    pairs = []
    for cand in candidates:
        theirs = record_side(cand.record)
        if asked_again(sig, cand):
            pairs.append((PairSide(ours.question), PairSide(theirs.question)))
        else:
            pairs.append((ours, theirs))
    return pairs


class BatchingVerifier(BatchedFront):
    def __init__(
        self,
        verifier: Verifier,
        *,
        max_batch: int = 16,
        max_wait_s: float = 0.002,
        max_pending: int = 64,
        timeout_s: float | None = 1.0,
    ) -> None:
        self.verifier = verifier
        self._batcher: MicroBatcher[Pair, float] = MicroBatcher(
            self._score,
            name="verifier",
            max_batch=max_batch,
            max_wait_s=max_wait_s,
            max_pending=max_pending,
            timeout_s=timeout_s,
        )

    async def score(self, pairs: Sequence[Pair]) -> list[float]:
        """One probability per pair, in order; :class:`VerifierBusy` rather than a long wait."""
        return list(await self._batcher.submit(pairs)) if pairs else []

    async def verdicts(self, candidates: Sequence[Candidate], sig: Signature) -> dict[str, float]:
        """cache_id -> probability that the candidate's answer answers this request."""
        if not candidates:
            return {}
        scores = await self.score(pairs_of(sig, candidates))
        return {c.record.cache_id: p for c, p in zip(candidates, scores, strict=True)}

    def _score(self, pairs: list[Pair]) -> list[float]:
        return [float(p) for p in self.verifier.score(pairs)]
