"""Policy keys of the decision: verify_accept (parsed, validated, inherited, shown) and the
half_hit key that no longer acts (read with a warning, so old files still load)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from proxy.policy import PolicyDeprecation, PolicyError, parse_policy
from proxy.policy_table import policy_table
from proxy.settings import DEFAULT_POLICY

DEFAULTS = {
    "cache": True,
    "accept": 0.9,
    "candidate": 0.85,
    "direct_hit": True,
    "validate": [],
    "ttl": 60,
    "scope": "session",
}


def policy(defaults: dict[str, Any] | None = None, **intents: dict[str, Any]) -> dict[str, Any]:
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
    parsed = parse_policy(policy(defaults, travel=own), "p.yaml")
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
        parse_policy(policy(travel={"verify_accept": value}), "p.yaml")
    assert caught.value.key == "intents.travel.verify_accept" and message in caught.value.reason


def test_check_policy_shows_verify_accept() -> None:
    rows = {r["intent"]: r for r in policy_table(parse_policy(policy(travel={"verify_accept": 0.95}), "p.yaml"))}
    assert rows["travel"]["verify_accept"] == "0.95" and rows["general"]["verify_accept"] == "-"
    assert "half_hit" not in rows["travel"]


@pytest.mark.parametrize("where", ["defaults", "intent"])
def test_half_hit_is_ignored_with_a_warning(where: str) -> None:
    data = policy({"half_hit": "incremental"}) if where == "defaults" else policy(code={"half_hit": "context_only"})
    with pytest.warns(PolicyDeprecation, match="half_hit: has no effect"):
        parsed = parse_policy(data, "old.yaml")
    assert not hasattr(parsed.defaults, "half_hit")


def test_unknown_keys_are_still_refused() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(policy(travel={"verify_acept": 0.9}), "p.yaml")
    assert "did you mean 'verify_accept'" in caught.value.reason


def test_shipped_policy_loads_without_deprecated_keys() -> None:
    from proxy.policy import load_policy

    with warnings.catch_warnings():
        warnings.simplefilter("error", PolicyDeprecation)
        shipped = load_policy(DEFAULT_POLICY)
    # no shipped verifier weights yet: no intent verifies, so the accept zone decides as before
    assert all(intent.verify_accept is None for intent in shipped.intents.values())
