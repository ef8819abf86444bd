"""Settings at load: each bad value names the layer it came from, unknown SMARTCACHE_* variables
are reported with the closest known name, an upstream URL without its API path is refused with
the fix, and the README's settings table lists every setting."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from proxy.settings import Settings, SettingsError, load_settings, unknown_environment

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.mark.parametrize(
    ("environ", "overrides", "source", "key"),
    [
        ({"SMARTCACHE_TOP_K": "0"}, {}, "environment", "top_k"),
        ({"SMARTCACHE_PORT": "70000"}, {}, "environment", "port"),
        ({}, {"top_k": 0}, "flags", "top_k"),
        ({"SMARTCACHE_TOP_K": "0"}, {"top_k": 4, "port": 70000}, "flags", "port"),
    ],
)
def test_a_bad_value_names_the_layer_it_came_from(
    environ: dict[str, str], overrides: dict[str, object], source: str, key: str
) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(environ=environ, overrides=overrides)
    assert (err.value.source, err.value.key) == (source, key)


def test_a_bad_value_from_the_settings_file_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "smartcache.yaml"
    config.write_text("top_k: 0\n")
    with pytest.raises(SettingsError) as err:
        load_settings(config_file=config, environ={})
    assert (err.value.source, err.value.key) == (str(config), "top_k")


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        ("SMARTCACHE_TOPK", "SMARTCACHE_TOP_K"),
        ("SMARTCACHE_FLAVOUR", "SMARTCACHE_UPSTREAM_FLAVOUR"),
        ("SMARTCACHE_DATADIR", "SMARTCACHE_DATA_DIR"),
        ("SMARTCACHE_READY_AFTR", "SMARTCACHE_READY_AFTER"),
        ("SMARTCACHE_ZZZ", None),
    ],
)
def test_unknown_environment_variables_are_named_with_the_closest_setting(
    variable: str, suggestion: str | None
) -> None:
    environ = {variable: "1", "SMARTCACHE_TOP_K": "4", "PATH": "/bin"}
    assert unknown_environment(environ) == [(variable, suggestion)]
    load_settings(environ=environ)  # still only a warning: other tools may share the prefix


def test_the_cli_warns_about_unknown_environment_variables() -> None:
    from structlog.testing import capture_logs

    from proxy.cli import warn_unknown_environment

    with capture_logs() as logs:
        warn_unknown_environment({"SMARTCACHE_TOPK": "3"})
    assert logs == [
        {
            "event": "settings.unknown_environment",
            "log_level": "warning",
            "variable": "SMARTCACHE_TOPK",
            "did_you_mean": "SMARTCACHE_TOP_K",
        }
    ]


@pytest.mark.parametrize("url", ["http://vllm:8000", "http://vllm:8000/", "https://api.example.com"])
def test_an_upstream_without_its_api_path_is_refused_with_the_fix(url: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(environ={}, overrides={"upstream": url})
    assert err.value.key == "upstream"
    assert f"{url.rstrip('/')}/v1" in err.value.reason


@pytest.mark.parametrize(
    "url",
    ["http://vllm:8000/v1", "http://vllm:8000/v1/", "https://openrouter.ai/api/v1", "https://x.example/openai/v1"],
)
def test_an_upstream_with_a_path_is_taken(url: str) -> None:
    assert load_settings(environ={}, overrides={"upstream": url}).upstream == url


@pytest.mark.parametrize("url", ["vllm:8000/v1", "ftp://vllm/v1", "http:///v1"])
def test_an_upstream_that_is_no_http_url_is_refused(url: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(environ={}, overrides={"upstream": url})
    assert err.value.key == "upstream"


def _readme_settings_rows() -> set[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("| setting | env |") :]
    table = section[: section.index("\n\n")]
    names: list[str] = []
    for row in table.splitlines()[2:]:
        first_cell = row.split("|")[1]
        names.extend(re.findall(r"`([a-z_]+)`", first_cell))
    assert len(names) == len(set(names)), "a setting in two rows"
    return set(names)


def test_every_setting_is_in_the_readme_table() -> None:
    fields = {f.name for f in dataclasses.fields(Settings)}
    rows = _readme_settings_rows()
    assert sorted(fields - rows) == [], "settings missing from the README table"
    assert sorted(rows - fields) == [], "README rows naming no setting"
