from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "model: loads the shipped verifier model (builds its ONNX graph)")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "zh_pairs").is_dir():
        pytest.skip(f"labelled pair data not found at {DATA}")
    return DATA
