"""Replay and calibration reports: terminal tables (rich) and an HTML page with PNG plots."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from proxy.tools.calibrate import Calibration, VerifierLevel, calibrate
from proxy.tools.held_out import HeldOut
from proxy.tools.replay import Row, summarize

COLUMNS = ("requests", "reusable", "hit", "correct_hits", "false_hits", "half-hit", "miss", "bypass", "saved_tokens")


def summary_table(rows: Sequence[Row], title: str, by: str) -> Table:
    groups = summarize(rows, (lambda r: r.intent) if by == "intent" else (lambda r: r.category))
    table = Table(title=title)
    table.add_column(by)
    for col in (*COLUMNS, "false-hit rate", "recall"):
        table.add_column(col, justify="right")
    total: dict[str, int] = {}
    for name in sorted(groups):
        c = groups[name]
        for k in COLUMNS:
            total[k] = total.get(k, 0) + c[k]
        table.add_row(name, *_cells(c))
    table.add_row("TOTAL", *_cells(total), style="bold")
    return table


def _cells(c: Mapping[str, int]) -> list[str]:
    hits = c.get("hit", 0)
    fhr = f"{c.get('false_hits', 0) / hits:.4f}" if hits else "-"
    recall = f"{c.get('correct_hits', 0) / c['reusable']:.3f}" if c.get("reusable") else "-"
    return [str(c.get(k, 0)) for k in COLUMNS] + [fhr, recall]


def print_summary(rows: Sequence[Row], console: Console | None = None) -> None:
    console = console or Console()
    console.print(summary_table(rows, "replay by intent", "intent"))
    console.print(summary_table(rows, "replay by category", "category"))


def print_calibration(results: Mapping[str, Calibration], console: Console | None = None) -> None:
    table = Table(title="calibrated thresholds")
    for col in ("intent", "accept", "candidate", "samples", "hits", "false", "FHR upper 95%", "reusable", "recall"):
        table.add_column(col, justify="right")
    for c in results.values():
        table.add_row(
            c.intent,
            f"{c.accept:.4f}" if c.fitted else f"{c.accept:.4f} (template)",
            f"{c.candidate:.4f}",
            str(c.samples),
            str(c.hits),
            str(c.false_hits),
            f"{c.fhr_upper:.4f}",
            str(c.reusable),
            f"{c.recall:.3f}",
        )
    (console or Console()).print(table)
    for c in results.values():
        (console or Console()).print(f"  {c.intent}: {c.note}")


def print_verifier_curve(curve: Sequence[VerifierLevel], console: Console | None = None) -> None:
    """The verifier's top end on the traces, one row a level (``calibrate.verifier_curve``)."""
    if not curve:
        return
    table = Table(title=f"{curve[0].setting}: what each level would serve, every intent together")
    for col in ("level", "served", "false", "FHR upper 95%", "false by category"):
        table.add_column(col, justify="right")
    for v in curve:
        where = ", ".join(f"{name} {n}" for name, n in v.false_by_category) or "-"
        table.add_row(f"{v.level:g}", str(v.served), str(v.false_hits), f"{v.fhr_upper:.4f}", where)
    (console or Console()).print(table)


def print_held_out(result: HeldOut, console: Console | None = None) -> None:
    out = console or Console()
    out.print(
        f"held-out check ({result.folds}-fold by conversation, each fold served with thresholds "
        f"calibrated on the others): {result.hits} hits, {result.false_hits} false, precision "
        f"{result.precision:.3f}, recall {result.recall:.3f} of {result.reusable} reusable"
    )
    for intent, (hits, false) in result.by_intent.items():
        if false:
            out.print(
                f"  {intent}: {false} false of {hits} hits: its threshold does not generalise; "
                "add traces or raise it by hand"
            )


def _plot(shadow: Sequence[Row], chosen: Mapping[str, Calibration], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    intents = sorted({r.intent for r in shadow if r.score is not None and r.nets_ok})
    fig, axes = plt.subplots(len(intents) or 1, 1, figsize=(7, 2.6 * max(1, len(intents))), squeeze=False)
    grid = [0.70 + i * 0.0025 for i in range(121)]
    for ax, intent in zip(axes[:, 0], intents, strict=False):
        scored = [r for r in shadow if r.intent == intent and r.score is not None and r.nets_ok]
        total = sum(1 for r in shadow if r.intent == intent)
        fhr, rate = [], []
        for t in grid:
            hits = [r for r in scored if (r.score or 0) >= t]
            false = sum(r.expect_no_hit or not r.candidate_key_ok for r in hits)
            fhr.append(false / len(hits) if hits else 0.0)
            rate.append(len(hits) / total if total else 0.0)
        ax.plot(grid, fhr, label="false-hit rate", color="tab:red")
        ax.plot(grid, rate, label="hit rate", color="tab:blue")
        if intent in chosen:
            ax.axvline(chosen[intent].accept, color="black", linestyle="--", label="chosen accept")
        ax.set_title(f"{intent} ({len(scored)} candidates, {total} requests)")
        ax.set_xlabel("accept threshold")
        ax.set_ylim(0, 1)
        ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(folder: Path, rows: Sequence[Row], shadow: Sequence[Row]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    console = Console(record=True, width=160)
    print_summary(rows, console)
    parts = [
        "<html><head><meta charset='utf-8'><title>SmartCache replay</title></head><body>",
        "<h1>SmartCache replay</h1><pre>",
        html.escape(console.export_text()),
        "</pre>",
    ]
    if shadow:
        chosen = calibrate(shadow)
        _plot(shadow, chosen, folder / "thresholds.png")
        cal_console = Console(record=True, width=160)
        print_calibration(chosen, cal_console)
        parts += [
            "<h2>Thresholds</h2><pre>",
            html.escape(cal_console.export_text()),
            "</pre>",
            "<img src='thresholds.png' alt='false-hit and hit rate against the accept threshold'>",
        ]
    parts.append("</body></html>")
    page = folder / "index.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page
