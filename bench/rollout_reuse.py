"""What the rollout engine no longer repeats: KV reuse across turns, shared prompts, concurrent tools.

Three measurements on the shipped checkpoints, each alternating the variants (A B A B) so
that machine drift hits both:

1. hotel (checkpoints/hotel-sft, 8 tasks x 8 samples, up to 8 turns): the sampler that keeps
   each episode's KV cache across turns, against the same sampler made to forget its cache
   before every turn (the whole conversation prefilled again, the rest of its savings kept:
   a group's prompt prefilled once, stopped rows out of the decode batch), and against the
   previous sampler (`PREVIOUS`, read from git history at run time: every turn left-pads and
   prefills every live conversation, every row decodes until the last one stops). Token
   positions run through the model (prefill, decode) and seconds per rollout; the sampled
   ids are checked to be identical.
2. the same on calc (checkpoints/calc-sft, 12 tasks x 8 samples, up to 4 turns).
3. concurrent tools: calc whose calculator waits 100 ms (a tool behind a network), rolled
   out with tool_workers 1 and 8.

    OMP_NUM_THREADS=1 .venv/bin/python bench/rollout_reuse.py [--repeats 3] [--threads 1]

Writes bench/results/rollout_reuse.json.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path

import torch
from tqdm.auto import tqdm

from toolpolicy.envs import CalcEnv, HotelEnv
from toolpolicy.model import PolicyModel
from toolpolicy.rollout import GenRequest, HFBackend, EpisodeLimits, RolloutEngine
from toolpolicy.tools import ToolSet, tool
from toolpolicy.tools.calculator import calculator as real_calculator

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).parent.parent
OUT = ROOT / "bench" / "results" / "rollout_reuse.json"
PREVIOUS = "0c755b6"
"""The last commit whose sampler prefilled every conversation at every turn."""


def previous_backend() -> type:
    """The HFBackend of commit PREVIOUS, loaded from git history (nothing of it is kept in the tree)."""
    source = subprocess.run(
        ["git", "show", f"{PREVIOUS}:src/toolpolicy/rollout/backends.py"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    module = types.ModuleType("previous_backends")
    sys.modules[module.__name__] = module  # its dataclasses look themselves up there
    exec(compile(source, f"{PREVIOUS}:backends.py", "exec"), module.__dict__)

    class Previous(module.HFBackend):
        counts: Counter[str] = Counter()  # it counted nothing

        def forget(self) -> None:
            """It kept nothing."""

    return Previous


class ForgetEveryTurn(HFBackend):
    """The sampler without its cross-turn cache: every turn prefills the whole conversation."""

    def generate(self, requests: list[GenRequest]):
        self.forget()
        return super().generate(requests)


class WaitingCalcEnv(CalcEnv):
    """calc whose calculator answers after 100 ms."""

    def __init__(self) -> None:
        super().__init__()

        @tool
        def calculator(expression: str) -> str:
            """Evaluate an arithmetic expression.

            Args:
                expression: the arithmetic to evaluate.
            """
            time.sleep(0.1)
            return real_calculator(expression=expression)

        self.tools = ToolSet([calculator])


def rollout(policy: PolicyModel, env, backend_kind: type[HFBackend], limits: EpisodeLimits, prompts: int, workers: int = 1) -> dict:
    backend = backend_kind(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(0), temperature=1.0)
    engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, limits, tool_workers=workers)
    tasks = env.tasks("train", prompts, seed=7)
    began = time.perf_counter()
    trajectories = engine.run([task for task in tasks for _ in range(8)])
    seconds = time.perf_counter() - began
    return {
        "seconds": seconds,
        "prefill_tokens": backend.counts["prefill"],
        "decode_tokens": backend.counts["decode"],
        "sampled_tokens": sum(t.sampled_tokens for t in trajectories),
        "turns": sum(len(t.turn_spans) for t in trajectories),
        "tool_calls": sum(t.episode.count("tool_call") for t in trajectories),
        "ids": [t.token_ids for t in trajectories],
    }


def compare(name: str, runs: dict[str, list[dict]]) -> dict:
    """Medians per variant, and whether every variant sampled the same ids in every repeat."""
    out: dict = {"setting": name}
    first = next(iter(runs.values()))[0]["ids"]
    out["identical_samples"] = all(r["ids"] == first for rs in runs.values() for r in rs)
    for variant, rs in runs.items():
        out[variant] = {key: statistics.median(r[key] for r in rs) for key in rs[0] if key != "ids"}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hotel = PolicyModel.load(ROOT / "checkpoints" / "hotel-sft")
    calc = PolicyModel.load(ROOT / "checkpoints" / "calc-sft")
    previous = previous_backend()
    hotel_limits, calc_limits = EpisodeLimits(max_turns=8, max_tokens=640, max_turn_tokens=96), EpisodeLimits(max_tokens=192, max_turn_tokens=64)
    jobs = {
        "hotel: KV reuse": {
            "cached": lambda: rollout(hotel, HotelEnv(), HFBackend, hotel_limits, 8),
            "prefill every turn": lambda: rollout(hotel, HotelEnv(), ForgetEveryTurn, hotel_limits, 8),
            f"previous ({PREVIOUS})": lambda: rollout(hotel, HotelEnv(), previous, hotel_limits, 8),
        },
        "calc: KV reuse": {
            "cached": lambda: rollout(calc, CalcEnv(), HFBackend, calc_limits, 12),
            "prefill every turn": lambda: rollout(calc, CalcEnv(), ForgetEveryTurn, calc_limits, 12),
            f"previous ({PREVIOUS})": lambda: rollout(calc, CalcEnv(), previous, calc_limits, 12),
        },
        "calc, 100 ms tool: concurrency": {
            "tool_workers 8": lambda: rollout(calc, WaitingCalcEnv(), HFBackend, calc_limits, 12, workers=8),
            "tool_workers 1": lambda: rollout(calc, WaitingCalcEnv(), HFBackend, calc_limits, 12, workers=1),
        },
    }
    results = []
    bar = tqdm(total=sum(len(v) for v in jobs.values()) * args.repeats, desc="rollouts")
    for name, variants in jobs.items():
        runs: dict[str, list[dict]] = {variant: [] for variant in variants}
        for _ in range(args.repeats):
            for variant, job in variants.items():
                runs[variant].append(job())
                bar.update()
        results.append(compare(name, runs))
    bar.close()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=ROOT).stdout)
    write_result(OUT, {"commit": commit + ("+changes" if dirty else ""), "threads": args.threads, "repeats": args.repeats,
                       "results": results})
    for result in results:
        variants = [k for k in result if k not in ("setting", "identical_samples")]
        first = result[variants[0]]
        print(f"{result['setting']}: identical samples {result['identical_samples']}")
        for variant in variants:
            r = result[variant]
            print(f"  {variant:22s} {r['seconds']:7.2f} s ({r['seconds'] / first['seconds']:.2f}x)  "
                  f"prefill {r['prefill_tokens']:7.0f}  decode {r['decode_tokens']:7.0f}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
