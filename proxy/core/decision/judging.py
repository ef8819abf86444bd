"""The gray zone the scores cannot settle, handed to the judge as a command (docs/architecture.md,
"The judge"). Pure: ``ask_judge`` says which candidates the model behind the proxy should read,
and ``judged`` resumes the decision with its verdicts, so ``decide`` and this module need no model
and no network in tests.

A candidate reaches the judge only when every net that reads the request against it passed: the
hard filters (intent, entities), the judge's score floor, change detection, the lexical guards and
answer validation. The accept zone and the verifier's level are what the judge replaces, so they
are the only stages it skips. Never an exact repeat (decided without it), never an alias (a
wording the judge approved answers its own wording only) but the session's own, for a question it
asks again; never a record it already refused for this wording, and never where ``direct_hit:
false`` serves nothing but exact repeats.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from proxy.core.decision.context import DecisionContext, asked_again, lexical_guard, opens_alike
from proxy.core.decision.decide import answer_validation, change_detection
from proxy.core.model import Candidate, Decision, Reason, Signature, Status
from proxy.core.policy import IntentPolicy
from proxy.core.text.slots import slot_swapped

__all__ = ["AskJudge", "ask_judge", "judged", "ranked_by_verifier"]

_Stage = Callable[[DecisionContext], Decision | None]


def _judge_floor(ctx: DecisionContext) -> Decision | None:
    best = ctx.best
    # a question the session asks again after other turns is held to its own words: the judge
    # reads the conversation in between, which is what lowers the conversations' cosine
    score = best.question_similarity if asked_again(ctx.sig, best) else best.score
    if score < ctx.policy.judge_score_floor:
        return ctx.about_best(Status.MISS, Reason.BELOW_CANDIDATE, signals=False)
    return None


def _judge_guards(ctx: DecisionContext) -> Decision | None:
    # the judge reads word order, as the verifier does: a loose reordering ("reset my account
    # password" / "reset the password of my account") is its to judge, and so is what this very
    # conversation said since the answer (a question re-asked after other turns, a turn leaning
    # on another reply); two words or numbers exchanged, or another conversation's history it
    # never reads, stay a guard
    guard = lexical_guard(ctx.sig, ctx.best, verified=True, judged=True)
    return ctx.about_best(Status.HALF_HIT, guard) if guard else None


# the nets a judged candidate must pass, in ``decide``'s order
JUDGE_NETS: tuple[_Stage, ...] = (_judge_floor, change_detection, _judge_guards, answer_validation)


@dataclass(frozen=True, slots=True)
class AskJudge:
    """The command: read these candidates (best first) against the request; ``decision`` stands
    when no verdict serves. ``probabilities``: the verifier's, once it has ranked them."""

    candidates: tuple[Candidate, ...]
    decision: Decision
    probabilities: Mapping[str, float] = field(default_factory=dict)
    # the question similarity that admits a record the verifier scored low, where it is not
    # ``judge_near``: a question asked again by the session, or another conversation's opening
    near: Mapping[str, float] = field(default_factory=dict)
    # records whose turn asks the request's frame about another subject (``slot_swapped``): never
    # admitted on their turns' nearness alone
    swapped: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.candidates)


