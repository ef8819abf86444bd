"""What the user's own behaviour says about an answer: a reset, a regenerate, a correction, a
thumbs button, and how a served hit is judged afterwards.

A regenerate is the same conversation (byte for byte, as its request hash) re-sent by the same
session soon after its answer, and it needs evidence that it is the same conversation, not
someone else asking the same (``same_conversation_again``). An explicit session header is that
evidence, within ``regenerate_window``. Without one, the session is derived from the tenant, the
end user's id, the model, the system prompt and the opening (proxy/core/identity.py), so everyone
with one key who opens with the same words shares it, and the same opening question asked again
is no evidence at all: it is looked up and served like any other (a popular question asked once
a minute by different people is not a string of regenerates penalising its answer). There a
repeat is a regenerate only when it carries evidence of its own — an end-user id (body ``user``
or the user header), or a history with an assistant reply in it that the client re-sent — and
within ``DERIVED_REGENERATE_SECONDS`` (or ``regenerate_window`` if shorter).

The answer to a regenerate or to a correction is never stored: the user asked for an answer of
their own, and it is the one most likely to carry what they said was wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.core.conversation import Conversation
from proxy.core.identity import Identity
from proxy.core.model import Reason
from proxy.core.policy import IntentPolicy
from proxy.core.text.phrases import is_correction, is_reset_phrase
from proxy.observability.metrics import Metrics
from proxy.service.cache import SemanticCache

# A client with no session header re-sending the same conversation within this is retrying it;
# a minute is well past a "regenerate" click and well short of someone asking the question anew.
DERIVED_REGENERATE_SECONDS = 60.0


# reasons whose upstream answer is never written back
UNSTORED: frozenset[str] = frozenset({Reason.REGENERATE, Reason.CORRECTION})


THUMBS: frozenset[str] = frozenset({"positive", "negative", "regenerate"})


async def thumb(cache: SemanticCache, cache_id: str, kind: str) -> None:
    """A product's thumbs button on a served or stored answer (POST /admin/feedback): up rewards
    it; down or a regenerate button penalises it like a correction (a pending one is rejected)."""
    if kind not in THUMBS:
        raise ValueError(f"thumb must be one of {', '.join(sorted(THUMBS))}, got {kind!r}")
    if kind == "positive":
        await cache.reward(cache_id)
    else:
        await cache.penalise(cache_id)


def regenerate_window(who: Identity, configured: float) -> float:
    """Seconds within which the identical conversation re-sent counts as a regenerate."""
    return configured if who.session_explicit else min(configured, DERIVED_REGENERATE_SECONDS)


def same_conversation_again(who: Identity, conv: Conversation) -> bool:
    """Is an identical request evidence that the same conversation was re-sent (a regenerate)?
    Yes under an explicit session header; under a derived session, only with an end-user id or a
    re-sent history holding an assistant reply. An opening turn alone under a derived session is
    what anyone with the key asking the same first question sends."""
    return who.session_explicit or who.user is not None or any(t.role == "assistant" for t in conv.history)


@dataclass
class HitJudge:
    """A served hit is *accepted* when the session goes on without a correction or regenerate
    inside the feedback window, *corrected* otherwise (precision_hit and pollution)."""

    window: float
    open: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)

    def served(self, who: Identity, cache_id: str, now: float) -> bool:
        """Open a judgement; True when it displaced an earlier hit of the session, which the
        session went on from without correcting: that one counts as accepted."""
        displaced = (who.tenant, who.session) in self.open
        self.open[(who.tenant, who.session)] = (cache_id, now)
        return displaced

    def corrected(self, who: Identity) -> str | None:
        entry = self.open.pop((who.tenant, who.session), None)
        return entry[0] if entry else None

    def expire(self, now: float) -> int:
        done = [k for k, (_, t) in self.open.items() if now - t >= self.window]
        for k in done:
            del self.open[k]
        return len(done)


class FeedbackReader:
    """Reads a request for the session's signals about its last answer and applies them: a reset
    invalidates the session, a regenerate or correction penalises the last answer (a pending one
    is rejected) and marks a served hit corrected."""

    def __init__(
        self,
        *,
        cache: SemanticCache,
        judge: HitJudge,
        metrics: Metrics,
        regenerate_window: float,
        clock: Callable[[], float],
        corrected: Callable[[Identity, str], None] | None = None,
    ) -> None:
        """``corrected``: told of each served hit the user regenerated or corrected (the judge's
        learned levels take it as a wrong label)."""
        self.cache, self.judge, self.metrics, self.clock = cache, judge, metrics, clock
        self.regenerate_window = regenerate_window
        self.corrected = corrected

    async def read(self, conv: Conversation, who: Identity) -> Reason | None:
        """The signal this request carries about the last answer (a reset, a regenerate or a
        correction, named by the reason the request gets), applied; None when it carries none.
        The session's bookkeeping still under way must be done first (the planner waits for it:
        proxy.service.settling), or its last answer may not be written yet."""
        if is_reset_phrase(conv.current):
            await self.cache.invalidate_session(who.tenant, who.session, shared_too=False)
            self.judge.corrected(who)
            return Reason.SESSION_RESET
        last = await self.cache.store.session_last(who.tenant, who.session)
        if last is None:
            return None
        window = regenerate_window(who, self.regenerate_window)
        again = last.request_hash == conv.request_hash and self.clock() - last.at <= window
        if again and same_conversation_again(who, conv):
            signal = Reason.REGENERATE
        elif is_correction(conv.current):
            signal = Reason.CORRECTION
        else:
            return None
        if last.cache_id:
            penalised = await self.cache.penalise(last.cache_id)
            if penalised is not None and penalised.state == "pending":
                self.metrics.write("rejected")
        judged = self.judge.corrected(who)
        if judged is not None:
            # the signal is about the session's last answer: a hit the session went on from (its
            # last answer is a later one) was accepted, whatever is said of that later answer
            self.metrics.hit_judged("corrected" if judged == last.cache_id else "accepted")
            if judged == last.cache_id and self.corrected is not None:
                self.corrected(who, judged)
        return signal


def pending_would_serve(best_pending: float | None, policy: IntentPolicy, *, better_than: float | None) -> bool:
    """Would a pending answer (one still inside the feedback window) have been served? True when
    a visible pending record of the same intent scores at least ``accept`` and above the best
    ready candidate, so the miss can say why: the user's second try within the window is not a
    broken cache. The scores come from the lookup's own search: a miss pays nothing more."""
    floor = max(policy.accept, -1.0 if better_than is None else better_than)
    return best_pending is not None and best_pending >= floor
