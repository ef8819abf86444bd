"""`smartcache stats`: the four numbers that matter, read from a running proxy's /metrics.

The numbers are computed exactly as deploy/prometheus/rules.yml derives them, but over the
counters' whole life instead of a rate window: hit rate = hits / requests, precision_hit =
accepted / (accepted + corrected) judged hits, cache pollution = corrected hits / requests,
and saved tokens (kept apart from the tokens the upstream engine served from its own prefix
cache). Parsing is a pure function over the exposition text, so the demo and the tests share it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from proxy.observability.metrics import STAGES, STATUSES


@dataclass(frozen=True, slots=True)
class Histogram:
    """One labelled series of a Prometheus histogram: cumulative ``(le, count)`` buckets."""

    count: float = 0.0
    total: float = 0.0
    buckets: tuple[tuple[float, float], ...] = ()

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Linear interpolation inside the bucket, as PromQL's ``histogram_quantile`` does."""
        if not self.count or not self.buckets:
            return None
        rank = q * self.count
        lower_le, lower_count = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return lower_le  # beyond the last finite bound: its upper edge is all we know
                inside = cumulative - lower_count
                return lower_le + (le - lower_le) * ((rank - lower_count) / inside if inside else 1.0)
            lower_le, lower_count = le, cumulative
        return lower_le


@dataclass(frozen=True)
class Snapshot:
    """The proxy's counters at one scrape."""

    requests: Mapping[str, float] = field(default_factory=dict)  # status -> count
    requests_by: Mapping[tuple[str, str, str], float] = field(default_factory=dict)  # (status, intent, reason)
    judged: Mapping[str, float] = field(default_factory=dict)  # accepted | corrected -> count
    saved_tokens: Mapping[str, float] = field(default_factory=dict)  # prompt | completion -> tokens
    upstream_cached_tokens: float = 0.0
    writes: Mapping[str, float] = field(default_factory=dict)
    records: Mapping[str, float] = field(default_factory=dict)  # state -> count, summed over scopes
    index_size: float = 0.0
    stages: Mapping[str, Histogram] = field(default_factory=dict)
    latency: Mapping[str, Histogram] = field(default_factory=dict)  # status -> request seconds
    judge_calls: Mapping[str, float] = field(default_factory=dict)  # yes | no | failed | skipped -> calls
    judge_tokens: float = 0.0
    judge_qualified: Mapping[str, float] = field(default_factory=dict)  # model -> 1 passed, 0 not
    # learned levels per intent: the lowest level in force, its bound, labels read, judge calls saved
    learned: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def total_requests(self) -> float:
        return sum(self.requests.values())

    @property
    def hit_rate(self) -> float | None:
        return _ratio(self.requests.get("hit", 0.0), self.total_requests)

    @property
    def precision_hit(self) -> float | None:
        accepted, corrected = self.judged.get("accepted", 0.0), self.judged.get("corrected", 0.0)
        return _ratio(accepted, accepted + corrected)

    @property
    def cache_pollution(self) -> float | None:
        return _ratio(self.judged.get("corrected", 0.0), self.total_requests)

    @property
    def saved_total(self) -> float:
        return sum(self.saved_tokens.values())


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _add(target: dict[str, float], key: str, value: float) -> None:
    target[key] = target.get(key, 0.0) + value


def _histograms(samples: Iterable[tuple[str, dict[str, str], float]], name: str, label: str) -> dict[str, Histogram]:
    counts: dict[str, float] = {}
    totals: dict[str, float] = {}
    buckets: dict[str, list[tuple[float, float]]] = {}
    for sample, labels, value in samples:
        key = labels.get(label)
        if key is None:
            continue
        if sample == f"{name}_count":
            counts[key] = value
        elif sample == f"{name}_sum":
            totals[key] = value
        elif sample == f"{name}_bucket":
            buckets.setdefault(key, []).append((float(labels["le"]), value))
    return {
        key: Histogram(counts.get(key, 0.0), totals.get(key, 0.0), tuple(sorted(buckets.get(key, []))))
        for key in counts.keys() | buckets.keys()
    }


