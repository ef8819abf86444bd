"""The labelled pair and conversation sets beside the project, for the tests of the offline tools that read them."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "zh_pairs").is_dir():
        pytest.skip(f"labelled pair data not found at {DATA}")
    return DATA
