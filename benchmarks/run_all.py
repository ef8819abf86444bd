"""Every side-by-side benchmark in sequence, one summary: date, machine, command, headline figures.

Each script runs as its own process (none shares an interpreter, a model or a port with another),
one after the other, so no two compete for the 2 cores. A script that takes ``--quick`` gets it
under ``--quick``; the few that do not are shrunk by the arguments in ``QUICK_ARGS``. A script
that takes ``--json`` writes its result file into benchmarks/results/; the others' printed
output is kept instead, in a result file of its own. Scripts not in the tree are skipped; one
that fails is reported and the run goes on (its previous result file stays).
benchmarks/results/summary.json gathers it all, and docs/benchmarks.md is rendered from the result
files at the end of every run (benchmarks/results_page.py); ``--docs`` renders it alone. A run of
some scripts (``--only``) replaces their rows of the summary and keeps every other script's row, each
with the date it ran.

    .venv/bin/python benchmarks/run_all.py [--quick] [--only NAME ...]
    .venv/bin/python benchmarks/run_all.py --docs
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurement import HERE, RESULTS, ROOT, envelope, fmt, write_json
from results_page import write as write_page

DOCS_PAGE = ROOT / "docs" / "benchmarks.md"

# shrinks for the scripts that have no --quick of their own, or whose --quick alone does not fit
# the budget (bench_verifier's takes over 4 minutes here)
QUICK_ARGS: Mapping[str, Sequence[str]] = {
    "bench_verifier": ("--max-pairs", "150", "--gbdt-train", "200"),
    "bench_store": ("--records", "20000"),
    "bench_replicas": ("--records", "2000", "--rounds", "200", "--seconds", "2"),
    "bench_never_cache": ("--per-source", "40"),
}
# the longest any one script may take; a script past it is stopped and reported. Under --quick the
# whole run has QUICK_BUDGET_S: each script gets at most what is left, and one that would start
# with under a minute left is skipped, so --quick ends within it whatever the machine's load.
TIMEOUT_S = {True: 360, False: 3600}
QUICK_BUDGET_S = 600


@dataclass(frozen=True)
class Script:
    name: str
    extra: Sequence[str] = ()  # always passed

    @property
    def path(self) -> Path:
        return HERE / f"{self.name}.py"


# the slowest last, so a tight --quick budget cuts the fewest
SCRIPTS = (
    Script("bench_overhead"),
    Script("bench_upstream_client"),
    Script("bench_long_history"),
    Script("bench_view_length"),
    Script("bench_gptcache"),
    Script("bench_store"),
    Script("bench_never_cache"),
    Script("bench_intent"),
    Script("bench_filters"),
    Script("bench_replicas"),
    Script("bench_verifier"),
    Script("bench_agreement"),
    Script("bench_domains"),
    Script("bench_router"),
)


def flags_of(script: Script) -> str:
    done = subprocess.run(
        [sys.executable, str(script.path), "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    return done.stdout


def command_for(script: Script, quick: bool, results: Path) -> tuple[list[str], Path | None]:
    flags = flags_of(script)
    cmd = [sys.executable, str(script.path.relative_to(ROOT)), *script.extra]
    if quick:
        if script.name in QUICK_ARGS:
            cmd += QUICK_ARGS[script.name]
        elif "--quick" in flags:
            cmd.append("--quick")
    out = results / f"{script.name}{'.quick' if quick else ''}.json" if "--json" in flags else None
    if out is not None:
        cmd += ["--json", str(out.relative_to(ROOT))]
    return cmd, out


def run_bounded(cmd: Sequence[str], timeout: float) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); past ``timeout`` the script's whole process group is killed,
    so a proxy or engine it started does not outlive it."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        return -1, stdout, f"stopped after {timeout:.0f} s\n{stderr}"


def run_one(script: Script, quick: bool, results: Path, console: Console, timeout: float) -> dict[str, Any]:
    cmd, out = command_for(script, quick, results)
    shown = " ".join(["python", *cmd[1:]])
    console.print(f"[bold]$ {shown}[/bold]")
    t0 = time.monotonic()
    rc, stdout, stderr = run_bounded(cmd, timeout)
    wall = time.monotonic() - t0
    console.print(stdout.rstrip())
    if rc != 0:
        console.print(f"[red]{script.name} exited {rc}[/red]: {stderr.strip()[-800:]}")
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    entry: dict[str, Any] = {"command": shown, "date": date, "rc": rc, "wall_s": round(wall, 1)}
    if out is not None and out.is_file() and rc == 0:
        entry["json"] = str(out.relative_to(ROOT))
        entry["result"] = json.loads(out.read_text(encoding="utf-8"))
    else:
        entry["stdout_tail"] = stdout.strip().splitlines()[-25:]
    entry["headline"] = headline(script.name, entry)
    if rc == 0:
        record(script, quick, results, cmd[1:], entry)
    return entry


def record(script: Script, quick: bool, results: Path, argv: Sequence[str], entry: Mapping[str, Any]) -> None:
    """Leave the run in a result file that says when, where and how it ran, as docs/benchmarks.md
    needs: a script's JSON without that envelope is wrapped in one, and a script that writes no
    JSON gets a file holding its printed output."""
    path = results / f"{script.name}{'.quick' if quick else ''}.json"
    result = entry.get("result")
    if isinstance(result, Mapping) and {"date", "command", "machine", "results"} <= result.keys():
        return
    body = result if result is not None else {"output": list(entry.get("stdout_tail", []))}
    write_json(path, script.name, envelope(script.name, argv, body))


SKIPPED = "skipped: the --quick budget is spent"


def previous_runs(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of the summary at ``path``, each with the date it ran (the summary's own where a
    row carries none); none where there is no summary yet."""
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text(encoding="utf-8"))
    rows = doc.get("results") if isinstance(doc, Mapping) else None
    if not isinstance(rows, Mapping):
        return {}
    return {name: {"date": doc.get("date"), **row} for name, row in rows.items() if isinstance(row, Mapping)}


