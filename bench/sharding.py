"""How torchrun's processes hold a 135M model, replicate against shard (FSDP2): memory per
process and seconds per update step, for 1, 2 and 4 processes.

Each run is `torchrun --nproc-per-node N` of this file's worker: a Llama of SmolLM2-135M's
shape (the project builds it: 134.5M parameters, tied embeddings, float32, random weights,
since neither memory nor time depends on their values) trained with the RL update as
`toolpolicy train` runs it (`trainer/rl.py:train_on_batch`, AdamW, one optimizer step on a
batch of 4 groups of 2 episodes, a 48-token prompt and 16 sampled tokens each, or the sizes
given (`Batch`); micro-batches as the config's defaults cut them), then the weights gathered
whole for the sampler as after every RL step (`Sharded.refresh`, timed apart as well; the
next update starts from them). The holdings: replicate, shard, and shard-kept (shard with
`model.shard_reshard: false`: each block stays gathered from its forward pass to its
backward). No rollouts: this measures what the way of holding the model changes. Each
process reports its peak RSS (the high-water mark of the whole process: Python, torch, the
model, the batch's activations, and under shard the weights gathered for the sampler) and its
model state: parameters, gradients and AdamW's moments it holds (its shards under shard).
`sampler_copy_mb`: memory the sampler's weights take beside the model's own (0 when they are
the model's, or its gathered shards). Seconds per step: the median after the first step (the
rank that took longest each step).

    .venv/bin/python bench/sharding.py [--steps 5] [--processes 1 2 4]
    .venv/bin/python bench/sharding.py --groups 4 --group-size 4 --prompt 128 --response 32 --name sharding_rl_batch

Writes bench/results/NAME.json (sharding.json). On a machine with two cores, 4 processes
share them, so their seconds per step measure the split of the work, not more hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from result_file import write_result

ROOT = Path(__file__).parent.parent
SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True,
)
SHARINGS = ("replicate", "shard", "shard-kept")
"""How the processes hold the model: model.sharing, and shard-kept for shard with model.shard_reshard false."""


@dataclass(frozen=True)
class Batch:
    """The update's batch: `groups` groups of `group_size` episodes, `prompt` + `response` tokens each."""

    groups: int = 4
    group_size: int = 2
    prompt: int = 48
    response: int = 16

    def __str__(self) -> str:
        return f"{self.groups} groups of {self.group_size}, {self.prompt}+{self.response} tokens"


