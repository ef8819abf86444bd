"""What the never-cache reader trains on: labelled, deduplicated, and never a measured text."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from proxy.tools.never_cache.data import LABELS, benchmark_texts, training_utterances
from proxy.tools.verifier.heldout import eval_rows
from proxy.tools.verifier.pairs import text_key


@pytest.fixture(scope="module")
def sources(data_dir: Path) -> Path:
    if not (data_dir / "covid_qpairs").is_dir() or not (data_dir.parent / "eval" / "build_dev_traces.py").is_file():
        pytest.skip(f"the never-cache sources or the replay harness not found beside {data_dir}")
    return data_dir


def test_the_benchmark_texts_are_read_from_every_labelled_file() -> None:
    keys = benchmark_texts()
    assert text_key("What is the bitcoin price?") in keys  # never_cache_utterances.tsv
    assert text_key("My left eye has been twitching for a week.") in keys  # a held-out conversation
    assert text_key("Could it be something neurological?") in keys  # one of its follow-ups
    assert len(keys) > 1000


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_training_keeps_out_what_is_measured_and_is_seeded(sources: Path) -> None:
    rows = training_utterances(sources, seed=3, per_source=300)
    keys = [text_key(u.text) for u in rows]
    assert len(keys) == len(set(keys))  # each text once
    assert not set(keys) & benchmark_texts()
    assert not set(keys) & eval_rows(sources).texts
    assert {u.label for u in rows} == set(LABELS)
    counts = Counter((u.source, u.label) for u in rows)
    assert counts[("covid_qpairs", "medical")] == 300  # sampled to per_source
    assert counts[("hand", "medical")] > 50 and counts[("hand", "realtime")] > 50
    # a loose rule's match in chat traffic is left out, a precise one's is kept as its intent
    oppo = {u.text: u.label for u in rows if u.source == "oppo_xiaobu"}
    assert "你现在有什么功能啊" not in oppo
    assert any(label == "realtime" for label in oppo.values())
    assert [u.text for u in training_utterances(sources, seed=3, per_source=300)] == [u.text for u in rows]
