"""Intent classification: never-cache rules, forcing keywords, then nearest policy exemplars with a
margin.

The never-cache rules (proxy/text/never_cache.py) come first: a realtime or medical request the
exemplars miss would be stored and served to someone else, so recall there beats everything. They
only name intents the policy defines and does not cache; a policy that caches realtime on
purpose keeps its own classification.

Exemplars are embedded once when a policy is loaded (with the cache's own embedder), so a
request costs one matrix product here. Short follow-ups ("and the breakfast?") carry too
little signal: they inherit the conversation's running intent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from proxy.embedding.batching import BatchingEmbedder
from proxy.policy import Policy
from proxy.text.never_cache import never_cache_match
from proxy.text.normalize import NormalText
from proxy.text.phrases import KeywordRules

GENERAL = "general"


@dataclass(frozen=True, slots=True)
class IntentGuess:
    intent: str
    similarity: float
    forced: bool = False


class IntentClassifier:
    def __init__(self, policy: Policy, names: Sequence[str], matrix: np.ndarray) -> None:
        self.policy = policy
        self._names = list(names)
        # exemplars grouped by intent (first-seen order), so one reduceat gives each intent's best
        self._intents = list(dict.fromkeys(self._names))
        rank = {name: i for i, name in enumerate(self._intents)}
        order = sorted(range(len(self._names)), key=lambda i: rank[self._names[i]])
        self._matrix = np.ascontiguousarray(np.asarray(matrix, dtype=np.float32)[order])
        grouped = [self._names[i] for i in order]
        self._starts = np.array([grouped.index(name) for name in self._intents], dtype=np.intp)
        self._forcing = KeywordRules({n: p.keywords for n, p in policy.intents.items() if p.force and p.keywords})
        self._keywords = KeywordRules({n: p.keywords for n, p in policy.intents.items() if p.keywords})
        self._never_cached = frozenset(n for n, p in policy.intents.items() if not p.cache)

    @classmethod
    async def build(cls, policy: Policy, embedder: BatchingEmbedder) -> IntentClassifier:
        names = [n for n, p in policy.intents.items() for _ in p.exemplars]
        texts = [e for p in policy.intents.values() for e in p.exemplars]
        matrix = await embedder.embed(texts, bounded=False) if texts else np.zeros((0, embedder.dim), dtype=np.float32)
        return cls(policy, names, matrix)

    def classify(self, text: NormalText, vector: np.ndarray, *, running: str | None = None) -> IntentGuess:
        never = never_cache_match(text)
        if never is not None and never.intent in self._never_cached:
            return IntentGuess(never.intent, 1.0, forced=True)
        forced = self._forcing.intent(text)
        if forced:
            return IntentGuess(forced, 1.0, forced=True)
        settings = self.policy.classifier
        best, best_sim, second = self._nearest(vector)
        if len(text.strip()) <= settings.followup_max_chars and running and running != GENERAL:
            return IntentGuess(running, best_sim)
        if best is None or best_sim < settings.min_similarity or best_sim - second < settings.margin:
            by_keyword = self._keywords.intent(text)
            if by_keyword:
                return IntentGuess(by_keyword, best_sim)
            return IntentGuess(running or GENERAL, best_sim)
        return IntentGuess(best, best_sim)

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
