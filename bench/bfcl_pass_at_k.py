"""How often a model is right on BFCL entries when it samples several answers: pass@k and pass^k.

    python bench/bfcl_pass_at_k.py --out bench/results/bfcl_smollm2_pass_at_k.json \\
        sft=s1.jsonl,s2.jsonl,s3.jsonl,s4.jsonl rl=r16.jsonl

Each NAME=FILES is a model's results files: one per sample (`toolpolicy eval CONFIG --bfcl v4
--set eval.temperature=1.0 --set eval.seed=S` with a different seed each), or files of several
answers an entry each (`--trials N`), their samples pooled. Over the
entries every file of the model scored, per k up to the number of answers: pass@k, the chance
that at least one of k answers drawn from an entry's n is right (the unbiased estimator,
`toolpolicy.eval.metrics.pass_at_k`), and pass^k, that all k are (`pass_hat_k`); for all
entries and for those that expect calls; and BFCL's non-live AST summary (`bfcl_scores`) of
each category's pass@k, where the files hold every non-live category. pass@n above pass@1 is
what RL can still reach by making the right answers the model already samples more likely; the
summary of pass@n is that ceiling in the leaderboard's terms (best of n answers per entry, chosen
by the checker).
"""

from __future__ import annotations

import argparse
import sys

from bfcl_compare import expects_calls, sample_rows  # bench/ is on the path of a script run from it
from result_file import write_result

from toolpolicy.eval.bfcl import pass_groups
from toolpolicy.eval.bfcl_v4 import bfcl_scores
from toolpolicy.eval.metrics import pass_rates


def right_counts(samples: list[dict[str, dict]]) -> dict[str, int]:
    """Entry id -> how many of the samples (each a file's rows by id) are right, over the ids all of them hold.

    >>> right_counts([{"a": {"ok": True}, "b": {"ok": False}}, {"a": {"ok": True}, "b": {"ok": True}, "c": {"ok": True}}])
    {'a': 2, 'b': 1}
    """
    shared = sorted(set.intersection(*(set(rows) for rows in samples)))
    return {i: sum(bool(rows[i]["ok"]) for rows in samples) for i in shared}


def non_live_summaries(counts: dict[str, int], categories: dict[str, str], n: int) -> dict[str, float] | None:
    """BFCL's non-live AST summary of each category's pass@k, k = 1..n, from entry id -> right
    count (of `n` samples) and entry id -> category; None without every non-live category.

    >>> non_live_summaries({"s": 1, "j": 0, "js": 0, "m": 0, "p": 0, "pm": 0}, {"s": "simple_python",
    ...     "j": "simple_java", "js": "simple_javascript", "m": "multiple", "p": "parallel", "pm": "parallel_multiple"}, 2)
    {'pass@1': 0.041666666666666664, 'pass@2': 0.08333333333333333}
    """
    found: dict[str, list[int]] = {}
    for entry_id, count in counts.items():
        found.setdefault(categories[entry_id], []).append(count)
    by_category = {c: {"n": len(right), "pass": pass_rates(right, n)} for c, right in found.items()}
    summaries = {k: scores["non_live"] for k, scores in pass_groups(by_category, bfcl_scores).items()}
    return None if summaries["pass@1"] is None else summaries


def model_rates(samples: list[dict[str, dict]]) -> dict:
    counts = right_counts(samples)
    calls = [c for i, c in counts.items() if expects_calls(samples[0][i])]
    n = len(samples)
    categories = {i: samples[0][i]["category"] for i in counts}
    return {"samples": n, "entries": len(counts), "all": pass_rates(list(counts.values()), n),
            "calls": {"entries": len(calls), **pass_rates(calls, n)}, "non_live": non_live_summaries(counts, categories, n)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", metavar="NAME=FILE,FILE,...")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = {}
    for spec in args.models:
        name, files = spec.split("=", 1)
        samples = [rows for f in files.split(",") for rows in sample_rows(f)]
        result[name] = model_rates(samples)
    write_result(args.out, result)
    for name, rates in result.items():
        for what, label in (("all", "all"), ("calls", "calls"), ("non_live", "non-live AST summary")):
            if rates[what]:
                shown = "  ".join(f"{k} {v * 100:.1f}%" for k, v in rates[what].items() if k != "entries")
                print(f"{name:<6} {label:<5} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
