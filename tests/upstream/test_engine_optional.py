"""The local engine's wheel (xllamacpp, the `engine` extra) is optional: a proxy in front of a
remote endpoint starts and serves without ever looking for it, and a proxy that needs it says
how to install it instead of failing with a traceback."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ProxyFactory

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
    from proxy import cli

    monkeypatch.setitem(sys.modules, WHEEL, None)  # how Python marks a module as not importable
    monkeypatch.setattr(cli, "configure_logging", lambda level, **_: None)  # the one global call: not in a test
    code = cli.main(["serve", "--data-dir", str(tmp_path), "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err
    assert "smartcache[engine]" in err and "--upstream" in err
