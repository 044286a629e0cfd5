"""BFCL scores of several runs of one model side by side, with paired intervals between them.

    python bench/bfcl_compare.py --out bench/results/bfcl_smollm2.json \\
        base=runs/smollm2-bfcl-base/eval/bfcl_v4_results.jsonl sft=runs/smollm2-bfcl/eval/bfcl_v4_results.jsonl

Each NAME=FILE is the per-entry results file `toolpolicy eval CONFIG --bfcl v4` writes. The
output holds, per run, the accuracy of each category and BFCL's summaries (`bfcl_scores`:
the official checker's verdict, through the matcher that agrees with it on every case
tried), and for each run after the first the paired bootstrap 95% interval of its
accuracy minus the previous run's (with `--baseline NAME`: minus that run's; with
`--pairs BEFORE:AFTER,...`: those differences only), over the entries both scored and (as
"calls") over those of them that expect calls (every category but the irrelevance ones).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from result_file import write_result  # bench/ is on the path of a script run from it

from toolpolicy.eval.bfcl import summarize_bfcl
from toolpolicy.eval.bfcl_v4 import HALLUCINATION, bfcl_scores
from toolpolicy.eval.metrics import paired_bootstrap
from toolpolicy.jsonl import read_objects


def scores(rows: list[dict]) -> dict:
    summary = summarize_bfcl(rows)
    by_category = {name: {"n": row["n"], "accuracy": row["accuracy"]} for name, row in summary["by_category"].items()}
    return {"n": summary["n"], "accuracy": summary["accuracy"], "by_category": by_category, "bfcl": bfcl_scores(summary["by_category"])}


def entry_rows(file: str | Path) -> dict[str, dict]:
    """A per-entry results file of `toolpolicy eval --bfcl` with one answer an entry, its rows by entry id."""
    samples = sample_rows(file)
    if len(samples) > 1:
        raise ValueError(f"{file}: {len(samples)} answers an entry; compare files of one (bench/bfcl_pass_at_k.py reads these)")
    return samples[0]


def sample_rows(file: str | Path) -> list[dict[str, dict]]:
    """A results file of `toolpolicy eval --bfcl`, its rows by entry id, one dict per sample index
    (files written before rows carried one hold sample 0)."""
    samples: list[dict[str, dict]] = []
    for _, row in read_objects(Path(file), ValueError):
        index = row.get("sample", 0)
        samples.extend({} for _ in range(index + 1 - len(samples)))
        samples[index][row["id"]] = row
    if not samples:
        raise ValueError(f"{file}: no rows")
    return samples


def expects_calls(row: dict) -> bool:
    """Whether the entry of a results row expects calls (every category but the irrelevance ones)."""
    return row["category"] not in HALLUCINATION


def difference(runs: dict[str, dict[str, dict]], before: str, after: str, ids: list[str]) -> dict:
    """Paired bootstrap of run `after`'s verdicts minus run `before`'s over the entries `ids`."""
    a, b = ([float(runs[name][i]["ok"]) for i in ids] for name in (before, after))
    return paired_bootstrap(a, b)


def compared(names: list[str], baseline: str | None, pairs: str | None) -> list[tuple[str, str]]:
    """The (before, after) run pairs to difference: `pairs` as written (BEFORE:AFTER,...), else
    every run against `baseline`, else each run against the one before it."""
    if pairs:
        chosen = [tuple(pair.split(":", 1)) for pair in pairs.split(",")]
        unknown = sorted({name for pair in chosen for name in pair} - set(names))
        if unknown or any(len(pair) != 2 for pair in chosen):
            raise ValueError(f"--pairs {pairs}: write BEFORE:AFTER of run names ({', '.join(names)})"
                             + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
        return chosen
    if baseline is not None:
        if baseline not in names:
            raise ValueError(f"--baseline {baseline}: no run of that name (runs: {', '.join(names)})")
        return [(baseline, n) for n in names if n != baseline]
    return list(zip(names, names[1:]))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="NAME=FILE")
    parser.add_argument("--out", required=True)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--baseline", help="compare every other run with this one (default: each with the one before)")
    which.add_argument("--pairs", help="compare these runs only: BEFORE:AFTER,... (sft:rl,sft:distilled)")
    args = parser.parse_args(argv)
    files = dict(r.split("=", 1) for r in args.runs)
    try:
        pairs = compared(list(files), args.baseline, args.pairs)
    except ValueError as error:
        parser.error(str(error))
    runs = {name: entry_rows(file) for name, file in files.items()}
    result: dict = {"runs": {name: scores(list(rows.values())) for name, rows in runs.items()}, "differences": {}}
    for before, after in pairs:
        shared = sorted(set(runs[before]) & set(runs[after]))
        calls = [i for i in shared if expects_calls(runs[after][i])]
        result["differences"][f"{after} - {before}"] = {**difference(runs, before, after, shared), "calls": difference(runs, before, after, calls)}
    write_result(args.out, result)
    for name, run in result["runs"].items():
        print(f"{name:<8} all {run['accuracy'] * 100:5.1f}%  " + "  ".join(f"{c} {r['accuracy'] * 100:.0f}%" for c, r in run["by_category"].items()))
    for pair, d in result["differences"].items():
        for what, e in (("entries", d), ("entries expecting calls", d["calls"])):
            print(f"{pair}: {e['mean'] * 100:+.1f} points, 95% interval [{e['low'] * 100:+.1f}, {e['high'] * 100:+.1f}] over {e['n']} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
