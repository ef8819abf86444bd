"""proxy/core/policy.py: the shipped policy, and what a policy file may say (each broken copy refused
naming its key)."""

from __future__ import annotations

import copy
import dataclasses
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.core.policy import (
    GENERAL,
    SCOPES,
    Policy,
    PolicyDeprecation,
    PolicyError,
    load_policy,
    parse_policy,
)
from proxy.core.policy_table import policy_table
from proxy.core.text.normalize import normalize_text
from proxy.core.text.phrases import KeywordRules
from proxy.settings import DEFAULT_POLICY

SHIPPED = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
REQUIRED_INTENTS = (
    "chitchat",
    "travel",
    "shopping",
    "after_sales",
    "customer_support",
    "refund",
    "logistics",
    "code",
    "doc_rewrite",
    "legal",
    "realtime",
    "medical",
    "general",
)
HAN = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def shipped() -> Policy:
    return load_policy(SHIPPED)


def forced(policy: Policy, text: str) -> str | None:
    """The intent the classifier's keyword matcher forces for ``text``, if any."""
    rules = KeywordRules({name: intent.keywords for name, intent in policy.intents.items() if intent.force})
    return rules.intent(normalize_text(text))


@pytest.fixture(scope="module")
def shipped_data() -> dict[str, Any]:
    data = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def minimal(**intents: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": "t1",
        "defaults": {
            "cache": True,
            "accept": 0.9,
            "candidate": 0.85,
            "direct_hit": True,
            "validate": ["entities"],
            "ttl": 60,
            "scope": "session",
        },
        "intents": {"general": {}, **intents},
    }


# --- the shipped policy --------------------------------------------------------------------------


def test_shipped_policy_has_every_required_intent(shipped: Policy) -> None:
    assert set(REQUIRED_INTENTS) <= set(shipped.intents)
    assert shipped.source == str(SHIPPED)
    assert shipped.version


@pytest.mark.parametrize("name", REQUIRED_INTENTS)
def test_shipped_intents_have_bilingual_exemplars_and_keywords(shipped: Policy, name: str) -> None:
    intent = shipped.intents[name]
    assert 8 <= len(intent.exemplars) <= 20
    chinese = [text for text in intent.exemplars if HAN.search(text)]
    english = [text for text in intent.exemplars if not HAN.search(text)]
    assert len(chinese) >= 4 and len(english) >= 4
    assert intent.keywords
    assert len(set(intent.exemplars)) == len(intent.exemplars)


def test_shipped_thresholds_are_calibrated_and_keep_the_risk_order(shipped: Policy) -> None:
    text = Path(shipped.source).read_text(encoding="utf-8")
    assert text.startswith("# SmartCache risk policy") and "Calibrated by `smartcache calibrate" in text
    for intent in shipped.intents.values():
        if intent.cache:
            assert 0.0 < intent.candidate < intent.accept <= 1.0
            # calibration may only tighten the starting risk bands (0.82 and up to accept), never loosen them
            assert intent.accept >= 0.82
    for name in ("travel", "shopping"):
        intent = shipped.intents[name]
        assert intent.direct_hit and set(intent.validate) == {"budget", "dates", "counts", "entities"}
    legal, code = shipped.intents["legal"], shipped.intents["code"]
    assert legal.accept >= 0.92 and not legal.direct_hit
    # code is served by meaning, but only on the judge's word beyond its near-duplicates
    assert code.accept >= 0.92 and code.direct_hit and code.judges and code.widen_by == "judge"
    for name in ("realtime", "medical"):
        intent = shipped.intents[name]
        assert not intent.cache and intent.force


SHARED_BY_THE_TENANT = {"chitchat", "customer_support", "after_sales", "refund", "general", "shopping"}
# shared with the tenant, but served from another session only on the judge's yes
JUDGED_ACROSS = {"code"}


def test_shipped_pools_widen_to_the_tenant_only_where_answers_do_not_depend_on_the_user(shipped: Policy) -> None:
    for intent in shipped.intents.values():
        assert intent.scope == "session" and not intent.global_safe
        widened = intent.name in SHARED_BY_THE_TENANT | JUDGED_ACROSS
        assert intent.pools == (("session", "user", "tenant") if widened else ("session",)), intent.name
        assert intent.widen_by == ("judge" if intent.name in JUDGED_ACROSS else "scores"), intent.name
        assert intent.repeats_widen_to == "tenant", intent.name  # the same conversation, byte for byte


