"""What the side-by-side benchmarks share: percentiles, medians over rounds, a process's CPU time,
the machine they ran on, and where their JSON goes.

Numbers taken on a shared machine drift with its load, so each benchmark measures its modes in
alternating rounds and reports the median of the per-round figures: a burst of load from a
neighbour skews one round of every mode instead of all rounds of one mode.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
DEFAULT_MODEL_HOME = Path("/tmp/smartcache-bench-models")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def add_pack_option(ap: argparse.ArgumentParser) -> None:
    """``--pack``: the embedding pack a bench runs the proxy under, the proxy's own default unless told."""
    from proxy.settings import Settings

    ap.add_argument("--pack", default=Settings.embedding_model, help="embedding pack (default: the default pack)")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def median_of(rounds: Iterable[Mapping[str, float]], key: str) -> float:
    """The median over rounds of one figure, skipping rounds where it is missing or NaN."""
    values = [r[key] for r in rounds if key in r and r[key] == r[key]]
    return statistics.median(values) if values else float("nan")


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process and all its threads, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the command name: state is field 3, utime 14 and stime 15 (1-based, man 5 proc)
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def machine() -> dict[str, Any]:
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "cores": os.cpu_count(),
        "cpu": model or platform.processor(),
        "python": platform.python_version(),
        "loadavg_1m": round(load[0], 2),  # when the result is written
    }


def tree_state() -> dict[str, Any]:
    """The commit measured, and how many files of the proxy package differed from it then: the tree
    is shared, so a run may include someone's uncommitted work."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "proxy_files_modified": len(git("status", "--porcelain", "proxy").splitlines()),
    }


def envelope(name: str, argv: Sequence[str], results: Mapping[str, Any]) -> dict[str, Any]:
    """A result file: what ran, when, where, and its figures."""
    return {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *argv]),
        "machine": machine(),
        "tree": tree_state(),
        "results": results,
    }


def write_json(path: Path | None, name: str, payload: Mapping[str, Any]) -> Path:
    target = path or RESULTS / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    return target


def fmt(value: float, digits: int = 1) -> str:
    return "-" if value != value else f"{value:.{digits}f}"
