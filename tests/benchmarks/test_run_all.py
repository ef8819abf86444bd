"""benchmarks/run_all.py: a run of some scripts (``--only``) replaces their rows of the summary and
keeps every other script's, each with the date it ran. No benchmark runs here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("run_all", module)
    spec.loader.exec_module(module)
    return module


run_all = _load()


def row(headline: str, **extra: Any) -> dict[str, Any]:
    return {"command": "python benchmarks/x.py", "rc": 0, "wall_s": 1.0, "headline": headline, **extra}


def write_summary(path: Path, date: str, rows: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"date": date, "command": "c", "machine": {}, "results": rows}), encoding="utf-8")
    return path


def test_only_replaces_its_rows_and_keeps_the_others_dated(tmp_path: Path) -> None:
    summary = write_summary(
        tmp_path / "summary.json",
        "2026-12-01T00:00:00+00:00",
        {"bench_domains": row("old domains"), "bench_overhead": row("overhead", date="2026-11-30T00:00:00+00:00")},
    )
    merged = run_all.merge_runs(
        run_all.previous_runs(summary), {"bench_domains": row("new domains", date="2026-12-08T00:00:00+00:00")}
    )
    assert merged == {
        "bench_overhead": row("overhead", date="2026-11-30T00:00:00+00:00"),
        "bench_domains": row("new domains", date="2026-12-08T00:00:00+00:00"),
    }  # in the order of SCRIPTS; a row without a date takes its summary's
    assert list(merged) == ["bench_overhead", "bench_domains"]


def test_a_row_the_budget_skipped_keeps_the_one_measured_before(tmp_path: Path) -> None:
    summary = write_summary(tmp_path / "summary.json", "2026-12-01T00:00:00+00:00", {"bench_router": row("router")})
    skipped = {"bench_router": row(run_all.SKIPPED), "bench_agreement": row(run_all.SKIPPED)}
    merged = run_all.merge_runs(run_all.previous_runs(summary), skipped)
    assert merged["bench_router"]["headline"] == "router"
    assert merged["bench_agreement"]["headline"] == run_all.SKIPPED  # nothing measured before: said so


def test_no_summary_yet_is_no_rows(tmp_path: Path) -> None:
    assert run_all.previous_runs(tmp_path / "summary.json") == {}
    assert list(run_all.merge_runs({}, {"bench_intent": row("i")})) == ["bench_intent"]


def test_bench_agreement_is_registered_with_a_headline() -> None:
    assert "bench_agreement" in {s.name for s in run_all.SCRIPTS}
    lang = {
        "near_miss_pairs": {"pairs": 90, "agree": 1, "agree_rate": 0.0111, "false_agree_upper95": 0.052},
        "same_question_pairs": {"pairs": 30, "agree_rate": 0.3, "unsure_rate": 0.6, "disagree_rate": 0.1},
    }
    text = run_all.headline("bench_agreement", {"rc": 0, "result": {"results": {"languages": {"en": lang}}}})
    assert text.startswith("en near-miss pairs agreed 1/90 (upper 95 % 5.2%)"), text