def test_repeats_stay_in_their_pools_unless_a_policy_widens_them_and_the_table_says_where(shipped: Policy) -> None:
    data = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    del data["defaults"]["repeats_widen_to"]
    data["intents"]["travel"]["repeats_widen_to"] = "user"
    policy = parse_policy(data, "copy.yaml")
    assert [i.name for i in policy.intents.values() if i.shares_repeats] == ["travel"]
    rows = {row["intent"]: row for row in policy_table(policy)}
    assert (rows["travel"]["repeats"], rows["code"]["repeats"], rows["realtime"]["repeats"]) == ("user", "session", "-")
    assert {row["repeats"] for row in policy_table(shipped) if row["cache"] == "yes"} == {"tenant"}


def test_shipped_exemplars_are_not_forced_into_another_intent(shipped: Policy) -> None:
    for intent in shipped.intents.values():
        for text in intent.exemplars:
            assert forced(shipped, text) in (None, intent.name), (intent.name, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("今天杭州天气怎么样", "realtime"),
        ("What's the weather like today?", "realtime"),
        ("美元汇率多少", "realtime"),
        ("I know the answer already", None),  # "now" only as a whole word
        ("布洛芬的剂量是多少", "medical"),
        ("What is the right DOSE for my current cold?", "medical"),  # medical outranks realtime
        ("明天上午的会我不去了，帮我写一封请假邮件", "leave_email"),
        ("帮我写一封投诉邮件", "complaint_email"),
        ("客服电话为什么打不通", None),  # customer-service intents are chosen by the classifier
        ("谢谢", None),
    ],
)
def test_forced_keywords(shipped: Policy, text: str, expected: str | None) -> None:
    assert forced(shipped, text) == expected


def test_for_intent_falls_back_to_general(shipped: Policy) -> None:
    assert shipped.for_intent("travel").name == "travel"
    assert shipped.for_intent("astrology") is shipped.intents[GENERAL]


def test_policy_objects_are_frozen(shipped: Policy) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        shipped.intents["travel"].accept = 0.1  # type: ignore[misc]
    with pytest.raises(TypeError):
        shipped.intents["travel"] = shipped.intents["code"]  # type: ignore[index]


def test_policy_table_has_a_row_per_intent_in_file_order(shipped: Policy) -> None:
    rows = policy_table(shipped)
    assert [row["intent"] for row in rows] == list(shipped.intents)
    by_name = {row["intent"]: row for row in rows}
    assert by_name["chitchat"]["pools"] == "session→user→tenant"
    assert by_name["legal"]["direct_hit"] == "no" and by_name["legal"]["verify_accept"] == "-"
    assert by_name["code"]["pools"] == "session→user→tenant (judged)"
    assert by_name["realtime"]["cache"] == "no" and by_name["realtime"]["accept"] == "-"
    assert by_name["logistics"]["ttl"] == "10m" and by_name["logistics"]["validate"] == "dates,counts,entities"
    assert by_name["travel"]["validate"] == "all" and by_name["chitchat"]["validate"] == "-"
    assert all(isinstance(cell, str) for row in rows for cell in row.values())


# --- inheritance and pools -----------------------------------------------------------------------


def test_intents_inherit_the_defaults_block() -> None:
    policy = parse_policy(minimal(travel={"accept": 0.95, "keywords": ["trip"]}), "mem.yaml")
    travel = policy.intents["travel"]
    assert (travel.accept, travel.candidate, travel.ttl, travel.validate) == (0.95, 0.85, 60, ("entities",))
    assert travel.widen_to == "session" and not travel.force and travel.feedback_floor == 0.0
    assert policy.defaults.name == "defaults" and list(policy.intents) == ["general", "travel"]


def test_global_pool_needs_global_safe() -> None:
    body = {"keywords": ["hi"], "widen_to": "global", "global_safe": True}
    policy = parse_policy(minimal(chitchat=body), "mem.yaml")
    assert policy.intents["chitchat"].pools == SCOPES


def test_a_neighbour_declared_on_one_side_is_held_by_both() -> None:
    body = {"keywords": ["refund"], "neighbours": ["general"]}
    policy = parse_policy(minimal(refund=body, travel={"keywords": ["trip"]}), "mem.yaml")
    assert policy.intents["refund"].neighbours == {"general"}
    assert policy.intents["general"].neighbours == {"refund"}
    assert policy.intents["travel"].neighbours == frozenset()
    assert {row["intent"]: row["neighbours"] for row in policy_table(policy)} == {
        "general": "refund",
        "refund": "general",
        "travel": "-",
    }