def merge_runs(previous: Mapping[str, dict[str, Any]], runs: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The summary's rows after a run of some scripts: theirs replaced (unless the budget skipped
    one), every other script's kept; in the order of SCRIPTS, then any row no script names now."""
    rows = dict(previous)
    rows.update({name: run for name, run in runs.items() if run.get("headline") != SKIPPED or name not in rows})
    order = {s.name: i for i, s in enumerate(SCRIPTS)}
    return dict(sorted(rows.items(), key=lambda item: order.get(item[0], len(order))))


def _overhead(r: Mapping[str, Any]) -> str:
    modes, tp = r["modes"], r["hit_throughput"]
    parts = [
        f"{m} p50 {fmt(modes[m]['median']['p50'])} ms ({modes[m]['p50_over_direct_ms']:+.1f})"
        for m in ("miss", "miss_raced", "hit_exact", "hit_paraphrase", "hit_verified", "half_hit", "bypass")
        if m in modes
    ]
    parts.append("hits/s " + "/".join(f"{fmt(v['requests_per_s'], 0)}@{c}" for c, v in tp.items()))
    judged = r.get("judged", {})
    if "hit_judged" in judged:
        hit = judged["hit_judged"]
        parts.append(
            f"judged hit p50 {fmt(hit['p50'])} ms: {fmt(hit['p50_less_judge_ms'])} over the "
            f"{judged['judge_ms']:g} ms judge, {fmt(hit['p50_less_judge_direct_ms'])} over it asked straight "
            f"(p50 {fmt(judged['judge_direct']['p50'])}); target {hit['target_ms']:g}"
        )
    for row in ("refused_slow", "refused_fast"):
        if row in judged:
            parts.append(f"{row} waits {judged[row]['extra_wait_ms']:+.1f} ms over a plain miss")
    return f"direct p50 {fmt(modes['direct']['median']['p50'])} ms; " + "; ".join(parts)


def _gptcache(r: Mapping[str, Any]) -> str:
    parts = []
    sp = r.get("speed")
    if sp:
        ratio = sp["ours_over_gptcache_p50"]
        parts.append(f"hit p50 ours/GPTCache exact {ratio['hit_exact']:.2f}, paraphrase {ratio['hit_paraphrase']:.2f}")
        parts.append(
            "hits/s ours/GPTCache " + ", ".join(f"{v:.1f}x@{c}" for c, v in sp["ours_over_gptcache_throughput"].items())
        )
    q = r.get("quality")
    if q:
        ours = q["smartcache"]
        parts.append(
            f"traces: ours {ours['correct_hits']} correct / {ours['false_hits_conversations']} false"
            f" (recall {ours['recall_vs_tenant_reusable']:.3f})"
        )
        for name, v in q["gptcache"].items():
            recall = v["recall_vs_tenant_reusable"]
            parts.append(f"GPTCache {name} {v['correct_hits']}/{v['false_hits_conversations']} ({recall:.3f})")
    return "; ".join(parts)


