from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence

import numpy as np
import orjson
import pytest

from proxy.core.openai.request import parse_chat_request
from proxy.core.policy import load_policy
from proxy.core.text.normalize import NormalText
from proxy.embedding.batching import BatchingEmbedder
from proxy.settings import DEFAULT_POLICY
from proxy.signing.intent import IntentClassifier
from proxy.signing.signer import ContextSigner, SignerSettings


def _classifier_that_says_general() -> tuple[IntentClassifier, np.ndarray]:
    """One exemplar, of general, at similarity 1.0: the exemplar path alone would answer general."""
    vector = np.array([1.0, 0.0], dtype=np.float32)
    return IntentClassifier(load_policy(DEFAULT_POLICY), ["general"], vector.reshape(1, -1)), vector


@pytest.mark.parametrize(
    ("text", "intent"),
    [
        ("What is the bitcoin price?", "realtime"),
        ("I have a headache and nausea, what could it be?", "medical"),
        ("以太坊行情怎么样", "realtime"),
        ("阿莫西林一次吃几粒", "medical"),
    ],
)
def test_never_cache_rules_win_over_the_exemplars(text: str, intent: str) -> None:
    classifier, vector = _classifier_that_says_general()
    guess = classifier.classify(text, vector)
    assert (guess.intent, guess.forced) == (intent, True)


def test_ordinary_questions_still_go_to_the_exemplars() -> None:
    classifier, vector = _classifier_that_says_general()
    assert classifier.classify("How do prices work in economics?", vector).intent == "general"


def test_the_exemplars_of_a_never_cached_intent_the_rules_name_pick_nothing() -> None:
    # the nearest exemplar is realtime's, and the rules see nothing asked of now: the exemplars are
    # unsure, as below the margin ("What is an exchange rate?" sits near "How much is one euro")
    vector = np.array([1.0, 0.0], dtype=np.float32)
    near = np.stack([vector, np.array([0.9, 0.436], dtype=np.float32)])
    shipped = load_policy(DEFAULT_POLICY)
    classifier = IntentClassifier(shipped, ["realtime", "shopping"], near)
    assert classifier.classify(NormalText("is a refurbished kindle worth it"), vector).intent == "general"
    assert classifier.classify(NormalText("is a refurbished kindle worth it"), vector, running="shopping").intent == (
        "shopping"
    )
    # a policy that caches realtime on purpose keeps its exemplars
    cached = dataclasses.replace(
        shipped, intents={**shipped.intents, "realtime": dataclasses.replace(shipped.intents["realtime"], cache=True)}
    )
    kept = IntentClassifier(cached, ["realtime", "shopping"], near)
    assert kept.classify(NormalText("zzz"), vector).intent == "realtime"


def _unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_an_intent_scores_its_best_exemplar_wherever_its_exemplars_stand() -> None:
    # travel's exemplars apart, code's between them: each intent is scored by its best one, and
    # the margin is to the best exemplar of any other intent
    names = ["travel", "code", "travel", "shopping"]
    matrix = np.stack([_unit(1, 0, 0), _unit(0, 1, 0), _unit(0.6, 0.8, 0), _unit(0, 0, 1)])
    classifier = IntentClassifier(load_policy(DEFAULT_POLICY), names, matrix)
    text = "zzz qqq"  # no keyword, no never-cache rule: the exemplars decide
    guess = classifier.classify(text, _unit(0.62, 0.78, 0.1))
    assert guess.intent == "travel" and guess.similarity == pytest.approx(float(_unit(0.62, 0.78, 0.1) @ matrix[2]))
    assert classifier.classify(text, _unit(0, 0.2, 1)).intent == "shopping"
    best, best_sim, second = classifier._nearest(_unit(0.1, 1, 0))
    assert best == "code" and best_sim == pytest.approx(float(_unit(0.1, 1, 0) @ matrix[1]))
    assert second == pytest.approx(float(_unit(0.1, 1, 0) @ matrix[2]))
    assert classifier.exemplar_count() == 4


