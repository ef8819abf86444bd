"""Similarity numbers belong to one embedding model: policies and caches say which, and a run under
another model is refused before it can serve by the wrong scale or compare vectors across spaces:
the settings pick the policy shipped for the pack, calibrate stamps what it writes, and the parts and
the app refuse a policy or a cache of another model (the stamps themselves: tests/core/test_policy.py,
tests/storage/test_sqlite.py)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import yaml
from aiohttp.test_utils import TestServer

from proxy.core.model import Record
from proxy.core.policy import PolicyError, load_policy
from proxy.embedding.packs import install_pack
from proxy.http import keys
from proxy.http.app import create_app
from proxy.observability.metrics import Metrics
from proxy.service.compose import NOWHERE, load_policy_for, open_parts
from proxy.settings import DEFAULT_POLICY, POLICIES, load_settings, shipped_policy
from proxy.storage.sqlite import SqliteStore, StoreMismatch
from proxy.tools.calibrate import Calibration
from proxy.tools.calibrated_policy import write_policy
from tests.conftest import Upstream
from tests.e2e.test_e2e_core import ask, chat
from tests.factories import make_record, unit_vector


def record_of_dim(dim: int) -> Record:
    vec = unit_vector(dim)
    return make_record(cache_id="c1", vector=vec, qvector=vec, answer_text="a", expires_at=1e12)


def test_every_shipped_policy_is_stamped_with_the_pack_it_is_named_for() -> None:
    default_model = load_settings(environ={}).embedding_model
    assert load_policy(DEFAULT_POLICY).embedding_model == default_model
    for path in POLICIES.glob("*.yaml"):
        if path != DEFAULT_POLICY:
            assert load_policy(path).embedding_model == path.stem, path


def test_unset_policy_follows_the_embedding_model(tmp_path: Path) -> None:
    default = load_settings(environ={})
    assert default.policy is None and default.policy_file == DEFAULT_POLICY
    for path in POLICIES.glob("*.yaml"):
        if path != DEFAULT_POLICY:
            s = load_settings(environ={}, overrides={"embedding_model": path.stem})
            assert s.policy_file == path and load_policy_for(s).embedding_model == path.stem
    assert shipped_policy("fastembed:BAAI/bge-small-en-v1.5") == DEFAULT_POLICY
    own = tmp_path / "mine.yaml"
    own.write_text("version: x\n", encoding="utf-8")
    assert load_settings(environ={}, overrides={"policy": own}).policy_file == own


def test_a_policy_for_another_model_is_refused_with_the_fix(tmp_path: Path) -> None:
    other = next(
        p.stem
        for p in [*POLICIES.glob("*.yaml"), DEFAULT_POLICY]
        if load_policy(p).embedding_model != load_settings(environ={}).embedding_model
    )
    s = load_settings(environ={}, overrides={"policy": shipped_policy(other)})
    with pytest.raises(PolicyError) as err:
        load_policy_for(s)
    assert err.value.key == "embedding_model"
    assert "smartcache calibrate" in str(err.value) and other in str(err.value)


def test_a_pack_with_no_shipped_policy_is_told_to_calibrate_one() -> None:
    s = load_settings(environ={}, overrides={"embedding_model": "minilm-l6-en"})
    assert s.policy_file == DEFAULT_POLICY
    with pytest.raises(PolicyError) as err:
        load_policy_for(s)
    assert "no policy is shipped for embedding model 'minilm-l6-en'" in str(err.value)
    assert "smartcache calibrate TRACES --embedding-model minilm-l6-en" in str(err.value)


def test_calibrated_policy_is_stamped_with_the_model_it_was_measured_on(tmp_path: Path) -> None:
    out = tmp_path / "cal.yaml"
    results = {"general": Calibration("general", 0.97, 0.92, 40, 10, 0, 0.07, 20, 0.5, "meets target")}
    write_policy(DEFAULT_POLICY, out, results, traces=["t.jsonl"], target=1e-3, embedding_model="my-model")
    data = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert list(data)[:2] == ["version", "embedding_model"] and data["embedding_model"] == "my-model"
    policy = load_policy(out)
    assert policy.embedding_model == "my-model" and policy.intents["general"].accept == 0.97


async def test_open_parts_refuses_a_cache_built_with_another_model(
    tmp_path: Path, model_home: Path, sync_embedder: object
) -> None:
    from proxy.embedding.backends import SyncEmbedder

    assert isinstance(sync_embedder, SyncEmbedder)
    s = load_settings(environ={}, overrides={"data_dir": tmp_path, "model_home": model_home})
    store = await SqliteStore.open(s.db_path)
    await store.claim_embedding("some-other-model", sync_embedder.dim)
    await store.insert(record_of_dim(dim=sync_embedder.dim))
    await store.close()
    with pytest.raises(StoreMismatch):
        async with open_parts(s, upstream_url=NOWHERE, metrics=Metrics(), backend=sync_embedder):
            pass
    # the refused cache is left as it was
    store = await SqliteStore.open(s.db_path)
    assert len(await store.get_many([1])) == 1
    await store.close()


@pytest.mark.slow
async def test_another_pack_serves_under_its_own_policy_and_the_cache_keeps_its_model(
    tmp_path: Path, model_home: Path, upstream: Upstream
) -> None:
    """The e5 pack (not the default) with no policy set runs under the policy shipped for it; the
    data dir it wrote is then refused to the default pack at start, before any request is answered."""
    install_pack("e5-small-multilingual", model_home, progress=False)
    base = {
        "upstream": upstream.url,
        "data_dir": tmp_path / "data",
        "model_home": model_home,
        "ready_after": 0.0,
        "upstream_timeout": 5.0,
    }
    settings = load_settings(environ={}, overrides={**base, "embedding_model": "e5-small-multilingual"})
    server = TestServer(create_app(settings), host="127.0.0.1")
    await server.start_server()
    try:
        assert server.app[keys.POLICY_BOX].policy.embedding_model == "e5-small-multilingual"
        client = openai.AsyncOpenAI(
            base_url=str(server.make_url("/v1")),
            api_key="k",
            max_retries=0,
            default_headers={"x-smartcache-session": "s1"},
        )
        status, first, _ = await chat(client, ask("What is the tallest mountain in Europe?"))
        assert status == "miss"
        status, again, _ = await chat(client, ask("what is the tallest mountain in europe"))
        assert (status, again) == ("hit", first)
        assert len(upstream.script.calls) == 1
    finally:
        await server.close()
    other = TestServer(create_app(load_settings(environ={}, overrides=base)), host="127.0.0.1")
    with pytest.raises(StoreMismatch, match="e5-small-multilingual"):
        await other.start_server()
    await other.close()


def test_an_installed_wheel_layout_finds_the_shipped_policies(tmp_path: Path) -> None:
    """pyproject maps policies/ to proxy.policies; laid out as a wheel installs it (no checkout
    around), the settings find the policy for each pack there."""
    import shutil
    import subprocess
    import sys
    import tomllib

    root = Path(__file__).resolve().parents[2]
    tool = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert tool["package-dir"]["proxy.policies"] == "policies"
    assert "*.yaml" in tool["package-data"]["proxy.policies"]
    site = tmp_path / "site"
    shutil.copytree(root / "proxy", site / "proxy", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "policies", site / "proxy" / "policies")
    code = (
        "from proxy.settings import load_settings; from proxy.service.compose import load_policy_for\n"
        "for m in ('e5-small-multilingual', 'use-multilingual'):\n"
        "    s = load_settings(environ={}, overrides={'embedding_model': m})\n"
        "    print(s.policy_file, load_policy_for(s).embedding_model)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for line, model in zip(out, ("e5-small-multilingual", "use-multilingual"), strict=True):
        path, stamp = line.split()
        assert Path(path).is_relative_to(site / "proxy" / "policies") and stamp == model