def _upstream_client(r: Mapping[str, Any]) -> str:
    return "; ".join(
        f"{kind} CPU ms/call httpx {fmt(r[f'httpx/{kind}']['cpu_ms'], 2)}"
        f" vs aiohttp {fmt(r[f'aiohttp/{kind}']['cpu_ms'], 2)}"
        for kind in ("json", "stream")
    )


def _long_history(r: Mapping[str, Any]) -> str:
    return "p50 over direct, first seen / next turn, by earlier turns: " + "; ".join(
        f"{n}: +{fmt(v['median']['first_p50_over_direct_ms'], 0)}"
        f" / +{fmt(v['median']['next_p50_over_direct_ms'], 0)} ms"
        for n, v in r["lengths"].items()
    )


def _view_length(r: Mapping[str, Any]) -> str:
    return "one model call by view tokens: " + "; ".join(
        f"{pack} " + ", ".join(f"{v['tokens']}: {fmt(v['ms'])} ms" for v in lengths.values())
        for pack, lengths in r["packs"].items()
    )


NEVER_CACHE_SETS = ("hand-written/single", "hand-written/follow-up", "held-out/single", "held-out/follow-up")


def _never_cache(r: Mapping[str, Any]) -> str:
    def cells(lang: str, figure: str) -> str:
        return " / ".join(fmt(r[lang][s][figure], 3) for s in NEVER_CACHE_SETS)

    return "hand-written single / follow-up, held-out single / follow-up: " + "; ".join(
        f"{lang} recall {cells(lang, 'recall')}, false-bypass rate {cells(lang, 'false_bypass_rate')}"
        for lang in ("en", "zh")
        if lang in r
    )


def _intent(r: Mapping[str, Any]) -> str:
    def precision(name: str) -> str:
        rows = r[f"per_intent ({name})"].items()
        return ", ".join(f"{i} {fmt(v['precision'], 2)}" for i, v in rows if v["precision"] is not None)

    parts = [
        f"{name} accuracy {fmt(r['sets'][name]['accuracy'], 3)}, precision {precision(name)}"
        for name in ("shared", "hand-written")
    ]
    if "dev_traces" in r:
        d = r["dev_traces"]
        rates = ", ".join(f"{c} {fmt(v['never_cached_rate'], 3)}" for c, v in r["dev_traces by category"].items())
        parts.append(
            f"dev traces never-cached {rates}; no_hit caught {d['no_hit_read_as_never_cached']}/{d['no_hit_turns']}"
        )
    return "; ".join(parts)


def _filters(r: Mapping[str, Any]) -> str:
    p, f, j = r["pairs"], r["pairs thrown out, by filter"], r["judge would be asked"]
    passed = "passed every hard filter"
    thrown = ", ".join(
        f"{name} {row['true']}/{row['false']}"
        for name, row in f.items()
        if name != passed and (row["true"] or row["false"])
    )
    return (
        f"of {p['true']} true / {p['false']} false pairs, thrown out by {thrown}; {passed}"
        f" {f[passed]['true']}/{f[passed]['false']}; the judge would be asked {j['true']}/{j['false']}"
    )


def _agreement(r: Mapping[str, Any]) -> str:
    def share(row: Mapping[str, Any], verdict: str) -> str:
        return f"{row[f'{verdict}_rate']:.1%}" if row["pairs"] else "-"

    parts = []
    for lang, row in r["languages"].items():
        near, same = row["near_miss_pairs"], row["same_question_pairs"]
        parts.append(
            f"{lang} near-miss pairs agreed {near['agree']}/{near['pairs']}"
            f" (upper 95 % {near['false_agree_upper95']:.1%});"
            f" same-question pairs agree {share(same, 'agree')}, unsure {share(same, 'unsure')},"
            f" disagree {share(same, 'disagree')}"
        )
    return "; ".join(parts)


def _verifier(r: Mapping[str, Any]) -> str:
    parts = []
    for name, row in r["sets"].items():
        models = row["models"]
        shipped = next(k for k in models if k.startswith("verifier"))
        cells = [f"{k.split()[0]} {fmt(models[k]['auc'], 3)}" for k in models if k != shipped]
        parts.append(
            f"{name} AUC verifier {fmt(models[shipped]['auc'], 3)} (R@P99 {fmt(models[shipped]['r@p99'], 2)}) vs "
            + ", ".join(cells)
        )
    return "; ".join(parts)