def ask_judge(ctx: DecisionContext, decision: Decision, *, refused: Collection[str] = ()) -> AskJudge:
    """The candidates worth a judge call for a request ``decision`` did not serve: at most
    ``judge_top`` of those that passed every net, in score order. ``ctx``: the context ``decision``
    was made in, whose hard filters are not run again. ``refused``: records the judge already said
    no to for this wording."""
    sig, policy = ctx.sig, ctx.policy
    if decision.status is Status.HIT or not policy.judges:
        return AskJudge((), decision)
    chosen: list[Candidate] = []
    # where the verifier ranks them first, it reads the nearest ``verify_top``
    wanted = policy.judge_top if policy.judge_verify is None else max(policy.judge_top, policy.verify_top)
    for cand in ctx.survivors:
        if len(chosen) >= wanted:
            break
        record = cand.record
        if record.cache_id in refused:
            continue
        if record.coarse_tags.alias_of is not None and not asked_again(sig, cand):
            # an alias answers the wording the judge approved; the session's own turn, asked
            # again in other words, is the judge's to read against the answer itself
            continue
        if record.request_hash == sig.request_hash:
            continue  # this very wording after other turns: the guards' other_history, not a judge's question
        alone = DecisionContext((cand,), sig, policy)
        if alone.exact_repeat or any(net(alone) is not None for net in JUDGE_NETS):
            continue
        chosen.append(cand)
    near = {c.record.cache_id: level for c in chosen if (level := _near(policy, sig, c)) is not None}
    # read only where nearness could admit the record, on the normalised turns ("top five" = "top 5")
    swapped = frozenset(
        c.record.cache_id
        for c in chosen
        if (level := near.get(c.record.cache_id, policy.judge_near)) is not None
        and c.question_similarity >= level
        and slot_swapped(sig.current_text, c.record.coarse_tags.question, sig.cuts)
    )
    return AskJudge(tuple(chosen), decision, near=near, swapped=swapped)


def _near(policy: IntentPolicy, sig: Signature, cand: Candidate) -> float | None:
    if policy.judge_near_again is not None and asked_again(sig, cand):
        return policy.judge_near_again
    if policy.judge_near_opening is not None and opens_alike(sig, cand):
        return policy.judge_near_opening
    return None


def ranked_by_verifier(ask: AskJudge, probabilities: Mapping[str, float], policy: IntentPolicy) -> AskJudge:
    """The local verifier ranks and filters what the judge reads (``judge_verify``): a candidate it
    scores below the level is not worth a call, unless its current turn is as near the request's as
    ``judge_near`` says (the verifier reads many rewordings as other questions: "非洲最高的山是哪座？"
    / "非洲的最高峰叫什么" at 0.04); one it did not score (busy, failed) never is. The rest go in its
    order, those it admitted first, the best ``judge_top``. A question the session asks again is
    held to ``judge_near_again``, another conversation's opening to ``judge_near_opening``, where
    the policy sets them. Nearness never admits a turn that asks the request's frame about another
    subject ("a fun fact about koalas" / "...about sharks"): the vectors barely move, and that is
    where the judge's false yes gather; only the verifier's level does."""
    if policy.judge_verify is None:
        return ask
    level = policy.judge_verify

    def admitted(c: Candidate) -> bool:
        p = probabilities.get(c.record.cache_id)
        near = ask.near.get(c.record.cache_id, policy.judge_near)
        close = near is not None and c.question_similarity >= near and c.record.cache_id not in ask.swapped
        return p is not None and (p >= level or close)

    kept = [c for c in ask.candidates if admitted(c)]
    kept.sort(key=lambda c: (probabilities[c.record.cache_id] < level, -probabilities[c.record.cache_id]))
    chosen = tuple(kept[: policy.judge_top])
    return replace(
        ask, candidates=chosen, probabilities={c.record.cache_id: probabilities[c.record.cache_id] for c in chosen}
    )


def judged(
    ask: AskJudge,
    verdicts: Mapping[str, bool],
    *,
    late: bool = False,
    learned: Collection[str] = (),
    audited: Collection[str] = (),
) -> Decision:
    """The decision resumed with the judge's verdicts (cache id → yes): the first candidate, in the
    command's order, that it said yes to is served (``learned``: those a learned level said yes to
    without asking); else the decision stands, saying the judge refused (or came late) where it was
    asked. A yes in ``audited`` is forwarded instead, so its answer can be compared."""
    for cand in ask.candidates:
        cache_id = cand.record.cache_id
        if verdicts.get(cache_id):
            if cache_id in audited:
                return replace(ask.decision, reason=Reason.JUDGE_AUDIT, stage="judge")
            reason = Reason.LEARNED if cache_id in learned else Reason.JUDGED
            verified = ask.probabilities.get(cache_id)
            return Decision(Status.HIT, reason, cand.record, cand.score, stage="judge", verified=verified)
    if not ask.candidates:
        return ask.decision
    reason = Reason.JUDGE_LATE if late and len(verdicts) < len(ask.candidates) else Reason.JUDGE_REFUSED
    return replace(ask.decision, reason=reason, stage="judge")
