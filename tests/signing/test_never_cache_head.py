"""The learned never-cache reader: its weights, what it reads, and how the classifier carries it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from proxy.core.conversation import Normalizer
from proxy.core.policy import PolicyError, load_policy, parse_policy
from proxy.core.text.never_cache import MEDICAL, REALTIME
from proxy.embedding.backends import SyncEmbedder
from proxy.settings import DEFAULT_POLICY
from proxy.signing.intent import IntentClassifier
from proxy.signing.never_cache_head import RULE, NeverCacheHead, head_for

DIM = 4


def _head(thresholds: dict[str, float]) -> NeverCacheHead:
    # class i reads axis i strongly: a vector along axis 2 is medical, along axis 1 realtime
    weights = np.zeros((3, DIM), dtype=np.float32)
    weights[0, 0] = weights[1, 1] = weights[2, 2] = 10.0
    levels = (math.inf, thresholds.get("realtime", math.inf), thresholds.get("medical", math.inf))
    return NeverCacheHead("test-pack", ("other", "realtime", "medical"), weights, np.zeros(3, np.float32), levels)


def _axis(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i] = 1.0
    return v


def test_reads_only_the_classes_given_a_level() -> None:
    head = _head({"medical": 0.9})
    assert head.read(_axis(2)) is not None and head.read(_axis(2)).intent == MEDICAL  # type: ignore[union-attr]
    assert head.read(_axis(2)).rule == RULE  # type: ignore[union-attr]
    assert head.read(_axis(0)) is None  # other
    assert head.read(_axis(1)) is None  # realtime is trained but has no level: never read


def test_below_its_level_a_class_is_not_read() -> None:
    unsure = (_axis(0) + _axis(2)) / np.sqrt(2)  # other and medical equally likely
    assert _head({"medical": 0.9}).read(unsure.astype(np.float32)) is None
    assert _head({"medical": 0.4}).read(unsure.astype(np.float32)) is not None


def test_a_vector_of_another_size_is_not_read() -> None:
    assert _head({"medical": 0.5}).read(np.ones(DIM + 1, dtype=np.float32)) is None


def test_weights_load_only_for_their_own_pack(tmp_path: Path) -> None:
    head = _head({"medical": 0.9})
    np.savez(tmp_path / "never_cache.test-pack.npz", weights=head.weights, bias=head.bias)
    manifest = {"model": "test-pack", "classes": list(head.classes), "thresholds": {"medical": 0.9}}
    (tmp_path / "never_cache.test-pack.json").write_text(json.dumps(manifest))
    loaded = head_for("test-pack", tmp_path)
    assert loaded is not None and loaded.thresholds == (math.inf, math.inf, 0.9)
    assert head_for("other-pack", tmp_path) is None
    # a manifest that names another pack than its file is not used
    (tmp_path / "never_cache.renamed.json").write_text(json.dumps(manifest))
    np.savez(tmp_path / "never_cache.renamed.npz", weights=head.weights, bias=head.bias)
    assert head_for("renamed", tmp_path) is None


def test_weights_that_do_not_match_their_classes_are_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "never_cache.bad.npz", weights=np.zeros((2, DIM)), bias=np.zeros(2))
    manifest = {"model": "bad", "classes": ["other", "realtime", "medical"], "thresholds": {}}
    (tmp_path / "never_cache.bad.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="do not match"):
        head_for("bad", tmp_path)


def test_the_shipped_reader_belongs_to_the_default_pack_and_reads_medical_only() -> None:
    policy = load_policy(DEFAULT_POLICY)
    head = head_for(policy.embedding_model or "")
    assert head is not None and head.classes == ("other", "realtime", "medical")
    assert head.thresholds[1] == math.inf and 0.5 < head.thresholds[2] < 1.0


def _classifier(reader: NeverCacheHead | None) -> IntentClassifier:
    return IntentClassifier(load_policy(DEFAULT_POLICY), [], np.zeros((0, DIM), dtype=np.float32), reader=reader)


def test_a_turn_the_reader_names_medical_carries_over_like_a_ruled_one() -> None:
    classifier = _classifier(_head({"medical": 0.9}))
    first = "My left eye has been twitching for a week."
    assert classifier.never_cached([first]) is None  # no rule names it, and it was not read yet
    classifier.learn(first, _axis(2))
    found = classifier.never_cached([first])
    assert found is not None and (found.intent, found.rule, found.carried) == (MEDICAL, RULE, False)
    follow = classifier.never_cached([first, "Could it be something serious?"])
    assert follow is not None and follow.intent == MEDICAL and follow.carried
    # a courtesy still ends it for that turn
    assert classifier.never_cached([first, "Thanks!"]) is None


def test_a_body_the_reader_names_outranks_a_realtime_word_and_holds_the_conversation() -> None:
    classifier = _classifier(_head({"medical": 0.9}))
    first = "My hands shake a lot in the mornings lately."  # "lately": a realtime rule's word
    ruled = classifier.never_cached([first])
    assert ruled is not None and ruled.intent == REALTIME
    classifier.learn(first, _axis(2))
    follow = classifier.never_cached([first, "I do drink four coffees a day."])
    assert follow is not None and (follow.intent, follow.carried) == (MEDICAL, True)


def test_without_a_reader_learning_changes_nothing() -> None:
    classifier = _classifier(None)
    first = "My left eye has been twitching for a week."
    classifier.learn(first, _axis(2))
    assert classifier.never_cached([first]) is None


def test_a_turn_that_hands_material_over_is_not_read() -> None:
    # the vector reads the whole turn, the material included; the user asks for a translation
    classifier = _classifier(_head({"medical": 0.9}))
    turn = 'Translate into French: "My left eye has been twitching for a week."'
    classifier.learn(turn, _axis(2))
    assert classifier.never_cached([turn]) is None


def test_classify_reads_the_current_turn_with_its_vector() -> None:
    classifier = _classifier(_head({"medical": 0.9}))
    turn = "I've got a burning feeling when I pee."
    guess = classifier.classify(Normalizer()(turn), _axis(2), asked=[turn])
    assert (guess.intent, guess.forced) == (MEDICAL, True)


def test_the_policy_can_turn_the_reader_off() -> None:
    text = DEFAULT_POLICY.read_text(encoding="utf-8").replace(
        "classifier:\n", "classifier:\n  never_cache_reader: false\n", 1
    )
    assert parse_policy(yaml.safe_load(text), "test").classifier.never_cache_reader is False
    assert load_policy(DEFAULT_POLICY).classifier.never_cache_reader is True
    bad = text.replace("never_cache_reader: false", "never_cache_reader: sometimes")
    with pytest.raises(PolicyError, match="never_cache_reader"):
        parse_policy(yaml.safe_load(bad), "test")


@pytest.mark.parametrize(
    ("text", "medical"),
    [
        ("My left eye has been twitching for a week.", True),
        ("I've got a burning feeling when I pee.", True),
        ("宝宝拉肚子两天了，还有点发烧", True),
        ("How does the immune system work?", False),
        ("What is the capital of France?", False),
        ("信用卡逾期会有什么影响", False),
    ],
)
def test_the_shipped_reader_on_the_default_pack(sync_embedder: SyncEmbedder, text: str, medical: bool) -> None:
    head = head_for(sync_embedder.name)
    assert head is not None
    found = head.read(sync_embedder.embed([Normalizer()(text)])[0])
    assert (found is not None and found.intent == MEDICAL) is medical
