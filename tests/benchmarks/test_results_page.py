"""docs/benchmarks.md is rendered from benchmarks/results/ (benchmarks/results_page.py): every
table under the date, machine and command it came from, no commit id, and the page in the tree is
what the results render to. No benchmark runs here."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0e2e145d6b1f0c3a9a7d2f58e4b6c1d0a9b8c7f6"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("results_page", ROOT / "benchmarks" / "results_page.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


page = _load()


def make_result(name: str, date: str, cpu: str, command: str, results: Any) -> dict[str, Any]:
    return {
        "benchmark": name,
        "date": date,
        "command": command,
        "machine": {"cores": 2, "cpu": cpu, "python": "3.11.7", "loadavg_1m": 1.5},
        "tree": {"commit": COMMIT[:7], "proxy_files_modified": 0},
        "results": results,
    }


RESULTS = {
    "bench_overhead.quick": make_result(
        "bench_overhead",
        "2026-12-05T02:38:00+00:00",
        "AMD EPYC 7B13",
        "python benchmarks/bench_overhead.py --quick",
        {
            "upstream_ms": 20.0,
            "rounds": 5,
            "modes": {
                mode: {
                    "median": {"p50": p50, "p95": p50 + 1, "p99": p50 + 2, "mean": p50, "n": 60},
                    "p50_over_direct_ms": p50 - 20.7,
                    "cpu_ms_per_request": 5.8,
                    "stages_ms": {s: 0.5 for s in ("parse", "sign", "embed", "index", "decide", "store")},
                    "rounds": [{"p50": 123456.789}],
                }
                for mode, p50 in (("direct", 20.7), ("miss", 26.7), ("hit_exact", 1.1))
            },
            "hit_throughput": {"1": {"requests_per_s": 1002.0}, "8": {"requests_per_s": 1230.0}},
        },
    ),
    "bench_never_cache.quick": make_result(
        "bench_never_cache",
        "2026-12-05T02:40:00+00:00",
        "Intel Xeon",
        "python benchmarks/bench_never_cache.py --per-source 40",
        {"en": {"realtime": {"precision": 0.95, "recall": 0.95, "support": 175}}, "weights": COMMIT},
    ),
    "bench_store.quick": make_result(
        "bench_store",
        "2026-12-05T02:41:00+00:00",
        "AMD EPYC 7B13",
        "python benchmarks/bench_store.py --records 20000",
        {"output": ["store  search ms", "sqlite 0.04"]},
    ),
    "summary": make_result(
        "run_all",
        "2026-12-05T02:42:00+00:00",
        "AMD EPYC 7B13",
        "python benchmarks/run_all.py --quick",
        {
            "bench_overhead": {
                "command": "python benchmarks/bench_overhead.py --quick",
                "rc": 0,
                "wall_s": 40.2,
                "headline": f"miss +6.1 ms at {COMMIT}",
            }
        },
    ),
}


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    for stem, doc in RESULTS.items():
        (tmp_path / f"{stem}.json").write_text(json.dumps(doc), encoding="utf-8")
    (tmp_path / "bench_raw.json").write_text(json.dumps({"auc": 0.9}), encoding="utf-8")
    return tmp_path


def sections(text: str) -> dict[str, str]:
    return {part.splitlines()[0]: part for part in re.split(r"^## ", text, flags=re.M)[1:]}


def test_every_table_sits_under_its_date_machine_and_command(results_dir: Path) -> None:
    text = page.render(results_dir)
    by_title = sections(text)
    assert set(by_title) == {
        "The last run, in one table",
        "bench_never_cache (quick)",
        "bench_overhead (quick)",
        "bench_store (quick)",
    }
    stems = {t: t.replace(" (quick)", ".quick") for t in by_title} | {"The last run, in one table": "summary"}
    for title, body in by_title.items():
        doc = RESULTS[stems[title]]
        assert "|---|" in body or "```" in body, f"{title}: nothing rendered"
        assert f"Date: {doc['date']}" in body, title
        assert doc["machine"]["cpu"] in body and "2 cores" in body, title
        assert f"Command: `{doc['command']}`" in body, title
    assert text.index("## The last run") < text.index("## bench_never_cache")


def test_no_commit_id_is_rendered(results_dir: Path) -> None:
    text = page.render(results_dir)
    assert not re.search(r"\b[0-9a-f]{40}\b", text)
    assert COMMIT[:7] not in text


def test_the_figures_are_laid_out_by_shape(results_dir: Path) -> None:
    overhead = sections(page.render(results_dir))["bench_overhead (quick)"]
    assert "| upstream_ms | 20 |" in overhead and "| rounds | 5 |" in overhead
    assert "| miss | 6 | 5.8 |" in overhead  # a wide row's own figures: one table of the modes
    assert "**modes / median**" in overhead and "**modes / stages_ms**" in overhead
    assert "| 8 | 1230 |" in overhead
    assert "123456" not in overhead  # per-round figures stay in the JSON
    store = sections(page.render(results_dir))["bench_store (quick)"]
    assert "```\nstore  search ms\nsqlite 0.04\n```" in store


def test_the_header_says_how_the_page_is_made_and_what_was_left_out(results_dir: Path) -> None:
    text = page.render(results_dir)
    head = text[: text.index("## ")]
    assert "benchmarks/run_all.py [--quick]" in head and "never edit it by hand" in head
    assert "`bench_raw.json`" in text  # no envelope: named, not rendered
    assert page.render(results_dir) == text


def test_the_page_in_the_tree_is_what_the_results_render_to() -> None:
    committed = ROOT / "docs" / "benchmarks.md"
    rendered = page.render(ROOT / "benchmarks" / "results", ROOT / "benchmarks")
    assert committed.read_text(encoding="utf-8") == rendered, (
        "docs/benchmarks.md differs from benchmarks/results/: render it with "
        "`.venv/bin/python benchmarks/run_all.py --docs`, never by hand"
    )
