"""The same RL job sampled by the hf backend, by vLLM in process and by a vLLM rollout
server: learning curves and seconds per step.

Runs `toolpolicy train` from a shipped SFT checkpoint once per backend (each in its own
process, one after the other, same seed, threads and steps), then reads each run's
metrics.jsonl: reward and accuracy per step, the sampler/trainer mismatch, and seconds
per step (median after the first step, which includes vLLM's start). For `endpoint` the
script first starts `toolpolicy rollout-server` on the same checkpoint (its start is not
in the run's time) and stops it after. The vLLM runs draw different samples than hf
(vLLM has its own generator), so the curves agree within noise, not exactly.

    .venv/bin/python bench/backend_rl.py [--env calc|hotel] [--steps 30] [--threads 2] [--backends hf,vllm,endpoint]

Writes bench/results/backend_rl_<env>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rl_jobs import JOBS, ROOT, train  # bench/ is on the path of a script run from it


@contextlib.contextmanager
def rollout_server(checkpoint: Path, threads: int, port: int = 8765) -> Iterator[str]:
    """A rollout server on `checkpoint` while the block runs: its URL."""
    argv = [sys.executable, "-m", "toolpolicy", "rollout-server", str(checkpoint), "--port", str(port), "--threads", str(threads)]
    server = subprocess.Popen(argv, start_new_session=True)
    try:
        for _ in range(600):
            if server.poll() is not None:
                raise RuntimeError(f"the rollout server exited with {server.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)


def run(env: str, backend: str, steps: int, threads: int, work: Path) -> dict:
    overrides = {"backend": backend, "rl_steps": steps}
    began = time.perf_counter()
    if backend == "endpoint":
        with rollout_server(JOBS[env][1], threads) as url:
            began = time.perf_counter()
            rl = train(env, work / f"{env}-{backend}", threads, {**overrides, "rollout_url": url})
    else:
        rl = train(env, work / f"{env}-{backend}", threads, {**overrides, "vllm_threads": threads})
    wall = time.perf_counter() - began
    return {
        "wall_seconds": wall,
        "seconds_per_step": statistics.median(r["time/step"] for r in rl[1:]),
        "first_step_seconds": rl[0]["time/step"],
        "reward": [r.get("reward") for r in rl],
        "accuracy": [r.get("accuracy") for r in rl],
        "mismatch_abs_max": max(r.get("mismatch/abs_max", 0.0) for r in rl),
        "mismatch_kl_mean": statistics.mean(r.get("mismatch/kl", 0.0) for r in rl),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", choices=sorted(JOBS), default="calc")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backends", default="hf,vllm,endpoint")
    parser.add_argument("--work", default="/tmp/bench-backend-rl")
    args = parser.parse_args()
    backends = args.backends.split(",")
    results = {backend: run(args.env, backend, args.steps, args.threads, Path(args.work)) for backend in backends}
    half = args.steps // 2
    summary = {
        backend: {
            "seconds_per_step": r["seconds_per_step"],
            "reward_first_half": statistics.mean(x for x in r["reward"][:half] if x is not None),
            "reward_second_half": statistics.mean(x for x in r["reward"][half:] if x is not None),
            "accuracy_second_half": statistics.mean(x for x in r["accuracy"][half:] if x is not None),
        }
        for backend, r in results.items()
    }
    out = ROOT / "bench" / "results" / f"backend_rl_{args.env}.json"
    out.write_text(json.dumps({"env": args.env, "steps": args.steps, "threads": args.threads, "summary": summary,
                               "runs": results}, indent=2) + "\n")
    for backend, s in summary.items():
        print(f"{backend:5s} {s['seconds_per_step']:6.2f} s/step  reward {s['reward_first_half']:.3f} -> "
              f"{s['reward_second_half']:.3f}  accuracy (2nd half) {s['accuracy_second_half']:.3f}")
    for backend in set(summary) - {"hf"} if "hf" in summary else ():
        print(f"{backend}/hf s/step: {summary[backend]['seconds_per_step'] / summary['hf']['seconds_per_step']:.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
