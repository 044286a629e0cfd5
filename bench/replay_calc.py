"""Success replay against GRPO on calc: the same RL from checkpoints/calc-sft on a fixed pool of
train tasks, with and without `algorithm.replay`, over several seeds.

    .venv/bin/python bench/replay_calc.py [--seeds 0 1 2] [--steps 60] [--pool 48] [--threads 2]
        [--work runs/replay-calc] [--out bench/results/replay_calc.json]

Each run is demo.yaml's GRPO (12 tasks x 8 samples a step) with `rl.task_pool` tasks coming
back as epochs do, so a task solved once can be replayed when its group later fails. Both arms
sample the same number of episodes a step (a replayed success takes the place of a sampled
failure, which is still sampled), so they are compared at equal steps; the sampled tokens of
each run are in the file. Held-out accuracy: EVAL_TASKS eval tasks x EVAL_SAMPLES samples of
each final model (distill_calc's evaluation, cached); the mean over seeds with a 95% t
interval. Runs and evaluations already done are not run again.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from distill_calc import ROOT, accuracy, rl_rows, rl_run  # bench/ is on the path of a script run from it
from result_file import write_result
from seed_interval import interval

START = ROOT / "checkpoints" / "calc-sft"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "replay-calc")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "replay_calc.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--pool", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    arms = {"grpo": {}, "replay": {"algorithm.replay": True}}
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    start_accuracy = accuracy(args.work, "calc-sft", START, {}, args.threads)
    for seed in args.seeds:
        for arm, settings in arms.items():
            name = f"{arm}-seed{seed}"
            run = rl_run(args.work, name, START, args.steps, {"run.seed": seed, "rl.task_pool": args.pool, **settings}, args.threads)
            final = args.work / name / "rl" / "final"
            run.update({"seed": seed, "held_out": accuracy(args.work, name, final, {}, args.threads)})
            rows = rl_rows(args.work / name)
            run["replayed_episodes"] = sum(r.get("replayed_episodes", 0) for r in rows)
            run["signal_groups"] = sum(r["signal_groups"] for r in rows)
            runs[arm].append(run)
            print(f"{name}: held-out {run['held_out']:.3f}, replayed {run['replayed_episodes']}, {run['wall_seconds']:.0f} s", flush=True)
    summary = {arm: interval([r["held_out"] for r in done]) for arm, done in runs.items()}
    write_result(args.out, {
        "config": "src/toolpolicy/configs/demo.yaml", "start": str(START.relative_to(ROOT)), "start_held_out": start_accuracy,
        "steps": args.steps, "task_pool": args.pool, "seeds": args.seeds, "held_out": summary, "runs": runs,
    })
    print(summary)


if __name__ == "__main__":
    main()
