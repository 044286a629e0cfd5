"""What keeping every RL step's rollouts costs: bytes per 1,000 tokens and write time per step.

    python bench/rollout_store.py [--job hotel|calc] [--steps 3]

Runs a few RL steps of the job from its shipped SFT checkpoint with the store on, then
reads the run back: Parquet bytes per 1,000 stored tokens (every token id with its mask,
and per sampled token the sampler's and the trainer's log-probs and the advantage), the
same rows as plain JSON lines for comparison, and the `time/store` each step logged
against its `time/step`. Writes bench/results/rollout_store_JOB.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

from rl_jobs import JOBS, ROOT
from toolpolicy.cli import main as toolpolicy
from toolpolicy.rollout.store import step_file, stored_steps

from result_file import write_result  # bench/ is on the path of a script run from it


def measure(run_dir: Path) -> dict:
    folder = run_dir / "rl" / "rollouts"
    steps = stored_steps(folder)
    parquet = sum(step_file(folder, s).stat().st_size for s in steps)
    rows = [row for s in steps for row in pq.read_table(step_file(folder, s)).to_pylist()]
    tokens = sum(len(row["token_ids"]) for row in rows)
    sampled = sum(len(row["sampled_logprobs"]) for row in rows)
    as_json = sum(len(json.dumps(row, default=str)) + 1 for row in rows)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [m for m in metrics if m["phase"] == "rl"]
    return {
        "steps": len(steps), "episodes": len(rows), "tokens": tokens, "sampled_tokens": sampled,
        "parquet_bytes": parquet, "json_bytes": as_json,
        "parquet_bytes_per_1000_tokens": round(1000 * parquet / tokens, 1),
        "json_bytes_per_1000_tokens": round(1000 * as_json / tokens, 1),
        "store_seconds_per_step": [round(m["time/store"], 4) for m in rl],
        "store_seconds_median": round(statistics.median(m["time/store"] for m in rl), 4),
        "step_seconds_median": round(statistics.median(m["time/step"] for m in rl), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", choices=sorted(JOBS), default="hotel")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    config, checkpoint = JOBS[args.job]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        code = toolpolicy([
            "train", str(config), "--set", f"run.dir={run_dir}", "--set", f"rl.init_from={checkpoint}",
            "--set", f"rl.steps={args.steps}", "--set", "rl.store_rollouts=true",
        ])
        if code:
            sys.exit(code)
        result = {"job": args.job, **measure(run_dir)}
    out = ROOT / "bench" / "results" / f"rollout_store_{args.job}.json"
    write_result(out, result)
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
