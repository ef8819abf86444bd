"""One proxy per data dir: a second one on the same directory fails at start, saying how to
share a cache between proxies, instead of silently missing what the first one writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.service.datadir import DataDirInUse, data_dir_lock
from tests.conftest import ProxyFactory


async def test_a_second_proxy_on_the_same_data_dir_is_refused_at_start(make_proxy: ProxyFactory) -> None:
    first = await make_proxy()
    with pytest.raises(DataDirInUse) as err:
        await make_proxy()
    message = str(err.value)
    assert str(first.settings.data_dir) in message
    assert f"pid {os.getpid()}" in message
    assert "--data-dir" in message and "store: redis" in message
    # the first one is untouched, and once it stops the directory is free again
    models = await first.client().models.list()
    assert models.data
    await first.stop()
    again = await make_proxy()
    assert (await again.client().models.list()).data


def test_the_cli_says_it_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy import cli

    monkeypatch.setattr(cli, "configure_logging", lambda level, **_: None)  # the one global call: not in a test
    with data_dir_lock(tmp_path):
        code = cli.main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--data-dir", str(tmp_path), "--port", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "store: redis" in err
