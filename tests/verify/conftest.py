from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "model: loads the shipped verifier model (builds its ONNX graph)")
