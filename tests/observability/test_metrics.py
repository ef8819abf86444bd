"""proxy/observability/metrics.py: the documented series, their labels, and the decision stage
that ended a lookup."""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.core.decision.decide import STAGES as DECISION_STAGES
from proxy.core.decision.decide import decide
from proxy.core.model import SCOPES
from proxy.observability.metrics import EVICTION_REASONS, RECORD_STATES, STAGES, STATUSES, Metrics
from tests.core.decision.test_decide import CASES

DOCUMENTED_METRICS = {
    "smartcache_requests": "counter",
    "smartcache_hits_judged": "counter",
    "smartcache_saved_tokens": "counter",
    "smartcache_upstream_cached_tokens": "counter",
    "smartcache_stage_seconds": "histogram",
    "smartcache_request_seconds": "histogram",
    "smartcache_records": "gauge",
    "smartcache_index_size": "gauge",
    "smartcache_writes": "counter",
    "smartcache_evictions": "counter",
    "smartcache_upstream_errors": "counter",
    "smartcache_upstream_retries": "counter",
    "smartcache_decisions": "counter",
    "smartcache_feed_lag_events": "gauge",
    "smartcache_feed_lag_seconds": "gauge",
    "smartcache_feed_rebuilds": "counter",
    "smartcache_store_vector_search": "gauge",
}


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_exposes_exactly_the_metrics_the_readme_lists() -> None:
    families = {
        family.name: family.type for family in Metrics().registry.collect() if not family.name.endswith("_created")
    }
    assert families == DOCUMENTED_METRICS


def test_closed_label_sets_start_at_zero() -> None:
    metrics = Metrics()
    assert value(metrics, "smartcache_hits_judged_total", outcome="accepted") == 0
    assert value(metrics, "smartcache_hits_judged_total", outcome="corrected") == 0
    assert value(metrics, "smartcache_saved_tokens_total", kind="prompt") == 0
    assert value(metrics, "smartcache_writes_total", outcome="rejected") == 0
    for status in STATUSES:
        assert value(metrics, "smartcache_request_seconds_count", status=status) == 0
    for stage in STAGES:
        assert value(metrics, "smartcache_stage_seconds_count", stage=stage) == 0
    for state in RECORD_STATES:
        for scope in SCOPES:
            assert value(metrics, "smartcache_records", state=state, scope=scope) == 0


def test_the_counters_the_dashboard_reads_start_at_zero() -> None:
    metrics = Metrics()
    for reason in EVICTION_REASONS:
        assert value(metrics, "smartcache_evictions_total", reason=reason) == 0
    for kind in ("UpstreamUnavailable", "UpstreamTimeout", "UpstreamStatus"):
        assert value(metrics, "smartcache_upstream_errors_total", kind=kind) == 0
    for status in STATUSES:  # a request's intent and reason are known once it comes
        assert value(metrics, "smartcache_requests_total", status=status, intent="-", reason="-") == 0


def test_each_instance_owns_its_registry() -> None:
    first, second = Metrics(), Metrics()  # a shared registry would refuse the second
    first.observe_request("hit", "travel", "accept_zone", 0.01)
    labels = {"status": "hit", "intent": "travel", "reason": "accept_zone"}
    assert value(first, "smartcache_requests_total", **labels) == 1
    assert value(second, "smartcache_requests_total", **labels) is None
    assert prometheus_client.REGISTRY.get_sample_value("smartcache_index_size") is None


def test_scripted_session_moves_each_counter_by_exactly_its_amount() -> None:
    metrics = Metrics()
    metrics.observe_request("miss", "travel", "below_candidate", 1.5)
    metrics.write("pending")
    metrics.write("ready")
    metrics.observe_request("hit", "travel", "accept_zone", 0.004)
    metrics.saved_tokens(prompt=1200, completion=300)
    metrics.hit_judged("corrected")
    metrics.observe_request("half_hit", "travel", "change_detected", 0.9)
    metrics.upstream_cached(1100)
    metrics.observe_request("bypass", "realtime", "policy_no_cache", 0.7)
    metrics.observe_request("hit", "travel", "accept_zone", 0.006)
    metrics.saved_tokens(prompt=800, completion=200)
    metrics.hit_judged("accepted")

    requests = "smartcache_requests_total"
    assert value(metrics, requests, status="miss", intent="travel", reason="below_candidate") == 1
    assert value(metrics, requests, status="hit", intent="travel", reason="accept_zone") == 2
    assert value(metrics, requests, status="half_hit", intent="travel", reason="change_detected") == 1
    assert value(metrics, requests, status="bypass", intent="realtime", reason="policy_no_cache") == 1
    assert value(metrics, "smartcache_request_seconds_count", status="hit") == 2
    assert value(metrics, "smartcache_request_seconds_sum", status="hit") == pytest.approx(0.010)
    assert value(metrics, "smartcache_request_seconds_bucket", status="hit", le="0.005") == 1
    assert value(metrics, "smartcache_saved_tokens_total", kind="prompt") == 2000
    assert value(metrics, "smartcache_saved_tokens_total", kind="completion") == 500
    assert value(metrics, "smartcache_upstream_cached_tokens_total") == 1100
    assert value(metrics, "smartcache_hits_judged_total", outcome="accepted") == 1
    assert value(metrics, "smartcache_hits_judged_total", outcome="corrected") == 1
    assert value(metrics, "smartcache_writes_total", outcome="pending") == 1
    assert value(metrics, "smartcache_writes_total", outcome="ready") == 1
    assert value(metrics, "smartcache_writes_total", outcome="rejected") == 0


