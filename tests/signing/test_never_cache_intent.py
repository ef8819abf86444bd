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
