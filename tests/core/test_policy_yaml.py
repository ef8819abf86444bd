"""The policy file's YAML reader: a repeated key is refused at any depth, a merge key is not a
repeat, and a parse error is said with its line and column."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from proxy.core.policy_yaml import strict_yaml, yaml_reason


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: 1\nb: 2\n", {"a": 1, "b": 2}),
        ("base: &b {x: 1}\nmore:\n  <<: *b\n  y: 2\n", {"base": {"x": 1}, "more": {"x": 1, "y": 2}}),
        ("", None),
    ],
)
def test_a_document_reads_as_plain_values(text: str, expected: Any) -> None:
    assert strict_yaml(text) == expected


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("a: 1\na: 2\n", "duplicate key 'a'"),
        ("intents:\n  travel: {}\n  travel: {}\n", "duplicate key 'travel'"),
        ("a: !!python/object:os.system {}\n", "could not determine a constructor"),
        ("a: [1,\n", "line 2, column 1"),
    ],
)
def test_a_bad_document_is_refused_with_a_reason(text: str, found: str) -> None:
    with pytest.raises(yaml.YAMLError) as err:
        strict_yaml(text)
    assert found in yaml_reason(err.value)
