"""What the reordered-words guard (proxy.core.text.lexical.reordered) costs and buys on labelled
Chinese pairs: how many paraphrases (label 1) and different questions (label 0) each of its
tests flags. A flagged pair becomes a half-hit (answered upstream, never served from the cache),
so a flagged paraphrase costs a hit and a flagged different question saves a wrong answer. The
numbers column is the test for the same numbers in another order (lexical.numbers_reordered).

Reads ../shared/data/zh_pairs (LCQMC, BQ, ATEC valid splits; none of them is used by the replay
harness's traces).

    .venv/bin/python benchmarks/bench_reorder_guard.py [--data ../shared/data] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from proxy.core.text.lexical import numbers_reordered, reordered, spans_swapped, tokens, transposed
from proxy.core.text.normalize import normalize_text

SETS = ("lcqmc", "bq", "atec")


def rows(path: Path, limit: int | None) -> list[tuple[str, str, str]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[-1] in ("0", "1"):
            out.append((parts[0], parts[1], parts[-1]))
    return out[:limit] if limit else out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--limit", type=int, default=None, help="pairs per set (default: all)")
    parser.add_argument("--quick", action="store_true", help="2,000 pairs per set")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    limit = 2000 if args.quick and not args.limit else args.limit
    table = []
    t0 = time.perf_counter()
    for name in SETS:
        pairs = rows(args.data / "zh_pairs" / f"{name}.valid.tsv", limit)
        labels: Counter[str] = Counter()
        exchanged: Counter[str] = Counter()
        turned: Counter[str] = Counter()
        spans: Counter[str] = Counter()
        guard: Counter[str] = Counter()
        for a, b, label in pairs:
            na, nb = normalize_text(a), normalize_text(b)
            labels[label] += 1
            exchanged[label] += transposed(tokens(na), tokens(nb))
            turned[label] += numbers_reordered(na, nb)
            spans[label] += spans_swapped(na, nb)
            guard[label] += reordered(na, nb)
        table.append(
            {
                "set": name,
                "pairs": len(pairs),
                "paraphrases": labels["1"],
                "different": labels["0"],
                "exchange_flags_paraphrase": exchanged["1"],
                "exchange_flags_different": exchanged["0"],
                "numbers_flags_paraphrase": turned["1"],
                "numbers_flags_different": turned["0"],
                "spans_flags_paraphrase": spans["1"],
                "spans_flags_different": spans["0"],
                "guard_flags_paraphrase": guard["1"],
                "guard_flags_different": guard["0"],
            }
        )
    print(
        "| set | pairs (1 / 0) | one exchange: flags 1 / 0 | numbers turned around: flags 1 / 0 "
        "| two spans exchanged: flags 1 / 0 | whole guard: flags 1 / 0 | share of flagged that differ |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in table:
        flagged = r["guard_flags_paraphrase"] + r["guard_flags_different"]
        share = r["guard_flags_different"] / flagged if flagged else 0.0
        print(
            f"| {r['set']} | {r['pairs']} ({r['paraphrases']} / {r['different']}) "
            f"| {r['exchange_flags_paraphrase']} / {r['exchange_flags_different']} "
            f"| {r['numbers_flags_paraphrase']} / {r['numbers_flags_different']} "
            f"| {r['spans_flags_paraphrase']} / {r['spans_flags_different']} "
            f"| {r['guard_flags_paraphrase']} / {r['guard_flags_different']} | {share:.3f} |"
        )
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
