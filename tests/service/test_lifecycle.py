from __future__ import annotations

from proxy.service.lifecycle import coldness, pick_evictions


def test_hot_records_outlive_cold_ones() -> None:
    now = 1_000_000.0
    rows = [
        (1, "cold", now - 7200, 0, 100),  # old, never hit
        (2, "hot", now - 7200, 50, 100),  # old but hit often
        (3, "fresh", now - 10, 0, 100),
    ]
    assert pick_evictions(rows, max_records=2, max_bytes=10**9) == [1]
    assert pick_evictions(rows, max_records=10, max_bytes=150) == [1, 3]
    assert coldness(now, 0) < coldness(now, 1)
