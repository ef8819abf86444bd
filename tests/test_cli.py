"""replay and calibrate take --data-dir and --model-home like serve, so their packs land where
the user says instead of in ./.smartcache; every serve option says what it does, and its flags
(the admin token, from a file too, and the debug headers) reach the settings over the environment."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from proxy import cli
from proxy.settings import Settings, SettingsError


@pytest.mark.parametrize("command", ["replay", "calibrate"])
def test_replay_and_calibrate_take_the_directories(command: str, tmp_path: Path) -> None:
    data, home = tmp_path / "data", tmp_path / "home"
    args = cli.build_parser().parse_args([command, "traces.jsonl", "--data-dir", str(data), "--model-home", str(home)])
    settings = cli._replay_settings(args)
    assert (settings.data_dir, settings.models_root) == (data, home)


@pytest.mark.parametrize("command", ["replay", "calibrate"])
def test_packs_default_to_the_data_dir(command: str, tmp_path: Path) -> None:
    args = cli.build_parser().parse_args([command, "traces.jsonl", "--data-dir", str(tmp_path)])
    assert cli._replay_settings(args).models_root == tmp_path


def test_serve_takes_model_home_too(tmp_path: Path) -> None:
    args = cli.build_parser().parse_args(["serve", "--upstream", "http://u/v1", "--model-home", str(tmp_path)])
    assert cli.settings_from(args).models_root == tmp_path


def serve_actions() -> list[argparse.Action]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices["serve"]._actions if a.option_strings and a.dest != "help"]


def test_every_serve_option_says_what_it_does() -> None:
    silent = [a.option_strings[0] for a in serve_actions() if not (a.help or "").strip()]
    assert silent == []
    flags = {flag for a in serve_actions() for flag in a.option_strings}
    assert {
        "--policy",
        "--host",
        "--port",
        "--flavour",
        "--admin-token",
        "--admin-token-file",
        "--debug-headers",
    } <= flags


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SMARTCACHE_ADMIN_TOKEN", "SMARTCACHE_DEBUG_HEADERS"):
        monkeypatch.delenv(name, raising=False)


def serve_settings(*flags: str) -> Settings:
    return cli.settings_from(cli.build_parser().parse_args(["serve", "--upstream", "http://u/v1", *flags]))


@pytest.mark.usefixtures("clean_environment")
def test_serve_flags_reach_the_settings(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    settings = serve_settings(
        "--policy", str(policy), "--host", "0.0.0.0", "--port", "9090", "--flavour", "vllm",
        "--admin-token", "s3cret", "--debug-headers",
    )  # fmt: skip
    assert (settings.policy, settings.host, settings.port, settings.upstream_flavour) == (
        policy,
        "0.0.0.0",
        9090,
        "vllm",
    )
    assert (settings.admin_token, settings.debug_headers) == ("s3cret", True)
    assert serve_settings("--no-debug-headers").debug_headers is False


@pytest.mark.usefixtures("clean_environment")
def test_unset_flags_leave_the_environment_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (serve_settings().admin_token, serve_settings().debug_headers) == (None, False)
    monkeypatch.setenv("SMARTCACHE_ADMIN_TOKEN", "from-env")
    monkeypatch.setenv("SMARTCACHE_DEBUG_HEADERS", "true")
    assert (serve_settings().admin_token, serve_settings().debug_headers) == ("from-env", True)
    assert serve_settings("--admin-token", "from-flag", "--no-debug-headers").admin_token == "from-flag"
    assert serve_settings("--no-debug-headers").debug_headers is False


@pytest.mark.usefixtures("clean_environment")
def test_the_admin_token_is_read_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "admin-token"
    secret.write_text("s3cret-from-file\n", encoding="utf-8")  # as `echo` or a secret mount writes it
    assert serve_settings("--admin-token-file", str(secret)).admin_token == "s3cret-from-file"


@pytest.mark.usefixtures("clean_environment")
@pytest.mark.parametrize("content", [None, "", "  \n"], ids=["missing", "empty", "blank"])
def test_an_admin_token_file_that_holds_none_fails_at_start(tmp_path: Path, content: str | None) -> None:
    secret = tmp_path / "admin-token"
    if content is not None:
        secret.write_text(content, encoding="utf-8")
    with pytest.raises(SettingsError, match="admin_token_file"):
        serve_settings("--admin-token-file", str(secret))


def test_the_admin_token_is_given_one_way() -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--admin-token", "a", "--admin-token-file", "f"])
