"""The change-detection stage of the decision: does the current turn change what the candidate answered?

A candidate in the half-hit zone is close to the request as a whole; what decides is whether
the latest turn negates, adds, modifies or names constraints the candidate did not answer
(``modifies_context``: the history is still useful, the answer is not), or leaves its topic
(``new_topic``: a plain miss).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from proxy.core.text.entities import Entities, entities_conflict
from proxy.core.text.normalize import NormalText
from proxy.core.text.phrases import change_instruction, change_signals

__all__ = ["ChangeKind", "ChangeVerdict", "change_instruction", "detect_change", "new_entity_slots"]


class ChangeKind(StrEnum):
    NO_CHANGE = "no_change"
    MODIFIES_CONTEXT = "modifies_context"
    NEW_TOPIC = "new_topic"


@dataclass(frozen=True)
class ChangeVerdict:
    kind: ChangeKind
    signals: tuple[str, ...]  # why: "negation:不要", "conflict:budget", "new:places", "intent:a->b"


def new_entity_slots(candidate: Entities, request: Entities) -> list[str]:
    """Slots the request pins that the candidate's answer never saw (a new budget, another city)."""
    slots = [
        name
        for name, cand, req in (
            ("places", candidate.places, request.places),
            ("products", candidate.products, request.products),
            ("people", candidate.people, request.people),
        )
        if req - cand
    ]
    # "推荐一款" is as often an article as a constraint: a lone count of one is not news; nor is a
    # figure the candidate named under another slot ("under 1500 dollars" a budget, "for 1500
    # dollars" a price): the same amount, which the two wordings' parsers file apart
    named = {(n.value, n.unit) for n in candidate.numbers}
    fresh = {
        n.slot for n in request.numbers if not (n.slot == "count" and n.value == 1) and (n.value, n.unit) not in named
    }
    return slots + sorted(fresh - candidate.slots())


def detect_change(
    current_turn: NormalText,
    *,
    candidate_entities: Entities,
    request_entities: Entities,
    candidate_intent: str,
    request_intent: str,
    restated_turn: NormalText | None = None,
    candidate_turn: NormalText | None = None,
    neighbours: Collection[str] = frozenset(),
) -> ChangeVerdict:
    """Classify the current turn against a candidate's context.

    Another intent (other than the request's intent's ``neighbours``, whose records the hard filter
    lets through as its own) or an explicit topic switch is a new topic; a change phrase, an entity that
    conflicts with the candidate's, or a constraint the candidate lacked modifies the context.
    A turn that restates another (``restated_turn``, see proxy.core.text.lexical.restates) adds only
    words the conversation already holds: a slot it fills names what the elliptical turn pointed
    at, so it is not news, and a change phrase it keeps from that turn ("What about Italian
    food?") was answered already, and neither is another intent the classifier gives the other
    wording; a conflict or a phrase of its own still is news. A phrase the candidate's own turn
    (``candidate_turn``) has too asked for that change there, so its answer made it ("蓝牙耳机可以
    换成粉色的吗" / "蓝牙耳机想换成粉色…").
    """
    restated = restated_turn is not None
    phrases = change_signals(current_turn)
    for answered in (restated_turn, candidate_turn):
        if answered is not None:
            kept = set(change_signals(answered))
            phrases = tuple(p for p in phrases if p not in kept)
    topic = tuple(s for s in phrases if s.startswith("topic_switch:"))
    if (
        not restated
        and candidate_intent
        and request_intent
        and candidate_intent != request_intent
        and candidate_intent not in neighbours
    ):
        return ChangeVerdict(ChangeKind.NEW_TOPIC, (f"intent:{candidate_intent}->{request_intent}", *topic))
    if topic:
        return ChangeVerdict(ChangeKind.NEW_TOPIC, topic)
    conflicts = entities_conflict(candidate_entities, request_entities)
    fresh = (
        [] if restated else [s for s in new_entity_slots(candidate_entities, request_entities) if s not in conflicts]
    )
    signals = (*phrases, *(f"conflict:{slot}" for slot in conflicts), *(f"new:{slot}" for slot in fresh))
    kind = ChangeKind.MODIFIES_CONTEXT if signals else ChangeKind.NO_CHANGE
    return ChangeVerdict(kind, signals)