def test_of_intents_tied_at_the_top_the_first_in_the_policy_wins() -> None:
    names = ["code", "travel"]
    matrix = np.stack([_unit(1, 0), _unit(1, 0)])
    assert IntentClassifier(load_policy(DEFAULT_POLICY), names, matrix)._nearest(_unit(1, 0))[0] == "code"


class OneDirection:
    """A stand-in embedding model: every text at the same unit vector, so the exemplars alone
    decide nothing that a test does not set up."""

    name, dim, max_tokens = "one-direction", 2, 512

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.tile(np.array([1.0, 0.0], dtype=np.float32), (len(texts), 1))

    def count_tokens(self, text: str) -> int:
        return len(text.split())


@pytest.fixture
async def make_signer() -> AsyncIterator[Callable[[Sequence[str]], ContextSigner]]:
    """A signer over OneDirection whose exemplars are of the given intents (none: every turn is
    unsure, and falls back to the conversation's running intent)."""
    embedder = BatchingEmbedder(OneDirection())

    def make(exemplar_intents: Sequence[str]) -> ContextSigner:
        matrix = np.tile(np.array([1.0, 0.0], dtype=np.float32), (len(exemplar_intents), 1))
        classifier = IntentClassifier(load_policy(DEFAULT_POLICY), exemplar_intents, matrix)
        return ContextSigner(embedder, classifier, SignerSettings())

    yield make
    await embedder.close()


async def intent_of(signer: ContextSigner, turns: Sequence[str]) -> str:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    sig = await signer.sign(parse_chat_request(orjson.dumps({"model": "m", "messages": msgs})))
    return sig.tags.intent


# issue 38.2: the follow-up of a symptom was stored as `refund` (the exemplars' best) and served
# to another session as an exact repeat
async def test_a_medical_conversation_keeps_its_follow_ups_medical(
    make_signer: Callable[[Sequence[str]], ContextSigner],
) -> None:
    signer = make_signer(["refund"])
    headache = ["I have a headache and nausea.", "Rest in a dark room and drink water."]
    assert await intent_of(signer, [*headache, "How long will it last?"]) == "medical"
    assert await intent_of(signer, [*headache, "How long will it last?", "OK", "Can I still go to work?"]) == "medical"
    assert await intent_of(signer, ["我头疼还有点恶心", "建议先休息。", "要多久才能好"]) == "medical"
    # a turn on a subject of its own leaves the conversation's medical topic
    assert await intent_of(signer, [*headache, "Did Cary Grant win any awards?"]) == "refund"


# issue 38.3: a realtime intent carried over to requests that are not realtime, and the weather
# inside a text to translate
@pytest.mark.parametrize(
    "turns",
    [
        ["What's the weather in Chicago today?", "54°F and cloudy.", "Did Cary Grant win any awards?"],
        ["Is it going to rain in Portland this weekend?", "Showers Saturday.", "Where did Tyson Chandler grow up?"],
        ["北京今天天气怎么样", "晴，12到24度。", "C语言会吗"],
        ["深圳这周末会下雨吗", "周六有雷阵雨。", "星座怎么算"],
        ["帮我把这句话翻译成英文:今天天气很好."],
        ["What is an exchange rate?"],  # a policy keyword ("exchange rate") no longer forces realtime
    ],
)
async def test_realtime_holds_only_for_the_turns_that_lean_on_it(
    make_signer: Callable[[Sequence[str]], ContextSigner], turns: list[str]
) -> None:
    assert await intent_of(make_signer([]), turns) not in ("realtime", "medical")


@pytest.mark.parametrize("follow_up", ["And tomorrow?", "What about Milwaukee?", "Which channel?", "Why did it go up?"])
async def test_an_elliptical_follow_up_of_a_realtime_turn_stays_realtime(
    make_signer: Callable[[Sequence[str]], ContextSigner], follow_up: str
) -> None:
    turns = ["What's the weather in Chicago today?", "54°F and cloudy.", follow_up]
    assert await intent_of(make_signer(["travel"]), turns) == "realtime"