def parse_metrics(text: str) -> Snapshot:
    """Read the SmartCache families out of a Prometheus text exposition."""
    samples = [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    requests: dict[str, float] = {}
    requests_by: dict[tuple[str, str, str], float] = {}
    judged: dict[str, float] = {}
    saved: dict[str, float] = {}
    writes: dict[str, float] = {}
    records: dict[str, float] = {}
    judge_calls: dict[str, float] = {}
    judge_qualified: dict[str, float] = {}
    learned: dict[str, dict[str, float]] = {}
    cached = index_size = judge_tokens = 0.0
    for name, labels, value in samples:
        if name == "smartcache_requests_total":
            _add(requests, labels["status"], value)
            key = (labels["status"], labels["intent"], labels["reason"])
            requests_by[key] = requests_by.get(key, 0.0) + value
        elif name == "smartcache_hits_judged_total":
            _add(judged, labels["outcome"], value)
        elif name == "smartcache_saved_tokens_total":
            _add(saved, labels["kind"], value)
        elif name == "smartcache_upstream_cached_tokens_total":
            cached += value
        elif name == "smartcache_writes_total":
            _add(writes, labels["outcome"], value)
        elif name == "smartcache_records":
            _add(records, labels["state"], value)
        elif name == "smartcache_index_size":
            index_size = value
        elif name == "smartcache_judge_calls_total":
            _add(judge_calls, labels["outcome"], value)
        elif name == "smartcache_judge_tokens_total":
            judge_tokens += value
        elif name == "smartcache_judge_qualified":
            judge_qualified[labels["model"]] = value
        elif name in _LEARNED:
            learned.setdefault(labels["intent"], {})[_LEARNED[name]] = value
    return Snapshot(
        requests=requests,
        requests_by=requests_by,
        judged=judged,
        saved_tokens=saved,
        upstream_cached_tokens=cached,
        writes=writes,
        records=records,
        index_size=index_size,
        stages=_histograms(samples, "smartcache_stage_seconds", "stage"),
        latency=_histograms(samples, "smartcache_request_seconds", "status"),
        judge_calls=judge_calls,
        judge_tokens=judge_tokens,
        judge_qualified=judge_qualified,
        learned=learned,
    )


def metrics_url(url: str) -> str:
    """``http://host:port`` or ``.../v1`` (what clients are given) -> ``http://host:port/metrics``."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics"):
        path = path.removesuffix("/v1") + "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def fetch_snapshot(url: str, *, timeout: float = 5.0) -> Snapshot:
    response = httpx.get(metrics_url(url), timeout=timeout, trust_env=False)
    response.raise_for_status()
    return parse_metrics(response.text)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def summary_table(snap: Snapshot) -> Table:
    table = Table(title="SmartCache: the four numbers")
    table.add_column("number")
    table.add_column("value", justify="right")
    table.add_column("from")
    judged = snap.judged.get("accepted", 0.0) + snap.judged.get("corrected", 0.0)
    table.add_row(
        "hit rate", _pct(snap.hit_rate), f"{snap.requests.get('hit', 0):.0f} hits / {snap.total_requests:.0f} requests"
    )
    table.add_row(
        "precision_hit",
        _pct(snap.precision_hit),
        f"{snap.judged.get('accepted', 0):.0f} accepted / {judged:.0f} judged hits",
    )
    table.add_row(
        "saved tokens",
        f"{snap.saved_total:.0f}",
        f"prompt {snap.saved_tokens.get('prompt', 0):.0f}, "
        f"completion {snap.saved_tokens.get('completion', 0):.0f}; engine prefix cache served "
        f"{snap.upstream_cached_tokens:.0f} more",
    )
    calls = sum(snap.judge_calls.get(k, 0.0) for k in ("yes", "no"))
    passed = sorted(m for m, q in snap.judge_qualified.items() if q)
    failed = sorted(m for m, q in snap.judge_qualified.items() if not q)
    table.add_row(
        "judge calls a request",
        "-" if not snap.total_requests else f"{calls / snap.total_requests:.2f}",
        f"{calls:.0f} calls, {snap.judge_calls.get('yes', 0):.0f} said yes, {snap.judge_tokens:.0f} tokens; "
        f"deciding: {', '.join(passed) or 'none'}" + (f"; not deciding: {', '.join(failed)}" if failed else ""),
    )
    table.add_row(
        "cache pollution",
        _pct(snap.cache_pollution),
        f"{snap.judged.get('corrected', 0):.0f} corrected hits / {snap.total_requests:.0f} requests",
    )
    return table


_LEARNED: Mapping[str, str] = {
    "smartcache_learned_level": "level",
    "smartcache_learned_bound": "bound",
    "smartcache_learned_labels": "labels",
    "smartcache_judge_saved_total": "saved",
}


def _counts_table(title: str, key: str, *numbers: str) -> Table:
    """A table of one named row per key (left) and its figures (right)."""
    table = Table(title=title)
    table.add_column(key)
    for col in numbers:
        table.add_column(col, justify="right")
    return table


def learned_table(snap: Snapshot) -> Table:
    """Per intent: the labels the levels were fitted from, the lowest level in force and its bound,
    and the judge calls the levels saved."""
    table = _counts_table("Learned levels", "intent", "labels", "level in force", "bound", "judge calls saved")
    for intent, values in sorted(snap.learned.items()):
        level, bound = values.get("level"), values.get("bound")
        table.add_row(
            intent,
            f"{values.get('labels', 0):.0f}",
            "none" if level is None else f"{level:.3f}",
            "-" if bound is None else f"{bound:.4f}",
            f"{values.get('saved', 0):.0f}",
        )
    return table


def stage_table(snap: Snapshot) -> Table:
    table = _counts_table("Stage timings", "stage", "runs", "mean ms", "p95 ms")
    for stage in STAGES:
        h = snap.stages.get(stage, Histogram())
        table.add_row(stage, f"{h.count:.0f}", _ms(h.mean), _ms(h.quantile(0.95)))
    return table


def latency_table(snap: Snapshot) -> Table:
    table = _counts_table("Latency by status", "status", "requests", "mean ms", "p50 ms", "p95 ms")
    for status in STATUSES:
        h = snap.latency.get(status, Histogram())
        table.add_row(status, f"{h.count:.0f}", _ms(h.mean), _ms(h.quantile(0.5)), _ms(h.quantile(0.95)))
    return table


def print_stats(snap: Snapshot, console: Console | None = None) -> None:
    console = console or Console()
    tables = [summary_table(snap), stage_table(snap), latency_table(snap)]
    if snap.learned:
        tables.insert(1, learned_table(snap))
    for table in tables:
        console.print(table)
