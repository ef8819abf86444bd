"""Offline tools: trace datasets, replay, calibration, reports, warm-up, demo, stats."""
