"""replay and calibrate take --data-dir and --model-home like serve, so their packs land where
the user says instead of in ./.smartcache."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy import cli


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