def test_evictions_errors_and_index_size() -> None:
    metrics = Metrics()
    metrics.eviction("ttl", n=3)
    metrics.eviction("ttl")
    metrics.eviction("session_reset")
    metrics.upstream_error("timeout")
    metrics.upstream_error("timeout")
    metrics.set_index_size(42)
    metrics.set_index_size(40)
    assert value(metrics, "smartcache_evictions_total", reason="ttl") == 4
    assert value(metrics, "smartcache_evictions_total", reason="session_reset") == 1
    assert value(metrics, "smartcache_upstream_errors_total", kind="timeout") == 2
    assert value(metrics, "smartcache_index_size") == 40


def test_set_records_replaces_the_whole_gauge() -> None:
    metrics = Metrics()
    metrics.set_records({("ready", "session"): 5, ("pending", "session"): 2, ("ready", "tenant"): 1})
    metrics.set_records({("ready", "session"): 4})
    assert value(metrics, "smartcache_records", state="ready", scope="session") == 4
    assert value(metrics, "smartcache_records", state="pending", scope="session") == 0
    assert value(metrics, "smartcache_records", state="ready", scope="tenant") == 0


def test_observe_stage_adds_to_the_histogram() -> None:
    metrics = Metrics()
    metrics.observe_stage("decide", 0.0002)
    metrics.observe_stage("decide", 0.0004)
    assert value(metrics, "smartcache_stage_seconds_count", stage="decide") == 2
    assert value(metrics, "smartcache_stage_seconds_bucket", stage="decide", le="0.00025") == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(lambda m: m.observe_request("half-hit", "travel", "x", 0.1), "status", id="header-spelling"),
        pytest.param(lambda m: m.observe_stage("lookup", 0.1), "stage", id="unknown-stage"),
        pytest.param(lambda m: m.hit_judged("maybe"), "outcome", id="unknown-judgement"),
        pytest.param(lambda m: m.write("stored"), "outcome", id="unknown-write"),
        pytest.param(lambda m: m.set_records({("gone", "session"): 1}), "state", id="unknown-state"),
        pytest.param(lambda m: m.set_records({("ready", "team"): 1}), "scope", id="unknown-scope"),
        pytest.param(lambda m: m.eviction(""), "reason", id="empty-reason"),
        pytest.param(lambda m: m.upstream_error(""), "kind", id="empty-kind"),
        pytest.param(lambda m: m.saved_tokens(-1, 0), "non-negative", id="negative-tokens"),
    ],
)
def test_bad_label_values_are_refused(call: Callable[[Metrics], object], message: str) -> None:
    metrics = Metrics()
    before = series(metrics)
    with pytest.raises(ValueError, match=message):
        call(metrics)
    assert series(metrics) == before  # a refused value leaves no new series behind


def series(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_render_parses_and_carries_the_values() -> None:
    metrics = Metrics()
    metrics.observe_request("hit", "chitchat", "accept_zone", 0.002)
    metrics.saved_tokens(prompt=40, completion=12)
    metrics.set_records({("ready", "tenant"): 7})
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    families = {family.name: family for family in text_string_to_metric_families(body.decode())}
    assert set(DOCUMENTED_METRICS) <= set(families)
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families.values()
        for sample in family.samples
    }
    rendered = {key: val for key, val in samples.items() if not key[0].endswith("_created")}
    assert rendered == series(metrics)  # the text carries every series, values intact
    assert samples[("smartcache_saved_tokens_total", (("kind", "prompt"),))] == 40
    assert samples[("smartcache_records", (("scope", "tenant"), ("state", "ready")))] == 7
    hit = (("intent", "chitchat"), ("reason", "accept_zone"), ("status", "hit"))
    assert samples[("smartcache_requests_total", hit)] == 1


# Which decision stage ended a lookup, and how long the verifier took.
def test_decisions_count_by_stage_and_reason() -> None:
    metrics = Metrics()
    for case in CASES:
        d = case.run()
        metrics.decided(d.stage, d.reason)
    sample = metrics.registry.get_sample_value
    assert sample("smartcache_decisions_total", {"stage": "verification", "reason": "verifier_rejected"}) == 1
    assert sample("smartcache_decisions_total", {"stage": "hit", "reason": "verified"}) == 1
    assert sample("smartcache_decisions_total", {"stage": "accept_zone", "reason": "candidate_zone"}) == 1
    stages = {s.__name__ for s in DECISION_STAGES} | {"hit"}
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
