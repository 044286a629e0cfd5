"""Rollout methods against GRPO: fission, entropy-guided branching, success replay and on-policy distillation, several seeds.

    .venv/bin/python bench/methods.py --env calc [--seeds 0 1 2] [--steps N] [--threads 2]
        [--methods grpo fission entropy replay distill distill_full distill_forward] [--work runs/methods-calc]
        [--out docs/results/methods/calc.json]
    .venv/bin/python bench/methods.py --env hotel ...
    .venv/bin/python bench/methods.py --env bfcl --methods grpo replay --steps 15   # SmolLM2 on BFCL v4

Every run is RL from the environment's shipped SFT checkpoint with its config (ENVS), the same
seeds, steps and task pool (`rl.task_pool`, so that replay has tasks that come back), and
the same number of episodes a step: GRPO samples `prompts` groups of the config's size; a
branching method samples `prompts - BRANCH_GROUPS` groups from the task's start and up to
BRANCH_GROUPS branched groups from inside them (trainer/branching.py). A branch starts
mid-episode, so it samples fewer tokens than a whole episode: each run's sampled tokens are
in the file, and a branching method is compared at no more tokens than GRPO's; with
`--equal-tokens fission`, fission also runs for as many more steps as it takes to sample
GRPO's mean tokens (arm fission@tokens). Wall time is the sum of the steps' `time/step`.

The distillation methods (`distill`: the teacher's per-token reverse-KL advantage alone;
`distill_full`: the exact reverse KL over the vocabulary in the loss; `distill_forward`: the forward KL there) sample GRPO's episodes
and need a teacher of the same vocabulary: the environment's TEACHER run, RL from the same
start for more steps and more groups a step (trained once in WORK/teacher, its held-out
accuracy and minutes in the file): its compute comes on top of the method's own.

Held-out accuracy: the environment's EVAL tasks x samples of each final model, the same
tasks for every run (bfcl: the first BFCL_LIMIT entries of each held-out category, greedy,
the official checker's verdict; RL from the SFT 300 adapter as examples/smollm2/bfcl.yaml says); the mean over seeds with a 95% t interval, and each method's paired
difference to GRPO over seeds (same seed, same task draws) with its interval. Runs and
evaluations already done are not run again.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from distill_calc import ROOT, TEACHER_STEPS, accuracy, rl_rows, rl_run, toolpolicy  # bench/ is on the path of a script run from it
from seed_interval import interval
from result_file import write_result

CONFIGS = ROOT / "src" / "toolpolicy" / "configs"
BFCL_HELD_OUT = "non_live"  # BFCL's name for the seven held-out categories
BFCL_LIMIT = 40
"""bfcl: the held-out entries scored, the first this many of each BFCL_HELD_OUT category (280 of 1,390)."""
ENVS: dict[str, dict[str, Any]] = {
    "calc": {"config": CONFIGS / "demo.yaml", "start": ROOT / "checkpoints" / "calc-sft", "prompts": 12, "pool": 48,
             "steps": 60, "eval": {"tasks": 300, "samples": 2}},
    "hotel": {"config": CONFIGS / "ablation_hotel.yaml", "start": ROOT / "checkpoints" / "hotel-sft-breaks20", "prompts": 4,
              "pool": 24, "steps": 30, "eval": {"tasks": 30, "samples": 4}},
    "bfcl": {"config": ROOT / "examples" / "smollm2" / "bfcl.yaml", "start": ROOT / "checkpoints" / "smollm2-bfcl-sft300",
             "prompts": 8, "pool": 40, "steps": 15, "eval": {"categories": BFCL_HELD_OUT, "per_category": BFCL_LIMIT},
             "settings": {"optim.micro_batch_tokens": 4096}},
}  # fmt: skip
"""Each environment's config, start, episodes' groups a step, task pool, steps, held-out set (tasks x samples,
or bfcl's first per_category entries of each category) and extra settings of every run (bfcl: as the config's
RL command)."""
TEACHER: dict[str, dict[str, Any]] = {
    "calc": {"rl.steps": TEACHER_STEPS},  # distill_calc's teacher
    "hotel": {"rl.steps": 160, "rl.prompts_per_step": 8, "algorithm.beta": 0.04, "algorithm.mini_batches": 4},
}
"""The teacher of the distillation methods: RL from the environment's start with these settings
(hotel: twice the groups a step, four optimizer steps a batch and hotel.yaml's KL to the start)."""
BRANCH_GROUPS = 2


def bfcl_scores(work: Path, name: str, checkpoint: Path, threads: int, config: Path) -> dict[str, Any]:
    """`checkpoint` on the first BFCL_LIMIT entries of each held-out category (`toolpolicy eval
    --bfcl v4`; cached in WORK/eval/NAME): the share right over all of them, BFCL's non-live
    summary and each category's share."""
    run_dir = work / "eval" / name
    summary = run_dir / "eval" / "bfcl_v4.json"
    if not summary.exists():
        extra = ("--bfcl", "v4", "--categories", BFCL_HELD_OUT, "--limit", str(BFCL_LIMIT))
        toolpolicy("eval", run_dir, {"eval.checkpoint": checkpoint}, threads, *extra, config=config)
    scores = json.loads(summary.read_text())
    by_category = {category: figures["accuracy"] for category, figures in scores["by_category"].items()}
    return {"accuracy": scores["accuracy"], "non_live": scores["groups"]["non_live"], "by_category": by_category}


def methods(prompts: int, teacher: Path | None) -> dict[str, dict[str, Any]]:
    """Each method's settings, at `prompts` episodes' groups a step (distillation from `teacher`)."""
    branched = {"rl.prompts_per_step": prompts - BRANCH_GROUPS, "algorithm.branch_groups": BRANCH_GROUPS}
    distilled = {"rl.prompts_per_step": prompts, "algorithm.teacher": teacher, "algorithm.teacher_alone": True}
    return {
        "grpo": {"rl.prompts_per_step": prompts},
        "fission": {**branched, "algorithm.branch": "fission"},
        "entropy": {**branched, "algorithm.branch": "entropy"},
        "replay": {"rl.prompts_per_step": prompts, "algorithm.replay": True},
        "distill": distilled,
        "distill_full": {**distilled, "algorithm.teacher_loss": "full"},
        "distill_forward": {**distilled, "algorithm.teacher_loss": "forward"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", choices=sorted(ENVS), required=True)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, help="RL steps of each run (default: the environment's)")
    parser.add_argument("--methods", nargs="+", default=["grpo", "fission", "entropy", "replay"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--equal-tokens", nargs="*", default=[], metavar="METHOD",
        help="also run METHOD for as many more steps as it takes to sample GRPO's tokens (arm METHOD@tokens)",
    )
    args = parser.parse_args()
    env = ENVS[args.env]
    work = args.work or ROOT / "runs" / f"methods-{args.env}"
    out = args.out or ROOT / "docs" / "results" / "methods" / f"{args.env}.json"  # the docs' methods table (docs/tables.py)
    steps = args.steps or env["steps"]

    def held_out(name: str, checkpoint: Path) -> dict[str, Any]:
        """`checkpoint`'s held-out accuracy (held_out) and, on bfcl, the scores it is one of (bfcl)."""
        if args.env == "bfcl":
            scores = bfcl_scores(work, name, checkpoint, args.threads, env["config"])
            return {"held_out": scores["accuracy"], "bfcl": scores}
        return {"held_out": accuracy(work, name, checkpoint, {}, args.threads, env["config"], env["eval"]["tasks"], env["eval"]["samples"])}

    teacher, teacher_figures = None, None
    distilled = any(method.startswith("distill") for method in args.methods)
    if distilled and args.env not in TEACHER:
        parser.error(f"--env {args.env} has no teacher for the distillation methods (TEACHER holds {', '.join(TEACHER)})")
    if distilled:
        teacher_steps = TEACHER[args.env]["rl.steps"]  # one checkpoint, at the end: only the final model teaches
        teacher_run = rl_run(work, "teacher", env["start"], teacher_steps, TEACHER[args.env], args.threads, env["config"], every=teacher_steps)
        teacher = work / "teacher" / "rl" / "final"
        teacher_figures = {"settings": TEACHER[args.env], **held_out("teacher", teacher), "wall_minutes": teacher_run["wall_seconds"] / 60}
    table = methods(env["prompts"], teacher)
    start = held_out("start", env["start"])
    runs: dict[str, list[dict[str, Any]]] = {method: [] for method in args.methods}
    arms = [(method, method, steps) for method in args.methods]
    for method in args.equal_tokens:  # after the arms whose tokens they match have run
        runs[f"{method}@tokens"] = []
        arms.append((f"{method}@tokens", method, 0))
    steps_of: dict[str, int] = {}
    for arm, method, arm_steps in arms:
        if not arm_steps:  # GRPO's mean sampled tokens over the method's, at the environment's steps
            ratio = statistics.fmean(r["sampled_tokens"] for r in runs["grpo"]) / statistics.fmean(r["sampled_tokens"] for r in runs[method])
            arm_steps = math.ceil(steps * ratio)
        steps_of[arm] = arm_steps
        for seed in args.seeds:
            name = f"{arm.replace('@', '-')}-seed{seed}"
            settings = {"run.seed": seed, "rl.task_pool": env["pool"], **env.get("settings", {}), **table[method]}
            run = rl_run(work, name, env["start"], arm_steps, settings, args.threads, env["config"])
            run.update(held_out(name, work / name / "rl" / "final"))
            rows = rl_rows(work / name)
            run.update({
                "seed": seed,
                "sampled_tokens": sum(r["sampled_tokens"] for r in rows),
                "branch_groups": sum(r.get("branch/groups", 0) for r in rows),
                "branch_signal_groups": sum(r.get("branch/signal_groups", 0) for r in rows),
                "replayed_episodes": sum(r.get("replayed_episodes", 0) for r in rows),
                "signal_groups": sum(r["signal_groups"] for r in rows),
            })
            run.pop("reverse_kl", None)
            runs[arm].append(run)
            print(f"{name}: held-out {run['held_out']:.3f}, {run['sampled_tokens']} tokens, {run['wall_seconds']:.0f} s", flush=True)
    summary = {}
    for method, done in runs.items():
        summary[method] = {
            "held_out": interval([r["held_out"] for r in done]),
            "minus_grpo": interval([r["held_out"] - g["held_out"] for r, g in zip(done, runs["grpo"])]) if "grpo" in runs else None,
            "sampled_tokens": statistics.fmean(r["sampled_tokens"] for r in done),
            "wall_minutes": statistics.fmean(r["wall_seconds"] for r in done) / 60,
        }
        if args.env == "bfcl":  # BFCL's non-live summary, as the held-out accuracy
            summary[method]["non_live"] = interval([r["bfcl"]["non_live"] for r in done])
            summary[method]["non_live_minus_grpo"] = interval([r["bfcl"]["non_live"] - g["bfcl"]["non_live"] for r, g in zip(done, runs["grpo"])])
    write_result(out, {
        "env": args.env, "config": str(env["config"].relative_to(ROOT)), "start": str(env["start"].relative_to(ROOT)),
        "start_held_out": start["held_out"], "teacher": teacher_figures, "start_bfcl": start.get("bfcl"),
        "steps": steps, "task_pool": env["pool"], "episodes_per_step": env["prompts"],
        "branch_groups": BRANCH_GROUPS, "seeds": args.seeds,
        "eval": env["eval"],
        "settings": env.get("settings", {}),
        "methods": {method: {k: str(v) if isinstance(v, Path) else v for k, v in table[method].items()} for method in args.methods}, "steps_of": steps_of, "summary": summary, "runs": runs,
    })
    for method, figures in summary.items():
        print(method, figures)


if __name__ == "__main__":
    main()
