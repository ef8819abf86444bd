"""The context signer: a layered fingerprint of the whole conversation.

Coarse tags (intent, active entities, change flag, topic-switch flag) act as
hard filters; the dense vector of a trimmed *encoding view* does near-matching inside them.
Per-turn vectors and intents are kept by content hash, so a request embeds only what is new.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from proxy.core.conversation import Conversation, Cuts, Normalizer, Turn
from proxy.core.lru import LruDict
from proxy.core.model import PREVIOUS_QUESTION_CHARS, QUESTION_CHARS, REPLY_HEAD_CHARS, CoarseTags, Signature
from proxy.core.openai.request import ChatRequest
from proxy.core.text.courtesy import bare_question
from proxy.core.text.entities import Entities, extract_entities, merge_entities
from proxy.core.text.lexical import all_known, asked_before, spelled_out, statements
from proxy.core.text.names import names_in
from proxy.core.text.normalize import Cutter, NormalText, default_segmenter, fold_space
from proxy.core.text.phrases import change_instruction
from proxy.embedding.batching import BatchingEmbedder
from proxy.signing.intent import GENERAL, IntentClassifier, IntentGuess


@dataclass(frozen=True, slots=True)
class SignerSettings:
    # the system prompt's tail in the view. Short: answers under another system prompt are kept
    # apart by the index filter (its version), so in the view it only anchors, and a long prompt
    # would take the view's budget from the conversation (512 characters are ~120 tokens)
    system_tail_chars: int = 96
    user_turn_chars: int = 300
    assistant_turn_chars: int = 160
    topic_window: int = 3
    cache_size: int = 20_000
    # dropped user turns folded back in as chunk vectors: the latest dropped, which weigh most; a
    # conversation first seen long (after a restart, or sent with its history) would otherwise
    # embed every old turn before its first answer, past the embedder's deadline
    chunk_lines: int = 8
    # signatures of whole requests: a Signature holds two vectors and the view (~5-10 KB)
    signed_size: int = 1024
    # the view's token budget (0: the model's length, less room for its special tokens)
    view_tokens: int = 0


def context_fingerprint(system_version: str, model: str, intent: str) -> str:
    return hashlib.sha256(f"{system_version}\x1f{model}\x1f{intent}".encode()).hexdigest()[:32]


def _key(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class ContextSigner:
    def __init__(
        self,
        embedder: BatchingEmbedder,
        classifier: IntentClassifier,
        settings: SignerSettings,
        *,
        segmenter: Cutter | None = None,
    ) -> None:
        """``segmenter``: the app's (``default_segmenter()`` for a caller without one)."""
        self.embedder = embedder
        self.settings = settings
        segmenter = segmenter or default_segmenter()
        self.normalize = Normalizer(settings.cache_size, segmenter=segmenter)
        # the cuts of normalised turns, which the signature carries on to the decision's guards
        self.cuts = Cuts(segmenter, settings.cache_size)
        self._vectors: LruDict[str, np.ndarray] = LruDict(settings.cache_size)
        self._entities: LruDict[NormalText, Entities] = LruDict(settings.cache_size)
        # a request re-sent byte for byte (an exact repeat, a retry) signs as it did: a signature is
        # a function of the request, the asserted system version and the policy's classifier alone
        self._signed: LruDict[tuple[str, str | None], Signature] = LruDict(settings.signed_size)
        self.classifier = classifier

    @property
    def classifier(self) -> IntentClassifier:
        return self._classifier

    @classifier.setter
    def classifier(self, classifier: IntentClassifier) -> None:
        """A reloaded policy tags anew: the signatures made under the old one are dropped."""
        self._classifier = classifier
        self._signed = LruDict(self.settings.signed_size)

    @property
    def view_budget(self) -> int:
        """Tokens a view may hold: the setting's, within the model's length less its special tokens."""
        most = self.embedder.backend.max_tokens - 8
        return min(most, self.settings.view_tokens or most)

    def read(self, request: ChatRequest) -> Conversation:
        """The request's conversation, normalised once for everything that reads it after."""
        return self.normalize.conversation(request)

    def entities(self, norm: NormalText) -> Entities:
        """Entities of a normalised turn, kept like its vector: history turns recur every request."""
        return self._entities.remember(norm, lambda t: extract_entities(t, segmenter=self.cuts))

    async def vectors(
        self,
        texts: Sequence[str],
        stages: dict[str, float] | None = None,
        before_model: Callable[[], None] | None = None,
    ) -> list[np.ndarray]:
        """Embeddings by content hash; only texts not seen before reach the model, in one call.
        ``before_model`` is called just before that call, the one slow step of signing."""
        missing = list(dict.fromkeys(t for t in texts if self._vectors.get(_key(t)) is None))
        if missing:
            if before_model is not None:
                before_model()
            t0 = time.perf_counter()
            for text, vec in zip(missing, await self.embedder.embed(missing), strict=True):
                self._vectors.put(_key(text), vec)
            if stages is not None:
                stages["embed"] = stages.get("embed", 0.0) + time.perf_counter() - t0
        out = []
        for t in texts:
            vec = self._vectors.get(_key(t))
            assert vec is not None
            out.append(vec)
        return out

    async def sign(
        self,
        request: ChatRequest,
        conv: Conversation | None = None,
        *,
        system_version: str | None = None,
        stages: dict[str, float] | None = None,
        before_model: Callable[[], None] | None = None,
    ) -> Signature:
        s = self.settings
        conv = conv or self.read(request)
        memo = (conv.request_hash, system_version)
        if (known := self._signed.get(memo)) is not None:
            return known
        signed = self._signed
        current, history = conv.current, conv.history
        recent = conv.user_turns()[-s.topic_window :]
        # the view is built before the topic switch is known, as if the turn kept its topic (it
        # nearly always does), so the question, the recent turns and the view reach the model in
        # one call; a switch then embeds its own, shorter view
        kept_view = self._view(conv.system, history, current)
        vecs = await self.vectors([current, *recent, kept_view[0], *kept_view[1]], stages, before_model)
        vecs = vecs[: 1 + len(recent)]
        said = [*(m.text for m in history if m.role == "user"), conv.current_raw]
        running = self._running_intent(recent, vecs[1:], said[:-1])
        guess = self.classifier.classify(current, vecs[0], running=running, asked=said)
        restated = (
            self._restated_answer(history, current)
            if self.classifier.policy.for_intent(guess.intent).restatement
            else ""
        )
        # a turn that spells out the previous one keeps all its words: it cannot leave its topic
        switch = not restated and self._is_topic_switch(guess, running, vecs[0], vecs[1:])
        view_turns: tuple[Turn, ...] = () if switch else history
        users = [self.entities(m.norm) for m in view_turns if m.role == "user"]
        entities = merge_entities(users, self.entities(current))
        spv = system_version or conv.system_version
        view, dropped = self._view(conv.system, view_turns, current) if switch else kept_view
        vector = await self._view_vector(view, dropped, stages, before_model)
        asked, asked_before, reply_head = verifier_context(conv.current_raw, view_turns)
        tags = CoarseTags(
            intent=guess.intent,
            entities=entities,
            change_instruction=change_instruction(current),
            context_switch=switch,
            intent_forced=guess.forced,
        )
        sig = Signature(
            vector=vector,
            question_vector=vecs[0],
            tags=tags,
            system_prompt_version=spv,
            context_fingerprint=context_fingerprint(spv, request.model, guess.intent),
            request_hash=conv.request_hash,
            current_text=current,
            view_text=view,
            system_version_asserted=spv != conv.system_version,
            previous_reply=self._previous_reply(view_turns),
            turn_index=sum(1 for m in request.messages if m.role == "user"),
            restated_answer=restated,
            question_raw=asked,
            question_bare=bare_question(asked),
            previous_question=asked_before,
            previous_reply_head=reply_head,
            history_key=conv.history_key,
            cuts=self.cuts,
        )
        signed.put(memo, sig)  # the memo of the classifier it was made under: a reload meanwhile drops it
        return sig

    def _restated_answer(self, history: Sequence[Turn], current: NormalText) -> str:
        """lexical.restates, reading the conversation only once the words make it possible: the
        answer the user saw to the previous turn, or "" when this turn does not restate it."""
        users = [i for i, m in enumerate(history) if m.role == "user"]
        if not users:
            return ""
        at = users[-1]
        after = next((m for m in history[at + 1 :] if m.role == "assistant"), None)
        previous = history[at].norm
        names_nothing = self.entities(previous).is_empty() and not names_in(history[at].text)
        added = spelled_out(previous, current, self.cuts, names_nothing=names_nothing) if after is not None else set()
        if not added or after is None:
            return ""
        context: list[str] = [history[i].norm for i in users[:-1]]
        if asked_before(current, context, self.cuts):
            return ""
        # the stated facts of the reply the previous turn answered. Not those of the answer to it:
        # a word taken from that answer picks among what it offered ("a cheap restaurant" ->
        # "There are Italian and Indian ones" -> "a cheap Italian restaurant"), a narrower request
        before = next((m for m in reversed(history[:at]) if m.role == "assistant"), None)
        if before is not None:
            # from the raw reply: normalising drops its closing "?", and its last offer would pass
            # for a statement
            context.append(self.normalize(statements(before.text)))
        return fold_space(after.text) if all_known(added, context, self.cuts) else ""

    def _previous_reply(self, history: Sequence[Turn]) -> str:
        for m in reversed(history):
            if m.role == "assistant":
                return m.norm[:400]
        return ""

    def _running_intent(
        self, recent: Sequence[NormalText], vecs: Sequence[np.ndarray], said: Sequence[str]
    ) -> str | None:
        """``said``: the history's user turns as written, of which ``recent`` are the last: the
        never-cache rules read each turn as written, with the turns before it, as for the request."""
        running: str | None = None
        start = len(said) - len(recent)
        for i, (text, vec) in enumerate(zip(recent, vecs, strict=True)):
            guess = self.classifier.classify(text, vec, running=running, asked=said[: start + i + 1])
            if guess.intent != GENERAL or running is None:
                running = guess.intent
        return running

    def _is_topic_switch(
        self, guess: IntentGuess, running: str | None, current: np.ndarray, recent: Sequence[np.ndarray]
    ) -> bool:
        """A topic switch: a turn that leaves both the intent and the vector neighbourhood of the last
        turns starts a new conversation; its history must not pull it back to the old topic."""
        if not recent or running is None or guess.intent == running or guess.intent == GENERAL:
            return False
        centroid = np.mean(np.stack(recent), axis=0)
        centroid /= max(float(np.linalg.norm(centroid)), 1e-12)
        # e5 crowds short turns together: "明天的会议纪要帮我整理一下" scores 0.90 against three travel
        # turns, on-topic follow-ups 0.89. The intent change carries the signal; the vector only
        # vetoes a switch for a turn near-identical to recent ones, at a cosine set per model.
        return float(current @ centroid) < self.classifier.policy.classifier.topic_switch_similarity

    def _line(self, m: Turn) -> str:
        s = self.settings
        limit = s.user_turn_chars if m.role == "user" else s.assistant_turn_chars
        return f"{'user' if m.role == 'user' else 'assistant'}: {m.norm[:limit]}"

    def _view(self, system: NormalText, history: Sequence[Turn], current: NormalText) -> tuple[str, list[str]]:
        """System tail · compressed history · the current question twice (it carries the new intent).
        Over the model's length, the oldest turns that share no entity with the current request
        go first, then the oldest; the latest ``chunk_lines`` user turns dropped still count through
        chunk vectors."""
        s = self.settings
        head = f"system: {system[-s.system_tail_chars :]}" if system.strip() else ""
        tail = f"user: {current}\nuser: {current}"
        lines = [self._line(m) for m in history]
        budget = self.view_budget
        whole = "\n".join(x for x in (head, *lines, tail) if x)
        # most conversations: by length, or one tokenisation; the order of drops, which reads every
        # turn's entities (the replies' too, which nothing else tags), only for those that do not fit
        if self.embedder.fits(whole, budget):
            return whole, []
        active = self.entities(current)
        related = [not _disjoint(self.entities(m.norm), active) for m in history]
        order = [i for i, r in enumerate(related) if not r] + [i for i, r in enumerate(related) if r]

        def view(drops: int) -> str:
            gone = set(order[:drops])
            return "\n".join(x for x in (head, *[ln for i, ln in enumerate(lines) if i not in gone], tail) if x)

        def fits(drops: int) -> bool:
            return self.embedder.fits(view(drops), budget)

        # the fewest drops that fit: dropping a turn never lengthens the view, so a bisection finds
        # what dropping one at a time would, in a few tokenisations of the view instead of one a turn
        low, high = 1, len(order)
        while low < high:
            mid = (low + high) // 2
            low, high = (low, mid) if fits(mid) else (mid + 1, high)
        # a dropped turn counts through its user text as normalised: the very text each user turn was
        # embedded as when it was asked (and while it was recent), so a live conversation's chunks
        # cost the model nothing
        users: list[str] = [history[i].norm for i in order[:high] if history[i].role == "user"]
        return view(high), users[max(len(users) - s.chunk_lines, 0) :]

    async def _view_vector(
        self,
        view: str,
        dropped: Sequence[str],
        stages: dict[str, float] | None = None,
        before_model: Callable[[], None] | None = None,
    ) -> np.ndarray:
        vecs = await self.vectors([view, *dropped], stages, before_model)
        vector = vecs[0]
        if dropped:
            # recency weights: later dropped turns weigh more; the view keeps most of the mass
            weights = np.arange(1, len(dropped) + 1, dtype=np.float32)
            chunk = np.average(np.stack(vecs[1:]), axis=0, weights=weights)
            vector = 0.75 * vector + 0.25 * chunk
        return (vector / max(float(np.linalg.norm(vector)), 1e-12)).astype(np.float32)


def verifier_context(question: str, history: Sequence[Turn]) -> tuple[str, str, str]:
    """The request as the pair verifier reads it: the question as written, the previous user turn
    and the head of the previous reply, each cut to what the verifier reads of it."""
    previous_question = next((m.text for m in reversed(history) if m.role == "user"), "")
    previous_reply = next((m.text for m in reversed(history) if m.role == "assistant"), "")
    return (question[:QUESTION_CHARS], previous_question[:PREVIOUS_QUESTION_CHARS], previous_reply[:REPLY_HEAD_CHARS])


def _disjoint(a: Entities, b: Entities) -> bool:
    slots_a = {n.slot for n in a.numbers}
    slots_b = {n.slot for n in b.numbers}
    return not (a.places & b.places or a.products & b.products or a.people & b.people or slots_a & slots_b)
