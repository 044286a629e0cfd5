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
                                         [--init-from CHECKPOINT --tag NAME] [--set KEY=VALUE ...]

Writes bench/results/backend_rl_<env>[_<tag>].json. `--init-from` starts RL from another
checkpoint than the shipped one, e.g. the 25.4M-parameter calc model (8 layers, width 512)
that a short SFT of the demo config builds (27 minutes on one thread here; 100 MB, too
large to ship):

    toolpolicy sft src/toolpolicy/configs/demo.yaml --set run.dir=runs/calc-sft-25m \
        --set embedded.hidden_size=512 --set embedded.layers=8 --set embedded.heads=8 --set embedded.kv_heads=4 \
        --set embedded.intermediate_size=1536 --set sft.steps=200 --set sft.batch_size=8 \
        --set sft.lr=0.0006 --set run.threads=1
    .venv/bin/python bench/backend_rl.py --init-from runs/calc-sft-25m/sft/final --tag 25m --backends hf,vllm \
        --steps 12 --set rl.prompts_per_step=6
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

from safetensors import safe_open

from toolpolicy.rollout.vllm_server import ServerProcess

from rl_jobs import JOBS, ROOT, train  # bench/ is on the path of a script run from it
from result_file import write_result


def parameter_count(checkpoint: Path) -> int:
    """Parameters of the model saved in `checkpoint` (a tied lm_head is not saved, so counts once)."""
    with safe_open(checkpoint / "model.safetensors", "pt") as weights:
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())


def run(env: str, backend: str, steps: int, threads: int, work: Path, checkpoint: Path, settings: dict[str, str]) -> dict:
    overrides = {**settings, "rl.steps": steps, "rl.init_from": checkpoint}
    began = time.perf_counter()
    if backend == "endpoint":  # the rollout server: config backend `server`
        with ServerProcess(checkpoint, 8765, ["--threads", str(threads)]) as server:
            url = server.wait()
            began = time.perf_counter()
            rl = train(env, work / f"{env}-{backend}", threads, {**overrides, "backend": "server", "backend.url": url})
    else:
        own = {"backend.threads": threads} if backend == "vllm" else {}
        rl = train(env, work / f"{env}-{backend}", threads, {**overrides, "backend": backend, **own})
    wall = time.perf_counter() - began
    return {
        "wall_seconds": wall,
        "seconds_per_step": statistics.median(r["time/step"] for r in rl[1:]),
        "first_step_seconds": rl[0]["time/step"],
        # rollout time per sampled token, steps after the first: fair when the runs' answers differ in length
        "rollout_ms_per_decoded_token": 1000 * sum(r["time/rollout"] for r in rl[1:]) / sum(r["tokens/decode"] for r in rl[1:]),
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
    parser.add_argument("--init-from", type=Path, help="the checkpoint RL starts from (default: the env's shipped SFT model)")
    parser.add_argument("--tag", default="", help="a suffix of the result file's name")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override of every run")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.set)
    backends = args.backends.split(",")
    checkpoint = (args.init_from or JOBS[args.env][1]).resolve()
    work = Path(args.work) / (args.tag or "shipped")
    results = {backend: run(args.env, backend, args.steps, args.threads, work, checkpoint, settings) for backend in backends}
    half = args.steps // 2
    summary = {
        backend: {
            "seconds_per_step": r["seconds_per_step"],
            "rollout_ms_per_decoded_token": r["rollout_ms_per_decoded_token"],
            "reward_first_half": statistics.mean(x for x in r["reward"][:half] if x is not None),
            "reward_second_half": statistics.mean(x for x in r["reward"][half:] if x is not None),
            "accuracy_second_half": statistics.mean(x for x in r["accuracy"][half:] if x is not None),
        }
        for backend, r in results.items()
    }
    out = ROOT / "bench" / "results" / f"backend_rl_{args.env}{'_' + args.tag if args.tag else ''}.json"
    write_result(out, {"env": args.env, "checkpoint": str(checkpoint.relative_to(ROOT) if checkpoint.is_relative_to(ROOT) else checkpoint),
                       "parameters": parameter_count(checkpoint), "settings": settings, "steps": args.steps, "threads": args.threads, "summary": summary,
                       "runs": results})
    for backend, s in summary.items():
        print(f"{backend:5s} {s['seconds_per_step']:6.2f} s/step  reward {s['reward_first_half']:.3f} -> "
              f"{s['reward_second_half']:.3f}  accuracy (2nd half) {s['accuracy_second_half']:.3f}")
    for backend in set(summary) - {"hf"} if "hf" in summary else ():
        print(f"{backend}/hf s/step: {summary[backend]['seconds_per_step'] / summary['hf']['seconds_per_step']:.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
