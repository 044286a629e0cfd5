"""One RL job in one process, across two torchrun processes and on one or two Ray rollout
workers: seconds per step, same result.

Runs `toolpolicy train` from a shipped SFT checkpoint five ways, one after the other, with
episode sampling streams (so every run samples the same episodes): one process with all
the machine's threads, one process with one thread, `torchrun --nproc-per-node 2` with one
thread each, and rollouts on 1 and on 2 Ray actors of one thread each (a local cluster the
run starts; the update runs on the driver with one thread). Reads each run's metrics.jsonl:
seconds per step (median after the first) split into rollout and update, and whether the
rewards agree step for step.

    .venv/bin/python bench/ddp.py [--env calc|hotel] [--steps 8] [--threads 2]

Writes bench/results/ddp_<env>.json. On a machine with two cores the processes and actors
share them with each other, so this measures the split of the work, not more hardware.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rl_jobs import JOBS, ROOT, train  # bench/ is on the path of a script run from it
from result_file import write_result


def run(env: str, processes: int, threads: int, steps: int, work: Path, ray_workers: int = 0) -> dict:
    overrides = {"rl.steps": steps, "rl.sampling_streams": "episode", "rl.ray_workers": ray_workers}
    every = train(env, work / f"{env}-{processes}x{threads}-ray{ray_workers}", threads, overrides, processes)
    rl = every[1:]
    return {
        "processes": processes,
        "ray_rollout_workers": ray_workers,
        "threads_each": threads,
        "seconds_per_step": statistics.median(r["time/step"] for r in rl),
        "rollout_seconds": statistics.median(r["time/rollout"] for r in rl),
        "update_seconds": statistics.median(r["time/step"] - r["time/rollout"] for r in rl),
        "reward": [r.get("reward") for r in every],
        "loss": [r.get("loss") for r in every],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", choices=sorted(JOBS), default="calc")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="threads of the one-process run (the machine's cores)")
    parser.add_argument("--work", default="/tmp/bench-ddp")
    args = parser.parse_args()
    work = Path(args.work)
    runs = {
        f"1 process x {args.threads} threads": run(args.env, 1, args.threads, args.steps, work),
        "1 process x 1 thread": run(args.env, 1, 1, args.steps, work),
        "2 processes x 1 thread": run(args.env, 2, 1, args.steps, work),
        "Ray, 1 rollout worker x 1 thread": run(args.env, 1, 1, args.steps, work, ray_workers=1),
        "Ray, 2 rollout workers x 1 thread": run(args.env, 1, 1, args.steps, work, ray_workers=2),
    }
    rewards = [r["reward"] for r in runs.values()]
    reference = runs["1 process x 1 thread"]["loss"]
    summary = {
        "same_rewards_every_step": all(r == rewards[0] for r in rewards),
        "max_loss_gap": max(
            abs(a - b) for r in runs.values() for a, b in zip(r["loss"], reference) if a is not None and b is not None
        ),
        **{name: r["seconds_per_step"] for name, r in runs.items()},
    }
    out = ROOT / "bench" / "results" / f"ddp_{args.env}.json"
    write_result(out, {"env": args.env, "steps": args.steps, "summary": summary, "runs": runs})
    for name, r in runs.items():
        print(f"{name}: {r['seconds_per_step']:.2f} s/step (rollout {r['rollout_seconds']:.2f}, update {r['update_seconds']:.2f})")
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
