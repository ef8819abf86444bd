"""All converters by name, and the command that writes a trace file."""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from proxy.tools.datasets.dialogues import (
    crosswoz_dialogues,
    gecor_followups,
    gecor_openings,
    kvret_rewrites,
    mtbench_followups,
)
from proxy.tools.datasets.pairs import pawsx_pairs, qqp_pairs, zh_calib_pairs
from proxy.tools.datasets.probes import realtime_probes
from proxy.tools.datasets.traces import Conversation, consistent, write_traces

CONVERTERS: Mapping[str, Callable[[Path, random.Random, int], list[Conversation]]] = MappingProxyType(
    {
        "qqp_pairs": qqp_pairs,
        "pawsx_pairs": pawsx_pairs,
        "zh_calib_pairs": zh_calib_pairs,
        "gecor_followups": gecor_followups,
        "kvret_rewrites": kvret_rewrites,
        "crosswoz_dialogues": crosswoz_dialogues,
        "mtbench_followups": mtbench_followups,
        "realtime_probes": realtime_probes,
        "gecor_openings": gecor_openings,
    }
)
# the calibration set (the default): gecor_openings measures one risk, cross-session openings of
# task dialogues, and is asked for by name, so the calibrated policies' traces stay as they were
DEFAULT_NAMES: tuple[str, ...] = tuple(n for n in CONVERTERS if n != "gecor_openings")


def build_traces(
    data_dir: Path, *, names: Sequence[str] | None = None, seed: int = 20261129, limit: int = 300
) -> list[Conversation]:
    """Each converter draws from its own generator (seed and name), so a subset gives the same rows."""
    chosen = list(names) if names is not None else list(DEFAULT_NAMES)
    unknown = [n for n in chosen if n not in CONVERTERS]
    if unknown:
        raise ValueError(f"unknown converter(s) {unknown}; choose from {sorted(CONVERTERS)}")
    out: list[Conversation] = []
    for name in chosen:
        out += CONVERTERS[name](Path(data_dir), random.Random(f"{seed}:{name}"), limit)
    return consistent(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m proxy.tools.datasets", description="Replay traces from ../shared/data."
    )
    ap.add_argument("out", type=Path, help="output JSONL")
    ap.add_argument(
        "--names", nargs="+", choices=sorted(CONVERTERS), help="converters (default: all but gecor_openings)"
    )
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--limit", type=int, default=300, help="conversations per converter at most")
    ap.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    a = ap.parse_args(argv)
    convs = build_traces(a.data_dir, names=a.names, seed=a.seed, limit=a.limit)
    write_traces(a.out, convs)
    convs_by = Counter(c.category for c in convs)
    reqs_by: Counter[str] = Counter()
    for c in convs:
        reqs_by[c.category] += len(c.turns)
    for cat in sorted(convs_by):
        print(f"{cat:24s} conversations {convs_by[cat]:5d}  requests {reqs_by[cat]:6d}")
    print(f"total {len(convs)} conversations, {reqs_by.total()} requests -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
