"""Intent classification: never-cache rules, forcing keywords, then nearest policy exemplars with a
margin.

The never-cache rules (proxy/core/text/never_cache.py) come first: a realtime or medical request the
exemplars miss would be stored and served to someone else, so recall there beats everything. They
only name intents the policy defines and does not cache; a policy that caches realtime on
purpose keeps its own classification. They read the conversation, not the turn alone: medical holds
for the rest of the conversation it governs, realtime for the follow-ups that lean on it
(proxy/core/text/carry_over.py). The forcing keywords of another never-cached intent count as one more
such rule, read in the user's own words (not in a text handed over to translate); realtime and
medical keywords and exemplars decide nothing (forced, as the exemplars' fallback, or nearest: then
the exemplars count as unsure): the rules read those words finer ("What is an exchange rate?", 天气
in a text to translate) and have had their say.

A learned reader (proxy/signing/never_cache_head.py) reads each turn's own vector for what no
rule names ("My left eye has been twitching", "三亚这几天风浪大不大"); a turn it reads as never-cache
counts as one the rules named, carried over the same way. It needs the turn's vector, so it reads
the turns the signer embeds (the current one and the recent ones) and remembers its verdict per
text for the later requests of the conversation.

Exemplars are embedded once when a policy is loaded (with the cache's own embedder), so a
request costs one matrix product here. Short follow-ups ("and the breakfast?") carry too
little signal: they inherit the conversation's running intent, unless that intent is never
cached, which carries only by the rules above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from proxy.core.lru import LruDict
from proxy.core.policy import Policy
from proxy.core.text.carry_over import TurnReading, carried, read_turn
from proxy.core.text.never_cache import MEDICAL, REALTIME, NeverCacheMatch
from proxy.core.text.normalize import NormalText
from proxy.core.text.phrases import KeywordRules
from proxy.signing.never_cache_head import NeverCacheHead, head_for

if TYPE_CHECKING:  # the classifier only calls it: reading a turn loads no event loop or model runtime
    from proxy.embedding.batching import BatchingEmbedder

GENERAL = "general"
RULED = frozenset({MEDICAL, REALTIME})  # the never-cached intents proxy.core.text.never_cache recognises


@dataclass(frozen=True, slots=True)
class IntentGuess:
    intent: str
    similarity: float
    forced: bool = False


class IntentClassifier:
    def __init__(
        self,
        policy: Policy,
        names: Sequence[str],
        matrix: np.ndarray,
        *,
        reading_cache: int = 8192,
        reader: NeverCacheHead | None = None,
    ) -> None:
        self.policy = policy
        self.reader = reader
        self._never_cached = frozenset(n for n, p in policy.intents.items() if not p.cache)
        # the exemplars of a never-cached intent the rules name pick nothing either: a question
        # near "美元兑人民币是多少" is as often "What is an exchange rate?" (bench_never_cache.py
        # measures the rules and the reader, which read the difference). Nearest, they leave the
        # exemplars unsure; they still stand between the other intents, as the margin reads them
        self._ruled_off = RULED & self._never_cached
        self._names = list(names)
        # exemplars grouped by intent (first-seen order), so one reduceat gives each intent's best
        self._intents = list(dict.fromkeys(self._names))
        rank = {name: i for i, name in enumerate(self._intents)}
        order = sorted(range(len(self._names)), key=lambda i: rank[self._names[i]])
        self._matrix = np.ascontiguousarray(np.asarray(matrix, dtype=np.float32)[order])
        grouped = [self._names[i] for i in order]
        self._starts = np.array([grouped.index(name) for name in self._intents], dtype=np.intp)
        forcing = {n: p.keywords for n, p in policy.intents.items() if p.force and p.keywords}
        self._forcing = KeywordRules({n: k for n, k in forcing.items() if n not in self._never_cached})
        # a never-cached intent's forcing keywords are one more never-cache rule, except for the
        # intents the rules name: their rules read the same words finer ("What is an exchange
        # rate?", "Now into Spanish.", 天气 in a text to translate) and a keyword would undo that
        self._never_forcing = KeywordRules(
            {n: k for n, k in forcing.items() if n in self._never_cached and n not in RULED}
        )
        # nor do they pick one when the exemplars are unsure: the rules have had their say
        self._keywords = KeywordRules(
            {n: p.keywords for n, p in policy.intents.items() if p.keywords and not (n in RULED and not p.cache)}
        )
        # history turns come back with every request: each is read once per policy
        self._readings: LruDict[str, TurnReading] = LruDict(reading_cache)
        # the learned reader's verdict per turn as written (None: read as other)
        self._learned: LruDict[str, NeverCacheMatch | None] = LruDict(reading_cache)

    @classmethod
    async def build(cls, policy: Policy, embedder: BatchingEmbedder) -> IntentClassifier:
        names = [n for n, p in policy.intents.items() for _ in p.exemplars]
        texts = [e for p in policy.intents.values() for e in p.exemplars]
        matrix = await embedder.embed(texts, bounded=False) if texts else np.zeros((0, embedder.dim), dtype=np.float32)
        reader = head_for(embedder.backend.name) if policy.classifier.never_cache_reader else None
        return cls(policy, names, matrix, reader=reader)

    def classify(
        self, text: NormalText, vector: np.ndarray, *, running: str | None = None, asked: Sequence[str] = ()
    ) -> IntentGuess:
        """``asked``: the conversation's user turns as written, oldest first, this one last; the
        never-cache rules read them. Without them, ``text`` alone."""
        self.learn(asked[-1] if asked else text, vector)
        never = self.never_cached(asked or (text,))
        if never is not None:
            return IntentGuess(never.intent, 1.0, forced=True)
        forced = self._forcing.intent(text)
        if forced:
            return IntentGuess(forced, 1.0, forced=True)
        if running in self._never_cached:
            running = None  # carried by the never-cache rules or not at all
        settings = self.policy.classifier
        best, best_sim, second = self._nearest(vector)
        if len(text.strip()) <= settings.followup_max_chars and running and running != GENERAL:
            return IntentGuess(running, best_sim)
        if (
            best is None
            or best in self._ruled_off
            or best_sim < settings.min_similarity
            or best_sim - second < settings.margin
        ):
            by_keyword = self._keywords.intent(text)
            if by_keyword:
                return IntentGuess(by_keyword, best_sim)
            return IntentGuess(running or GENERAL, best_sim)
        return IntentGuess(best, best_sim)

    def never_cached(self, asked: Sequence[str]) -> NeverCacheMatch | None:
        """The never-cache intent of the last of ``asked`` (a conversation's user turns as written),
        from the rules and this policy's forcing keywords of never-cached intents, carried over by
        proxy.core.text.carry_over; None where the policy caches what the rules name."""
        found = carried([self._reading(turn) for turn in asked])
        return found if found is not None and found.intent in self._never_cached else None

    def learn(self, turn: str, vector: np.ndarray) -> None:
        """The learned reader's verdict on a turn as written, from its vector, kept for the turns
        after it (which arrive without it)."""
        if self.reader is not None:
            self._learned.put(turn, self.reader.read(vector))

    def _reading(self, turn: str) -> TurnReading:
        reading = self._readings.remember(turn, self._read)
        # the vector reads the whole turn: where it hands material over ("Translate: Breaking
        # news ..."), it reads the material, which asks nothing
        learned = self._learned.get(turn) if reading.whole else None
        if learned is None:
            return reading
        # medical first, as the rules read it ("今天头疼" is a body before it is a day): a body read
        # by the reader outranks a realtime word ("My hands shake a lot lately"), and so the
        # conversation stays medical after it
        if reading.match is None or (learned.intent == MEDICAL and reading.match.intent != MEDICAL):
            return replace(reading, match=learned)
        return reading

    def _read(self, turn: str) -> TurnReading:
        reading = read_turn(turn)
        if reading.match is None and (keyword := self._never_forcing.intent(NormalText(reading.asked))):
            return replace(reading, match=NeverCacheMatch(keyword, "policy keyword"))
        return reading

    def _nearest(self, vector: np.ndarray) -> tuple[str | None, float, float]:
        """Best intent, best similarity, and the best similarity of any *other* intent."""
        if not len(self._names):
            return None, 0.0, 0.0
        per_intent = np.maximum.reduceat(self._matrix @ np.asarray(vector, dtype=np.float32), self._starts)
        # stable: of intents tied at the top, the first in the policy's order wins
        ranked = np.argsort(-per_intent, kind="stable")
        second_sim = float(per_intent[ranked[1]]) if len(ranked) > 1 else -1.0
        return self._intents[ranked[0]], float(per_intent[ranked[0]]), second_sim

    def exemplar_count(self) -> int:
        return len(self._names)
