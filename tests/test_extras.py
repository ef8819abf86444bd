"""Optional extras stay optional: the serving path imports neither the local engine's wheel
(`engine` extra) nor the plotting library (`report` extra), so a proxy in front of a remote
endpoint installs and starts without them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from proxy.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = {"xllamacpp": "engine", "matplotlib": "report"}
SERVING = ("proxy.cli", "proxy.http.app", "proxy.parts", "proxy.upstream.engine", "proxy.tools.report")


def test_serving_modules_import_without_the_optional_extras() -> None:
    # a None entry in sys.modules makes every import of that name fail, as if it were not installed
    blocked = "".join(f"sys.modules[{name!r}] = None\n" for name in OPTIONAL)
    imports = "".join(f"import {module}\n" for module in SERVING)
    code = f"import sys\n{blocked}{imports}proxy.cli.build_parser().parse_args(['serve', '--help'])\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "--upstream" in done.stdout


def test_optional_packages_are_declared_in_their_extras_only() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    for package, extra in OPTIONAL.items():
        assert not any(dep.startswith(package) for dep in project["dependencies"]), package
        assert any(dep.startswith(package) for dep in extras[extra]), (package, extra)
    install_sh = (ROOT / "scripts" / "install.sh").read_text(encoding="utf-8")
    assert all(extra in install_sh for extra in OPTIONAL.values())


def test_replay_report_without_matplotlib_names_the_extra_before_replaying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr("proxy.cli.importlib.util.find_spec", lambda name: None if name == "matplotlib" else real(name))
    # the traces file does not exist: reaching the replay would fail another way
    assert cli_main(["replay", str(tmp_path / "absent.jsonl"), "--report", str(tmp_path / "report")]) == 2
    assert 'pip install "smartcache[report]"' in capsys.readouterr().err
    assert not (tmp_path / "report").exists()
