"""Which embedding pack should be the default: calibrated quality per pack on replay traces.

For each pack, the traces are shadow-replayed under the policy shipped for that pack (its
classifier settings; thresholds play no part in shadow rows), then:
- in-sample: thresholds calibrated on all traces, and the hits they give on those same traces
  (false is 0 by construction: each threshold sits just above the worst false candidate);
- held-out: 2-fold by conversation, each half served with thresholds calibrated on the other
  half. This is the number that says whether a pack's thresholds generalise.
Latency per pack is in bench_proxy.py (hit path, miss overhead) and bench_embedding.py.

    .venv/bin/python -m proxy.tools.datasets /tmp/cal.jsonl --data-dir ../shared/data
    .venv/bin/python benchmarks/bench_pack_choice.py /tmp/cal.jsonl [--model-home DIR] [--packs P ...]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from proxy.observability.log import configure_logging
from proxy.settings import load_settings
from proxy.tools.calibrate import calibrate
from proxy.tools.datasets.traces import load_traces
from proxy.tools.held_out import held_out
from proxy.tools.replay import run_replay


async def main(traces: Path, model_home: Path | None, packs: list[str]) -> None:
    convs = load_traces([traces])
    table = Table(title=f"{traces.name}: {len(convs)} conversations, {sum(len(c.turns) for c in convs)} requests")
    for col in (
        "pack",
        "shadow replay s",
        "in-sample hits",
        "held-out hits",
        "held-out false",
        "precision",
        "recall",
        "accept general",
        "accept travel",
    ):
        table.add_column(col, no_wrap=col == "pack")
    for pack in packs:
        settings = load_settings(environ={}, overrides={"embedding_model": pack, "model_home": model_home})
        t0 = time.perf_counter()
        rows = await run_replay(convs, settings=settings, shadow=True)
        seconds = time.perf_counter() - t0
        chosen = calibrate(rows)
        check = held_out(rows)
        table.add_row(
            pack,
            f"{seconds:.0f}",
            str(sum(c.hits for c in chosen.values())),
            str(check.hits),
            str(check.false_hits),
            f"{check.precision:.3f}",
            f"{check.recall:.3f}",
            *(f"{chosen[i].accept:.4f}" if i in chosen else "-" for i in ("general", "travel")),
        )
    Console(width=140).print(table)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", type=Path)
    ap.add_argument("--model-home", type=Path)
    ap.add_argument("--packs", nargs="+", default=["e5-small-multilingual", "use-multilingual"])
    a = ap.parse_args()
    configure_logging("warning")
    asyncio.run(main(a.traces, a.model_home, a.packs))
