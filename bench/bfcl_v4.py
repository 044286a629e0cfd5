"""BFCL v4 single-turn figures: matcher agreement, a served oracle, and the shipped models.

    python bench/bfcl_v4.py agreement                 # our matcher vs bfcl_eval's ast_checker, every AST entry and mutation
    python bench/bfcl_v4.py oracle                    # every single-turn category through an endpoint that answers the possible answers
    python bench/bfcl_v4.py models --per-category 5   # the shipped checkpoints on the first N entries of each category

Each writes bench/results/bfcl_v4_<part>.json. Needs the bfcl-eval package (`pip install --no-deps bfcl-eval`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODELS = {  # shipped checkpoint: the config it was trained with
    "calc-sft": "src/toolpolicy/configs/smoke.yaml",
    "hotel-sft": "src/toolpolicy/configs/hotel.yaml",
}


def agreement() -> dict:
    from toolpolicy.eval.bfcl_agreement import ASKED_TWICE, INTENDED_ANSWER_REJECTED, compare
    from toolpolicy.eval.bfcl_v4 import AST_CATEGORIES, load_v4

    start = time.perf_counter()
    report = compare(load_v4(AST_CATEGORIES))
    report["seconds"] = round(time.perf_counter() - start, 1)
    report["intended_answer_rejected"] = INTENDED_ANSWER_REJECTED
    report["asked_twice"] = ASKED_TWICE
    print(f"{report['agree']}/{report['cases']} cases agree ({report['agreement'] * 100:.3f}%), {len(report['disagreements'])} disagreements")
    return report


def oracle() -> dict:
    from toolpolicy.cli import main

    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "fixtures" / "chat_server.py")], stdout=subprocess.PIPE, text=True, env={**os.environ, "BFCL_ORACLE": "v4"}
    )
    try:
        port = server.stdout.readline().split()[1]
        with tempfile.TemporaryDirectory() as run_dir:
            settings = [f"run.dir={run_dir}", f"eval.served_url=http://127.0.0.1:{port}/v1", "eval.served_model=bfcl-oracle"]
            start = time.perf_counter()
            assert main(["eval", str(ROOT / MODELS["calc-sft"]), "--bfcl", "v4", *[x for s in settings for x in ("--set", s)]]) == 0
            seconds = time.perf_counter() - start
            summary = json.loads((Path(run_dir) / "eval" / "bfcl_v4.json").read_text())
            results = [json.loads(line) for line in (Path(run_dir) / "eval" / "bfcl_v4_results.jsonl").read_text().splitlines()]
    finally:
        server.kill()
        server.wait()
    summary["seconds"] = round(seconds, 1)
    summary["failed"] = {r["id"]: r["problems"] for r in results if not r["ok"]}
    return summary


def models(per_category: int) -> dict:
    from toolpolicy.build import load_config
    from toolpolicy.eval.bfcl import format_bfcl, score_bfcl
    from toolpolicy.eval.bfcl_v4 import CATEGORIES, bfcl_scores, load_v4

    out = {}
    for name, config in MODELS.items():
        entries = [e for category in CATEGORIES for e in load_v4((category,))[:per_category]]
        cfg = load_config(ROOT / config)
        with tempfile.TemporaryDirectory() as run_dir:
            start = time.perf_counter()
            summary = score_bfcl(cfg, ROOT / "checkpoints" / name, entries, Path(run_dir), name="bfcl_v4", groups=bfcl_scores)
        summary["seconds"] = round(time.perf_counter() - start, 1)
        summary["per_category"] = per_category
        print(format_bfcl(summary))
        out[name] = summary
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("agreement", "oracle", "models"))
    parser.add_argument("--per-category", type=int, default=5, help="models: entries per category (the first N)")
    args = parser.parse_args()
    result = {"agreement": agreement, "oracle": oracle}[args.part]() if args.part != "models" else models(args.per_category)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"bfcl_v4_{args.part}.json"
    write_result(path, result)
    print(f"wrote {path.relative_to(ROOT)}")