def test_classifier_block_is_optional_and_validated() -> None:
    assert parse_policy(minimal(), "mem.yaml").classifier.followup_max_chars > 0
    data = minimal()
    data["classifier"] = {"min_similarity": 0.7, "margin": 0.05, "followup_max_chars": 20}
    assert parse_policy(data, "mem.yaml").classifier.margin == 0.05


# --- broken copies of the shipped policy -----------------------------------------------------------


def set_path(dotted: str, new: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[last] = new

    return mutate


def update_path(dotted: str, **values: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        node = data
        for part in dotted.split("."):
            node = node[part]
        node.update(values)

    return mutate


def delete_path(dotted: str) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node[part]
        del node[last]

    return mutate


BROKEN = [
    pytest.param(
        set_path("intents.travel.accept", "high"), "intents.travel.accept", "between 0 and 1", id="wrong-type-threshold"
    ),
    pytest.param(
        set_path("intents.code.direct_hit", "no"), "intents.code.direct_hit", "true or false", id="wrong-type-bool"
    ),
    pytest.param(set_path("defaults.ttl", 1.5), "defaults.ttl", "whole number", id="wrong-type-ttl"),
    pytest.param(set_path("intents.travel.keywords", "hotel"), "intents.travel.keywords", "list", id="wrong-type-list"),
    pytest.param(
        set_path("intents.travel.keywords", ["hotel", False]),
        "intents.travel.keywords",
        "quote",
        id="yaml-boolean-keyword",
    ),
    pytest.param(set_path("version", 3), "version", "quote it", id="wrong-type-version"),
    pytest.param(
        set_path("intents.travel.acept", 0.9), "intents.travel.acept", "did you mean 'accept'", id="unknown-intent-key"
    ),
    pytest.param(set_path("defaults.cache_all", True), "defaults.cache_all", "unknown key", id="unknown-defaults-key"),
    pytest.param(set_path("intent", {}), "intent", "did you mean 'intents'", id="unknown-top-level-key"),
    pytest.param(set_path("classifier.top_k", 3), "classifier.top_k", "unknown key", id="unknown-classifier-key"),
    pytest.param(
        set_path("intents.shopping.accept", 0.80),
        "intents.shopping.accept",
        "below candidate",
        id="accept-below-candidate",
    ),
    pytest.param(
        set_path("defaults.candidate", 0.95),
        "defaults.accept",
        "below candidate",
        id="accept-below-candidate-in-defaults",
    ),
    pytest.param(
        set_path("intents.chitchat.candidate", 1.2),
        "intents.chitchat.candidate",
        "outside [0, 1]",
        id="threshold-above-one",
    ),
    pytest.param(
        set_path("defaults.feedback_floor", -0.1),
        "defaults.feedback_floor",
        "outside [0, 1]",
        id="threshold-below-zero",
    ),
    pytest.param(
        set_path("classifier.margin", 2), "classifier.margin", "outside [0, 1]", id="classifier-threshold-above-one"
    ),
    pytest.param(
        set_path("intents.travel.scope", "team"), "intents.travel.scope", "session, user, tenant", id="bad-scope"
    ),
    pytest.param(
        set_path("intents.code.verify_accept", 1.5),
        "intents.code.verify_accept",
        "outside [0, 1]",
        id="verify-accept-above-one",
    ),
    pytest.param(
        set_path("intents.travel.validate", ["budget", "price"]),
        "intents.travel.validate",
        "unknown check 'price'",
        id="bad-validate-item",
    ),
    pytest.param(
        update_path("intents.travel", scope="tenant", widen_to="session"),
        "intents.travel.widen_to",
        "narrower",
        id="widen-narrower-than-scope",
    ),
    pytest.param(
        set_path("intents.chitchat.widen_to", "global"),
        "intents.chitchat.widen_to",
        "global_safe",
        id="global-widen-without-global-safe",
    ),
    pytest.param(
        set_path("intents.travel.scope", "global"),
        "intents.travel.scope",
        "global_safe",
        id="global-scope-without-global-safe",
    ),
    pytest.param(
        set_path("intents.code.widen_by", "verifier"),
        "intents.code.widen_by",
        "not one of: scores, judge",
        id="widen-by-unknown",
    ),
    pytest.param(
        set_path("defaults.repeats_widen_to", "global"),
        "defaults.repeats_widen_to",
        "not one of: session, user, tenant",
        id="repeats-never-global",
    ),
    pytest.param(delete_path("intents.general"), "intents.general", "fallback", id="missing-general"),
    pytest.param(delete_path("defaults.ttl"), "defaults.ttl", "required", id="missing-default"),
    pytest.param(delete_path("version"), "version", "required", id="missing-version"),
    pytest.param(set_path("defaults.keywords", ["x"]), "defaults.keywords", "per intent", id="keywords-in-defaults"),
    pytest.param(set_path("intents.Travel", {"keywords": ["x"]}), "intents.Travel", "lower-case", id="bad-intent-name"),
    pytest.param(set_path("intents.travel", ["a"]), "intents.travel", "mapping", id="intent-not-a-mapping"),
    pytest.param(
        set_path("intents.leave_email.keywords", ["请假", "今天"]),
        "intents.leave_email.keywords",
        "also forces intent 'realtime'",
        id="forced-keyword-shared",
    ),
    pytest.param(
        set_path("intents.empty", {"accept": 0.95}),
        "intents.empty.exemplars",
        "never choose it",
        id="unreachable-intent",
    ),
    pytest.param(
        set_path("intents.loud", {"force": True, "exemplars": ["x"]}),
        "intents.loud.force",
        "at least one keyword",
        id="force-without-keywords",
    ),
    pytest.param(
        set_path("intents.general.neighbours", ["refnud"]),
        "intents.general.neighbours",
        "did you mean 'refund'?",
        id="neighbour-unknown",
    ),
    pytest.param(
        set_path("intents.general.neighbours", ["general"]),
        "intents.general.neighbours",
        "not its own neighbour",
        id="neighbour-itself",
    ),
    pytest.param(
        set_path("intents.general.neighbours", ["realtime"]),
        "intents.general.neighbours",
        "'realtime' is never cached",
        id="neighbour-never-cached",
    ),
    pytest.param(
        set_path("intents.general.neighbours", ["leave_email"]),
        "intents.general.neighbours",
        "'leave_email' is forced by its keywords",
        id="neighbour-forced",
    ),
    pytest.param(
        set_path("intents.general.neighbours", ["legal"]),
        "intents.general.neighbours",
        "differ in direct_hit",
        id="neighbour-serving-otherwise",
    ),
    pytest.param(
        set_path("intents.general.neighbours", ["refund", "refund"]),
        "intents.general.neighbours",
        "listed twice",
        id="neighbour-twice",
    ),
    pytest.param(
        set_path("defaults.neighbours", ["general"]),
        "defaults.neighbours",
        "set per intent only",
        id="neighbours-in-defaults",
    ),
]


@pytest.mark.parametrize(("mutate", "key", "reason"), BROKEN)
def test_broken_copy_is_refused_naming_the_key(
    tmp_path: Path,
    shipped_data: dict[str, Any],
    mutate: Callable[[dict[str, Any]], None],
    key: str,
    reason: str,
) -> None:
    data = copy.deepcopy(shipped_data)
    mutate(data)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    error = caught.value
    assert (error.file, error.key) == (str(path), key)
    assert reason in error.reason
    assert str(error) == f"{path}: {key}: {error.reason}"


RAW = [
    pytest.param("version: '1'\nversion: '2'\n", "(yaml)", "duplicate key 'version'", id="duplicate-key"),
    pytest.param("version: '1'\nintents: [\n", "(yaml)", "line", id="syntax-error"),
    pytest.param("", "(top level)", "nothing", id="empty-file"),
    pytest.param("- a\n- b\n", "(top level)", "a list", id="top-level-list"),
    pytest.param("version: '1'\ndefaults:\nintents: {}\n", "defaults", "non-empty mapping", id="empty-defaults"),
]


@pytest.mark.parametrize(("text", "key", "reason"), RAW)
def test_broken_file_is_refused(tmp_path: Path, text: str, key: str, reason: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.key == key and reason in caught.value.reason


def test_duplicate_intent_in_the_shipped_file_is_refused(tmp_path: Path) -> None:
    text = SHIPPED.read_text(encoding="utf-8") + "\n  travel:\n    accept: 0.5\n    candidate: 0.4\n"
    path = tmp_path / "twice.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PolicyError, match="duplicate key 'travel'"):
        load_policy(path)


def test_missing_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(tmp_path / "absent.yaml")
    assert caught.value.key == "(file)"


# Policy keys of the decision: verify_accept (parsed, validated, inherited, shown) and the
# half_hit key that no longer acts (read with a warning, so old files still load).
DEFAULTS = {
    "cache": True,
    "accept": 0.9,
    "candidate": 0.85,
    "direct_hit": True,
    "validate": [],
    "ttl": 60,
    "scope": "session",
}


def knobs(defaults: dict[str, Any] | None = None, **intents: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": "t1",
        "defaults": {**DEFAULTS, **(defaults or {})},
        "intents": {"general": {}, **{k: {"keywords": [k], **v} for k, v in intents.items()}},
    }


@pytest.mark.parametrize(
    ("defaults", "own", "expected"),
    [
        ({}, {}, None),  # unset: the accept zone decides, as before
        ({}, {"verify_accept": 0.93}, 0.93),
        ({"verify_accept": 0.9}, {}, 0.9),  # inherited from defaults
        ({"verify_accept": 0.9}, {"verify_accept": None}, None),  # an intent may opt out
        ({}, {"verify_accept": 1}, 1.0),
    ],
)
def test_verify_accept_is_read_per_intent(
    defaults: dict[str, Any], own: dict[str, Any], expected: float | None
) -> None:
    parsed = parse_policy(knobs(defaults, travel=own), "p.yaml")
    assert parsed.intents["travel"].verify_accept == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1.2, "outside [0, 1]"),
        (-0.1, "outside [0, 1]"),
        ("high", "expected a probability"),
        (True, "expected a probability"),
    ],
)
def test_a_bad_verify_accept_names_file_and_key(value: object, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(knobs(travel={"verify_accept": value}), "p.yaml")
    assert caught.value.key == "intents.travel.verify_accept" and message in caught.value.reason


def test_check_policy_shows_verify_accept() -> None:
    rows = {r["intent"]: r for r in policy_table(parse_policy(knobs(travel={"verify_accept": 0.95}), "p.yaml"))}
    assert rows["travel"]["verify_accept"] == "0.95" and rows["general"]["verify_accept"] == "-"
    assert "half_hit" not in rows["travel"]


@pytest.mark.parametrize("where", ["defaults", "intent"])
def test_half_hit_is_ignored_with_a_warning(where: str) -> None:
    data = knobs({"half_hit": "incremental"}) if where == "defaults" else knobs(code={"half_hit": "context_only"})
    with pytest.warns(PolicyDeprecation, match="half_hit: has no effect"):
        parsed = parse_policy(data, "old.yaml")
    assert not hasattr(parsed.defaults, "half_hit")


def test_unknown_keys_are_still_refused() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(knobs(travel={"verify_acept": 0.9}), "p.yaml")
    assert "did you mean 'verify_accept'" in caught.value.reason


def test_shipped_policy_loads_without_deprecated_keys() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", PolicyDeprecation)
        shipped = load_policy(DEFAULT_POLICY)
    # no shipped verifier weights yet: no intent verifies, so the accept zone decides as before
    assert all(intent.verify_accept is None for intent in shipped.intents.values())


# The embedding model a policy's similarity numbers belong to, and the topic-switch scale.
def stamped(**top: object) -> dict[str, Any]:
    return {**minimal(), **top}


def test_policy_declares_its_model_and_topic_switch_scale() -> None:
    data = stamped(embedding_model="use-multilingual", classifier={"topic_switch_similarity": 0.8})
    policy = parse_policy(data, "mem.yaml")
    assert policy.embedding_model == "use-multilingual"
    assert policy.classifier.topic_switch_similarity == 0.8
    assert parse_policy(stamped(), "mem.yaml").embedding_model is None


@pytest.mark.parametrize(
    ("top", "key"),
    [
        ({"embedding_model": ""}, "embedding_model"),
        ({"embedding_model": 3}, "embedding_model"),
        ({"classifier": {"topic_switch_similarity": 1.5}}, "classifier.topic_switch_similarity"),
    ],
)
def test_bad_model_stamps_are_refused_naming_the_key(top: dict[str, object], key: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(stamped(**top), "mem.yaml")
    assert err.value.key == key