def worker(sharing_name: str, steps: int, batch: Batch, out: Path) -> None:
    """One process of a run: build the model, hold it as `sharing_name` says, take `steps`
    update steps, append this rank's figures to `out` (one JSON line)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from toolpolicy.algorithms.correction import Correction
    from toolpolicy.build import load_config
    from toolpolicy.config import ModelSection, OptimSection
    from toolpolicy.model.placement import memory_metrics
    from toolpolicy.rollout import Trajectory
    from toolpolicy.trainer.batch import SHARED_PROMPTS
    from toolpolicy.trainer.distributed import SHARINGS as HOLD, World
    from toolpolicy.trainer.update import Learner, UpdateSettings, algorithm_of, train_on_batch

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M))
    world = World.from_environment(torch.device("cpu"))
    section = {
        "replicate": ModelSection(), "shard": ModelSection(sharing="shard"), "shard-kept": ModelSection(sharing="shard", shard_reshard=False),
    }[sharing_name]
    sharing = HOLD[section.sharing](section)
    whole = sharing.place(model, world)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    algorithm, _, _ = algorithm_of(load_config(None, []).algorithm)
    optim = OptimSection()  # the config's defaults: each process's share is one micro-batch
    settings = UpdateSettings(
        group_size=batch.group_size, mini_batches=1, passes=1, micro_batch_size=optim.micro_batch_size,
        micro_batch_tokens=optim.micro_batch_tokens, temperature=1.0, grad_clip=optim.grad_clip,
    )
    recompute = replace(SHARED_PROMPTS, logprobs=sharing.logprobs(SHARED_PROMPTS.logprobs))
    learner = Learner(model, None, trainable, optimizer, scheduler, algorithm, Correction.named("none", tis_cap=2.0), recompute, world, 0, settings, sharing)
    g = torch.Generator().manual_seed(1)
    episodes = []
    for _ in range(batch.groups):
        prompt = torch.randint(0, SMOLLM2_135M["vocab_size"], (batch.prompt,), generator=g).tolist()
        for _ in range(batch.group_size):
            response = torch.randint(0, SMOLLM2_135M["vocab_size"], (batch.response,), generator=g).tolist()
            episodes.append(Trajectory(prompt + response, [0] * batch.prompt + [1] * batch.response, [0.0] * batch.prompt + [-10.0] * batch.response, batch.prompt, None))
    advantages = torch.randn(len(episodes), generator=g)
    seconds, gathers = [], []
    for _ in range(steps):
        world.barrier()
        began = time.perf_counter()
        train_on_batch(learner, episodes, list(range(len(episodes))), advantages)
        updated = time.perf_counter()
        sharing.refresh(model, whole)
        seconds.append(time.perf_counter() - began)
        gathers.append(time.perf_counter() - updated)
    state = memory_metrics(model, optimizer)["memory/model_state_mb"]
    own = {p.data_ptr() for p in model.parameters()}  # the gathered tensors after a refresh, under shard
    copy_mb = sum(p.numel() * p.element_size() for p in whole.parameters() if p.data_ptr() not in own) / 2**20
    row = {
        "rank": world.rank, "seconds": seconds, "gather_seconds": gathers, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10,
        "model_state_mb": state, "sampler_copy_mb": copy_mb, "parameters": sum(p.numel() for p in model.parameters()),
    }
    for rank in range(world.size):  # one rank at a time appends its line
        if rank == world.rank:
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
        world.barrier()
    world.close()


def run(sharing: str, processes: int, steps: int, batch: Batch, work: Path) -> dict:
    """One run's figures: per process, and the step time of the slowest rank."""
    out = work / f"{sharing}-{processes}.jsonl"
    out.unlink(missing_ok=True)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    command = [*(launcher if processes > 1 else [sys.executable]), __file__, "--worker", sharing, "--steps", str(steps), *batch_args(batch), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    subprocess.run(command, check=True, env=env)
    ranks = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["rank"])
    slowest = [max(r["seconds"][k] for r in ranks) for k in range(steps)]
    gathers = [max(r["gather_seconds"][k] for r in ranks) for k in range(steps)]
    return {
        "sharing": sharing,
        "processes": processes,
        "parameters": ranks[0]["parameters"],
        "seconds_per_step": statistics.median(slowest[1:]),
        "gather_seconds_per_step": statistics.median(gathers[1:]),
        "peak_rss_mb_per_process": max(r["peak_rss_mb"] for r in ranks),
        "model_state_mb_per_process": max(r["model_state_mb"] for r in ranks),
        "sampler_copy_mb_per_process": max(r["sampler_copy_mb"] for r in ranks),
        "ranks": ranks,
    }


def batch_args(batch: Batch) -> list[str]:
    return ["--groups", str(batch.groups), "--group-size", str(batch.group_size), "--prompt", str(batch.prompt), "--response", str(batch.response)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--groups", type=int, default=Batch.groups)
    parser.add_argument("--group-size", type=int, default=Batch.group_size)
    parser.add_argument("--prompt", type=int, default=Batch.prompt, help="prompt tokens of each episode")
    parser.add_argument("--response", type=int, default=Batch.response, help="sampled tokens of each episode")
    parser.add_argument("--name", default="sharding", help="writes bench/results/NAME.json")
    parser.add_argument("--work", default="/tmp/bench-sharding")
    parser.add_argument("--worker", choices=SHARINGS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batch = Batch(args.groups, args.group_size, args.prompt, args.response)
    if args.worker:
        worker(args.worker, args.steps, batch, Path(args.out))
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    runs = [run("replicate", 1, args.steps, batch, work)]  # one process: nothing to shard
    runs += [run(sharing, n, args.steps, batch, work) for n in args.processes if n > 1 for sharing in SHARINGS]
    summary = {}
    for n in sorted({r["processes"] for r in runs if r["processes"] > 1}):
        rep = next(r for r in runs if r["processes"] == n and r["sharing"] == "replicate")
        for shard in (r for r in runs if r["processes"] == n and r["sharing"] != "replicate"):
            summary[f"{n} processes, {shard['sharing']}"] = {
                "model_state_over_replicate": shard["model_state_mb_per_process"] / rep["model_state_mb_per_process"],
                "peak_rss_over_replicate": shard["peak_rss_mb_per_process"] / rep["peak_rss_mb_per_process"],
                "seconds_over_replicate": shard["seconds_per_step"] / rep["seconds_per_step"],
            }
    out = ROOT / "bench" / "results" / f"{args.name}.json"
    write_result(out, {"steps": args.steps, "batch": str(batch), "summary": summary, "runs": runs})
    for r in runs:
        print(
            f"{r['sharing']:10} x{r['processes']}: {r['seconds_per_step']:.2f} s/step ({r['gather_seconds_per_step']:.2f} gathering), model state {r['model_state_mb_per_process']:.0f} MB, "
            f"peak RSS {r['peak_rss_mb_per_process']:.0f} MB, sampler copy {r['sampler_copy_mb_per_process']:.0f} MB per process"
        )
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
