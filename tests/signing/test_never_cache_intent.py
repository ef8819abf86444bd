from __future__ import annotations

import numpy as np
import pytest

from proxy.policy import load_policy
from proxy.settings import DEFAULT_POLICY
from proxy.signing.intent import IntentClassifier


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
