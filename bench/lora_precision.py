"""Full fine-tuning vs LoRA, float32 vs bfloat16, on a 25M-parameter model.

Builds a 25M-parameter Qwen2 (8 layers, width 512) with the calc tokenizer, then runs
the real `toolpolicy sft` command once per variant, each in its own process so that
peak memory is the variant's own: seconds per step (median of the steps after the
first two), peak memory, trainable parameters and optimizer state (both logged by the
trainer). For each precision it also rolls out calc episodes with the KV-cache sampler
and recomputes the sampled tokens' log-probabilities with the trainer's forward: the
gap between the two is what an RL update sees as ratio != 1 at the start.

    .venv/bin/python bench/lora_precision.py [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from transformers import AutoTokenizer

from toolpolicy.config import migrate
from toolpolicy.envs.calc import CalcEnv
from toolpolicy.model import ChatChoice, PolicyModel
from toolpolicy.model.embedded import ModelShape, build_model, parameter_count
from toolpolicy.model.placement import Placement
from toolpolicy.rollout import HFBackend, EpisodeLimits, RolloutEngine
from toolpolicy.trainer.batch import collate, forward_logprobs

from result_file import machine, write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).parent.parent
SHAPE = ModelShape(vocab_size=0, hidden_size=512, layers=8, heads=8, kv_heads=4, intermediate_size=1536)
# (overrides, steps): bfloat16 autocast is 5x (forward) to 25x (backward) slower than float32
# on a CPU without AVX512-BF16/AMX, so its variants run fewer steps.
VARIANTS = {
    "full float32": ({"lora_rank": 0, "dtype": "float32"}, 8),
    "LoRA r16 float32": ({"lora_rank": 16, "dtype": "float32"}, 8),
    "full bfloat16": ({"lora_rank": 0, "dtype": "bfloat16"}, 3),
    "LoRA r16 bfloat16": ({"lora_rank": 16, "dtype": "bfloat16"}, 3),
}


def build_25m(folder: Path) -> int:
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "checkpoints" / "calc-sft")
    model = build_model(tokenizer, SHAPE, seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return parameter_count(model)


def sft_run(model: Path, work: Path, name: str, overrides: dict, steps: int, threads: int) -> dict:
    """One `toolpolicy sft` run of a variant; its per-step metrics summarised (seconds per
    step: the median of the steps after the first)."""
    run_dir = work / name.replace(" ", "-")
    config = {
        "run_dir": str(run_dir), "env": "calc", "model": str(model), "threads": threads, "seed": 0,
        "sft_examples": 256, "sft_steps": steps, "sft_batch_size": 16, "micro_batch_size": 16, "checkpoint_every": 1000,
        **overrides,
    }
    path = work / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(migrate(config)))  # the fields by their flat names, written in sections
    subprocess.run([sys.executable, "-m", "toolpolicy.cli", "sft", str(path)], check=True, capture_output=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "steps": len(rows),
        "s_per_step": statistics.median(r["time/step"] for r in rows[1:]),
        "peak_memory_mb": max(r["memory/peak_mb"] for r in rows),
        "trainable_params": rows[0]["trainable_params"],
        "optimizer_state_mb": rows[-1]["memory/optimizer_mb"],
        "final_loss": rows[-1]["loss"],
    }


def logprob_gap(model: Path, dtype: str, episodes: int) -> dict:
    """Sampler vs trainer log-probabilities of the same sampled tokens, in `dtype`."""
    policy = PolicyModel.load(model, ChatChoice(), Placement(device="cpu", dtype=dtype))
    env = CalcEnv()
    backend = HFBackend(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(0), temperature=1.0)
    engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, EpisodeLimits(max_turns=1, max_turn_tokens=64))
    trajectories = engine.run(env.tasks("eval", episodes, seed=0))
    batch = collate(trajectories, policy.pad_id)
    with torch.no_grad():
        recomputed, _ = forward_logprobs(policy.model, batch)
    mask = batch.loss_mask.bool()
    gap = (recomputed[mask] - batch.old_logprobs[mask]).abs()
    return {"tokens": int(mask.sum()), "max_abs_gap": float(gap.max()), "mean_abs_gap": float(gap.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default="/tmp/bench-lora-precision")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "lora_precision.json"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model-25m"
    parameters = build_25m(model)
    torch.set_num_threads(args.threads)
    results = {
        "parameters": parameters,
        "threads": args.threads,
        "sft": {name: sft_run(model, work, name, overrides, steps, args.threads) for name, (overrides, steps) in VARIANTS.items()},
        "logprob_gap": {dtype: logprob_gap(model, dtype, 16) for dtype in ("float32", "bfloat16")},
    }
    write_result(args.out, results)
    print(f"{parameters / 1e6:.1f}M parameters, {args.threads} threads, {machine()}")
    for name, row in results["sft"].items():
        print(f"{name:20s} {row['s_per_step']:.2f} s/step ({row['steps']} steps)  peak {row['peak_memory_mb']:.0f} MB  "
              f"trainable {row['trainable_params'] / 1e6:.2f}M  optimizer {row['optimizer_state_mb']:.1f} MB")
    for dtype, row in results["logprob_gap"].items():
        print(f"{dtype:9s} sampler vs trainer: max |dlogp| {row['max_abs_gap']:.2e}, mean {row['mean_abs_gap']:.2e} over {row['tokens']} tokens")


if __name__ == "__main__":
    main()
