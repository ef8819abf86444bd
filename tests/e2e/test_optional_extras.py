"""Optional extras stay optional: the serving path imports neither the local engine's wheel
(`engine` extra) nor the plotting library (`report` extra), so a proxy in front of a remote
endpoint installs, starts and serves without them, and a command that needs one says how to
install it instead of failing with a traceback."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from proxy import cli
from tests.conftest import ProxyFactory

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = {"xllamacpp": "engine", "matplotlib": "report"}
SERVING = ("proxy.cli", "proxy.http.app", "proxy.service.compose", "proxy.upstream.engine", "proxy.tools.report")


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
    assert cli.main(["replay", str(tmp_path / "absent.jsonl"), "--report", str(tmp_path / "report")]) == 2
    assert 'pip install "smartcache[report]"' in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


# The local engine's wheel: a proxy in front of a remote endpoint never looks for it.
WHEEL = "xllamacpp"


class Hidden(importlib.abc.MetaPathFinder):
    """Records every lookup of the wheel and answers as if it were not installed."""

    def __init__(self) -> None:
        self.lookups = 0

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] == WHEEL:
            self.lookups += 1
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@pytest.fixture
def hidden(monkeypatch: pytest.MonkeyPatch) -> Hidden:
    finder = Hidden()
    for name in [m for m in sys.modules if m.split(".")[0] == WHEEL]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    return finder


async def test_a_proxy_in_front_of_a_remote_endpoint_never_looks_for_the_wheel(
    make_proxy: ProxyFactory, hidden: Hidden
) -> None:
    proxy = await make_proxy()  # --upstream: the scripted endpoint
    reply = await proxy.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Recommend a good book about databases."}]
    )
    assert reply.choices[0].message.content
    assert hidden.lookups == 0


def test_serve_without_an_upstream_or_the_wheel_says_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, WHEEL, None)  # how Python marks a module as not importable
    monkeypatch.setattr(cli, "configure_logging", lambda level, **_: None)  # the one global call: not in a test
    code = cli.main(["serve", "--data-dir", str(tmp_path), "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err
    assert "smartcache[engine]" in err and "--upstream" in err