def _domains(r: Mapping[str, Any]) -> str:
    rows = {system: v["all"] for system, v in r["systems"].items()}
    return f"{r['requests_per_system']} requests a system; " + "; ".join(
        f"{system} hits {v['hit_rate']:.1%} ({v['false_hits']} false), mean {fmt(v['mean_ms'], 0)} ms, "
        f"p95 {fmt(v['p95_ms'], 0)} ms, saved {v['saved_tokens']} tokens"
        for system, v in rows.items()
    )


def _router(r: Mapping[str, Any]) -> str:
    def share(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    return f"{r['conversations']} conversations x {r['turns']} turns, {r['engines']} engines; " + "; ".join(
        f"{mode} history reused {share(v['history_reused'])}, p95 {fmt(v['p95_ms'], 0)} ms, "
        f"{fmt(v['requests_per_s'], 2)} req/s, {v['client_errors']} client errors, {v['retried']} retried"
        for mode, v in r["modes"].items()
    )


HEADLINES: Mapping[str, Callable[[Mapping[str, Any]], str]] = {
    "bench_overhead": _overhead,
    "bench_gptcache": _gptcache,
    "bench_upstream_client": _upstream_client,
    "bench_long_history": _long_history,
    "bench_view_length": _view_length,
    "bench_never_cache": _never_cache,
    "bench_intent": _intent,
    "bench_filters": _filters,
    "bench_verifier": _verifier,
    "bench_agreement": _agreement,
    "bench_domains": _domains,
    "bench_router": _router,
}


def headline(name: str, entry: Mapping[str, Any]) -> str:
    if entry["rc"] != 0:
        return f"failed (rc {entry['rc']})"
    result = entry.get("result")
    if result is not None and name in HEADLINES:
        try:
            return HEADLINES[name](result.get("results", result))
        except (KeyError, TypeError, ZeroDivisionError, StopIteration) as exc:
            return f"(no headline: {exc!r})"
    tail = entry.get("stdout_tail") or ([] if result is None else [json.dumps(result)[:300]])
    return " | ".join(line.strip() for line in tail[-3:])[:400]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="every script shrunk: <= 10 minutes in all")
    ap.add_argument("--only", nargs="+", help="script names (bench_overhead ...)")
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/summary.json")
    ap.add_argument("--docs", action="store_true", help="only render docs/benchmarks.md from benchmarks/results/")
    args = ap.parse_args(argv)
    if args.docs:
        print(f"wrote {write_page(RESULTS, DOCS_PAGE, HERE)}")
        return 0
    console = Console(width=160)
    RESULTS.mkdir(parents=True, exist_ok=True)
    chosen = [s for s in SCRIPTS if s.path.is_file() and (not args.only or s.name in args.only)]
    t0 = time.monotonic()
    runs: dict[str, dict[str, Any]] = {}
    for script in chosen:
        left = QUICK_BUDGET_S - (time.monotonic() - t0) if args.quick else TIMEOUT_S[False]
        if left < 60:
            runs[script.name] = {
                "command": "-",
                "rc": 0,
                "wall_s": 0.0,
                "headline": SKIPPED,
            }
            continue
        runs[script.name] = run_one(script, args.quick, RESULTS, console, min(TIMEOUT_S[args.quick], left))
    total = time.monotonic() - t0
    rows = merge_runs(previous_runs(args.json or RESULTS / "summary.json"), runs) if args.only else runs
    summary = envelope("run_all", ["benchmarks/run_all.py", *(argv if argv is not None else sys.argv[1:])], rows)
    summary["wall_s"] = round(total, 1)
    path = write_json(args.json, "summary", summary)
    m = summary["machine"]
    table = Table(
        title=(
            f"{summary['date']} · {m['cores']} cores, {m['cpu']} · load {m['loadavg_1m']} at the end"
            f" · {summary['command']} · {total / 60:.1f} min"
        )
    )
    for col in ("benchmark", "rc", "wall s", "headline"):
        table.add_column(col, overflow="fold")
    for name, run in rows.items():
        table.add_row(name, "-" if run["rc"] is None else str(run["rc"]), f"{run['wall_s']:.0f}", run["headline"])
    console.print(table)
    console.print(f"wrote {path} and {write_page(RESULTS, DOCS_PAGE, HERE)}")
    return 0 if all(run["rc"] in (0, None) for run in runs.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
