from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from proxy.verify import CrossEncoderVerifier, PairSide, Verifier, VerifierError, load_verifier
from proxy.verify.cross_encoder import DEFAULT_WEIGHTS
from proxy.verify.graph import q8_blocks


@pytest.fixture(scope="module")
def verifier() -> CrossEncoderVerifier:
    v = load_verifier(threads=2)
    v.warm()
    return v


def test_importing_the_runtime_pulls_in_no_server_or_training_library() -> None:
    code = (
        "import sys, proxy.verify, proxy.verify.graph; "
        "print(','.join(m for m in ('aiohttp', 'httpx', 'aiosqlite', 'torch', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_altered_weights_are_refused(tmp_path: Path) -> None:
    shutil.copytree(DEFAULT_WEIGHTS, tmp_path / "w")
    with (tmp_path / "w" / "top.npz").open("ab") as f:
        f.write(b"x")
    with pytest.raises(VerifierError, match="does not match"):
        load_verifier(tmp_path / "w").warm()


def test_missing_config_is_a_verifier_error(tmp_path: Path) -> None:
    with pytest.raises(VerifierError, match="not a verifier config"):
        load_verifier(tmp_path)


@pytest.mark.model
def test_is_a_verifier(verifier: CrossEncoderVerifier) -> None:
    assert isinstance(verifier, Verifier) and verifier.name and verifier.version


HOTEL_A = "推荐您入住北京王府井希尔顿酒店，价格是每晚1200元。"
HOTEL_B = "推荐您入住如家快捷酒店(北京西站店)，价格是每晚300元。"
# (paraphrase pair, near-miss pair): the paraphrase must score higher
ORDERED = [
    ((PairSide("花呗怎么还款"), PairSide("花呗如何还款")), (PairSide("花呗怎么还款"), PairSide("借呗怎么还款"))),
    (
        (PairSide("How do I reset my password?"), PairSide("How can I reset my password?")),
        (PairSide("How do I reset my password?"), PairSide("How do I reset my router?")),
    ),
    (
        (PairSide("附近有什么景点？", "帮我找个酒店", HOTEL_A), PairSide("附近有什么景点？", "帮我找个酒店", HOTEL_A)),
        (PairSide("附近有什么景点？", "帮我找个酒店", HOTEL_A), PairSide("附近有什么景点？", "帮我找个酒店", HOTEL_B)),
    ),
    (
        (PairSide("LG Optimus G的电池多大"), PairSide("LG Optimus G电池容量是多少")),
        (PairSide("LG Optimus G的电池多大"), PairSide("LG Optimus的电池多大")),
    ),
    # another asked attribute of the same restaurant, in the same words around it (a miss of v5)
    (
        (PairSide("What is the address of Nandos?"), PairSide("Where is Nandos located?")),
        (PairSide("What is the address of Nandos?"), PairSide("What is the phone number of Nandos?")),
    ),
]
# Known misses of the shipped weights. strict: passing means drop the mark.
KNOWN_MISSES: list[tuple[tuple[PairSide, PairSide], tuple[PairSide, PairSide]]] = []
_MISS = pytest.mark.xfail(strict=True, reason="known miss of the shipped weights: the asked attribute")


@pytest.mark.model
@pytest.mark.parametrize(
    ("paraphrase", "near_miss"),
    [
        *(
            pytest.param(*case, id=name)
            for case, name in zip(ORDERED, ["huabei", "password", "hotel", "optimus", "nandos"], strict=True)
        ),
        *(pytest.param(*case, id=f"miss-{i}", marks=_MISS) for i, case in enumerate(KNOWN_MISSES)),
    ],
)
def test_paraphrase_scores_above_near_miss(
    verifier: CrossEncoderVerifier, paraphrase: tuple[PairSide, PairSide], near_miss: tuple[PairSide, PairSide]
) -> None:
    high, low = verifier.score([paraphrase, near_miss])
    assert high > low


@pytest.mark.model
def test_same_follow_up_after_two_different_hotels_scores_low(verifier: CrossEncoderVerifier) -> None:
    [p] = verifier.score(
        [
            (
                PairSide("这家酒店的地址在哪？", "帮我找个酒店", HOTEL_A),
                PairSide("这家酒店的地址在哪？", "帮我找个酒店", HOTEL_B),
            )
        ]
    )
    assert p < 0.5


@pytest.mark.model
def test_probabilities_are_in_range_and_a_batch_equals_one_by_one(verifier: CrossEncoderVerifier) -> None:
    pairs = [pair for both in (*ORDERED, *KNOWN_MISSES) for pair in both]
    batched = verifier.score(pairs)
    single = [verifier.score([p])[0] for p in pairs]
    assert all(0.0 <= p <= 1.0 for p in batched)
    assert batched == pytest.approx(single, abs=2e-3)
    assert verifier.score([]) == []


def test_8_bit_blocks_hold_each_weight_within_half_a_step() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 64)).astype(np.float32) * np.array([0.01, 1.0, 30.0, 0.0, 1e-8, 2.0])[:, None]
    codes, scales = q8_blocks(w)
    assert codes.shape == (6, 2, 32) and scales.shape == (6, 2) and codes.dtype == np.uint8
    assert codes.min() >= 1 and codes.max() <= 255  # symmetric around the zero point 128
    back = (codes.astype(np.float32) - 128) * scales[..., None]
    step = np.repeat(scales, 32, axis=1)
    assert np.all(np.abs(back.reshape(6, 64) - w) <= step / 2 + 1e-12)
    assert np.all(codes[3] == 128) and np.all(scales[3] == 0)  # an all-zero block stays zero


@pytest.mark.model
def test_the_8_bit_layers_score_as_the_float_ones(verifier: CrossEncoderVerifier) -> None:
    pairs = [pair for both in (*ORDERED, *KNOWN_MISSES) for pair in both]
    other = 32 if verifier.config.top_bits == 8 else 8
    quantised = load_verifier(threads=2, top_bits=other)
    assert quantised.config.top_bits == other
    # 8-bit blocks move a probability by a few hundredths at most; the order of every pair stays
    assert quantised.score(pairs) == pytest.approx(verifier.score(pairs), abs=0.05)
    high_low = [quantised.score(list(both)) for both in ORDERED]
    assert all(high > low for high, low in high_low)


def test_a_width_the_graph_cannot_serve_is_refused(tmp_path: Path) -> None:
    from proxy.verify.graph import base_image, verifier_graph

    with pytest.raises(ValueError, match="top_bits"):
        verifier_graph(base_image(), 4, 6, {}, top_bits=4)
    with pytest.raises(VerifierError, match="top_bits"):
        load_verifier(top_bits=16)
    shutil.copytree(DEFAULT_WEIGHTS, tmp_path / "w")
    config = tmp_path / "w" / "verifier.json"
    config.write_text(config.read_text().replace('"top_bits": 8', '"top_bits": 4'))
    with pytest.raises(VerifierError, match="top_bits"):
        load_verifier(tmp_path / "w")
