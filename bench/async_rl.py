"""Async RL: the same job with max_staleness 0, 1 and 2: seconds per step and the learning curve.

Runs `toolpolicy train` from a shipped SFT checkpoint once per staleness bound, one after
the other, same seed, threads and steps. With k > 0 the first rollout round of step t + k
is sampled by a copy of the policy in a thread while step t trains. Reads each run's
metrics.jsonl: seconds per step (median after the first), the time a step waited for its
rollouts, and reward per step.

    .venv/bin/python bench/async_rl.py [--env calc|hotel] [--steps 20] [--threads 2]

Writes bench/results/async_rl_<env>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rl_jobs import JOBS, ROOT, train  # bench/ is on the path of a script run from it
from result_file import write_result


def run(env: str, staleness: int, steps: int, threads: int, work: Path) -> dict:
    overrides = {"rl.steps": steps, "rl.sampling_streams": "episode", "rl.max_staleness": staleness}
    rows = train(env, work / f"{env}-k{staleness}", threads, overrides)
    return {
        "max_staleness": staleness,
        "seconds_per_step": statistics.median(r["time/step"] for r in rows[1:]),
        "waiting_for_rollouts": statistics.median(r["time/rollout"] for r in rows[1:]),
        "staleness": [r["staleness"] for r in rows],
        "reward": [r.get("reward") for r in rows],
        "accuracy": [r.get("accuracy") for r in rows],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", choices=sorted(JOBS), default="calc")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default="/tmp/bench-async")
    args = parser.parse_args()
    runs = {f"k={k}": run(args.env, k, args.steps, args.threads, Path(args.work)) for k in (0, 1, 2)}
    half = args.steps // 2
    summary = {
        name: {
            "seconds_per_step": r["seconds_per_step"],
            "waiting_for_rollouts": r["waiting_for_rollouts"],
            "reward_first_half": statistics.mean(x for x in r["reward"][:half] if x is not None),
            "reward_second_half": statistics.mean(x for x in r["reward"][half:] if x is not None),
        }
        for name, r in runs.items()
    }
    out = ROOT / "bench" / "results" / f"async_rl_{args.env}.json"
    write_result(out, {"env": args.env, "steps": args.steps, "threads": args.threads, "summary": summary, "runs": runs})
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
