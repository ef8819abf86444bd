"""Which decision stage ended a lookup, and how long the verifier took, as metrics."""

from __future__ import annotations

import pytest

from proxy.decision.decide import STAGES, decide
from proxy.observability.metrics import Metrics
from tests.decision.test_decide import CASES


def test_decisions_count_by_stage_and_reason() -> None:
    metrics = Metrics()
    for case in CASES:
        d = case.run()
        metrics.decided(d.stage, d.reason)
    sample = metrics.registry.get_sample_value
    assert sample("smartcache_decisions_total", {"stage": "verification", "reason": "verifier_rejected"}) == 1
    assert sample("smartcache_decisions_total", {"stage": "hit", "reason": "verified"}) == 1
    assert sample("smartcache_decisions_total", {"stage": "accept_zone", "reason": "candidate_zone"}) == 1
    stages = {s.__name__ for s in STAGES} | {"hit"}
    recorded = {s.labels["stage"] for f in metrics.registry.collect() if f.name == "smartcache_decisions"
                for s in f.samples if s.name.endswith("_total")}  # fmt: skip
    assert recorded <= stages


def test_the_verifier_has_a_latency_series() -> None:
    metrics = Metrics()
    metrics.observe_stage("verify", 0.004)
    assert metrics.registry.get_sample_value("smartcache_stage_seconds_count", {"stage": "verify"}) == 1


def test_a_stage_needs_a_name() -> None:
    with pytest.raises(ValueError, match="stage"):
        Metrics().decided("", "accept")
    assert decide([], CASES[0].sig, CASES[0].policy).stage == "hard_filters"
