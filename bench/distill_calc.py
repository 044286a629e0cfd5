"""On-policy distillation against GRPO on calc: a smaller student learns from the RL-trained calc model.

    .venv/bin/python bench/distill_calc.py [--student CHECKPOINT] [--steps 100] [--work runs/distill-calc]
        [--student-shape small|half] [--seeds 0 1 2] [--every 10] [--arms grpo_mb4 distill_full_mb4 ...]
        [--mini-batches 4] [--lr 0.0003] [--teacher-coef 4] [--group-size 4] [--lr-schedule cosine]
        [--to-target grpo_cosine ...] [--out bench/results/distill_calc.json]

Each phase runs `toolpolicy` as a user would, in a process of its own, and is skipped when
its output exists, so a stopped run picks up where it was:

1. teacher: RL from checkpoints/calc-sft with demo.yaml (TEACHER_STEPS steps).
2. student: `--student CHECKPOINT` (e.g. checkpoints/calc-sft, the teacher's own start), or
   else SFT of a smaller embedded model (`--student-shape`: one of STUDENTS, the same
   tokenizer) on the demonstrations calc-sft learned from.
3. grpo: RL from the student with demo.yaml's GRPO, a checkpoint every `--every` steps.
4. distill: the same RL from the same student with `algorithm.teacher` (the teacher's
   per-token reverse-KL advantage alone), a checkpoint every `--every` steps.
5. distill_full: the same with `algorithm.teacher_loss: full` (the exact reverse KL over the
   vocabulary at each sampled position, in the loss); distill_forward: with
   `algorithm.teacher_loss: forward` (the forward KL there instead); distill_full_reward: the
   full reverse KL added to GRPO's own loss (the task reward kept, `algorithm.teacher_alone`
   off).
6. the same five with four optimizer steps per rollout batch (`algorithm.mini_batches: 4`):
   grpo_mb4, distill_mb4, distill_full_mb4, distill_forward_mb4, distill_full_reward_mb4; and
   with `--lr-schedule cosine` each of the ten again with the LR decayed on a cosine to a tenth
   over its run (`rl.lr_schedule`): grpo_cosine, ..., distill_full_reward_mb4_cosine.
   `--arms` runs only the named ones. `--group-size G` runs every arm with groups of G and
   as many episodes a step as demo.yaml (more tasks a step for smaller groups), named NAME-gG.
7. eval: held-out accuracy (EVAL_TASKS tasks x EVAL_SAMPLES samples, the same for every
   model) of the teacher, the student and every checkpoint (`--to-target ARM ...`: those arms'
   checkpoints in order until the first within 2 points, which gives the same count for less).

Steps 3-7 run once per `--seeds` seed (`run.seed`: the task draws and samples; the teacher
and the student are the same for all). The result file holds, per arm and seed, the curve,
the steps it took to come within 2 points of the teacher's accuracy (None: not within the
steps run), sampled tokens and wall time; and each distillation's steps as a fraction of
GRPO's with as many optimizer steps per batch and the same LR schedule (`--against ARM`: of
that GRPO arm's), per seed and as the ratio of the means over the seeds that reached the target.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from toolpolicy.api import load_config
from toolpolicy.trainer.checkpoint import STATE_FILE

from result_file import write_result  # bench/ is on the path of a script run from it
from seed_interval import interval

ROOT = Path(__file__).parent.parent
CONFIG = ROOT / "src" / "toolpolicy" / "configs" / "demo.yaml"
TEACHER_START = ROOT / "checkpoints" / "calc-sft"
TEACHER_STEPS = 200
STUDENTS = {
    "small": ({"embedded.hidden_size": 96, "embedded.layers": 3, "embedded.heads": 4, "embedded.kv_heads": 2,
               "embedded.intermediate_size": 288}, {"sft.cold_start": "", "sft.steps": 600}),
    "half": ({"embedded.hidden_size": 128, "embedded.layers": 4, "embedded.heads": 4, "embedded.kv_heads": 2,
              "embedded.intermediate_size": 384}, {"sft.cold_start": ""}),
}
"""The smaller students `--student-shape` names: (model shape, SFT settings over demo.yaml's). small: 0.37M
parameters after 600 SFT steps; half: 0.84M parameters (the teacher's 1.85M with width 128 for 192) after
the SFT calc-sft had (1,500 steps of 32 on 48,000 demonstrations)."""
EVERY = 10
EVAL_TASKS, EVAL_SAMPLES = 300, 2
WITHIN = 0.02
DISTILLATIONS = {
    "distill": {"algorithm.teacher_alone": True},
    "distill_full": {"algorithm.teacher_alone": True, "algorithm.teacher_loss": "full"},
    "distill_forward": {"algorithm.teacher_alone": True, "algorithm.teacher_loss": "forward"},
    "distill_full_reward": {"algorithm.teacher_loss": "full"},
}
MINI_BATCHES = 4
"""The second arm of each method: this many optimizer steps per rollout batch (named NAME_mb4; `--mini-batches`)."""


def toolpolicy(command: str, run_dir: Path, settings: dict[str, Any], threads: int, *extra: str, config: Path = CONFIG) -> float:
    """Run `toolpolicy COMMAND CONFIG` (demo.yaml) with `settings` in a process of its own; its wall seconds."""
    args = [sys.executable, "-m", "toolpolicy", command, str(config), *extra]
    for key, value in {"run.dir": run_dir, "run.threads": threads, **settings}.items():
        args += ["--set", f"{key}={value}"]
    began = time.perf_counter()
    subprocess.run(args, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return time.perf_counter() - began


def rl_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["phase"] == "rl"]


def accuracy(
    work: Path, name: str, checkpoint: Path, settings: dict[str, Any], threads: int, config: Path = CONFIG,
    tasks: int = EVAL_TASKS, samples: int = EVAL_SAMPLES,
) -> float:
    """Held-out accuracy of `checkpoint` on `tasks` eval tasks x `samples` (cached in WORK/eval/NAME.json,
    evaluated again when the checkpoint is newer than the cached summary: a run deleted and run again)."""
    summary = work / "eval" / "eval" / f"{name}.json"
    if not summary.exists() or summary.stat().st_mtime < max(f.stat().st_mtime for f in Path(checkpoint).iterdir()):
        evaluated = {**settings, "eval.checkpoint": checkpoint, "eval.tasks": tasks, "eval.samples": samples}
        toolpolicy("eval", work / "eval", evaluated, threads, "--name", name, config=config)
    return float(json.loads(summary.read_text())["accuracy"])


def rl_run(
    work: Path, name: str, start: Path, steps: int, settings: dict[str, Any], threads: int, config: Path = CONFIG,
    every: int = EVERY,
) -> dict[str, Any]:
    """RL from `start` with a checkpoint every `every` steps, all kept (unless it ran already);
    once the run is done only their models are kept, for the evaluation (the optimizer states,
    two thirds of a checkpoint, are deleted)."""
    run_dir = work / name
    if not (run_dir / "rl" / "final").exists():
        kept = {"rl.init_from": start, "rl.steps": steps, "run.checkpoint_every": every, "run.keep_checkpoints": steps // every + 1,
                "rl.store_rollouts": False, **settings}
        toolpolicy("train", run_dir, kept, threads, config=config)
    for state in (run_dir / "rl" / "checkpoints").glob(f"step_*/{STATE_FILE}"):
        state.unlink()
    rows = rl_rows(run_dir)
    return {
        "steps": len(rows),
        "optimizer_steps": sum(r["optimizer_steps"] for r in rows),
        "wall_seconds": sum(r["time/step"] for r in rows),
        "tokens": {key: sum(r.get(key, 0) for r in rows) for key in sorted({k for r in rows for k in r if k.startswith("tokens/")})},
        "train_accuracy": [r["accuracy"] for r in rows],
        "reverse_kl": [r["distill/reverse_kl"] for r in rows if "distill/reverse_kl" in r],
    }


def first_within(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first step whose accuracy is at least `target`."""
    return next((step for step, value in curve if value >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "distill-calc")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "distill_calc.json")
    parser.add_argument("--steps", type=int, default=100, help="RL steps of each student run")
    parser.add_argument("--student", type=Path, help="the student's checkpoint (default: SFT of a smaller model, --student-shape)")
    parser.add_argument("--student-shape", choices=sorted(STUDENTS), default="small", help="the smaller student without --student")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--every", type=int, default=EVERY, help="steps between evaluated checkpoints")
    parser.add_argument("--arms", nargs="+", help="run only these arms (default: all ten, or twenty with --lr-schedule)")
    parser.add_argument("--mini-batches", type=int, default=MINI_BATCHES, help="optimizer steps a batch of the second arms")
    parser.add_argument("--lr", type=float, help="every arm's learning rate (default: demo.yaml's); runs named NAME-lrLR")
    parser.add_argument("--against", metavar="GRPO_ARM", help="the GRPO arm every distillation's steps are divided by "
                        "(default: the one with as many steps a batch and the same LR schedule)")
    parser.add_argument("--teacher-coef", type=float,
                        help="the distillation arms' algorithm.teacher_coef (default 1); runs named NAME-coefC")
    parser.add_argument("--group-size", type=int, help="every arm's rl.group_size, with as many episodes a step as demo.yaml's "
                        "(prompts_per_step x group_size fixed; default: its 8); runs named NAME-gG")
    parser.add_argument("--to-target", nargs="+", default=[], metavar="ARM", help="evaluate these arms' checkpoints in order "
                        "only until one comes within 2 points (the same count for less; the curve stops there)")
    parser.add_argument("--lr-schedule", choices=["cosine"],
                        help="add each arm with this rl.lr_schedule (demo.yaml's: constant), named NAME_cosine")
    args = parser.parse_args()
    work, threads = args.work, args.threads

    teacher_run = work / "teacher"
    if not (teacher_run / "rl" / "final").exists():
        toolpolicy("train", teacher_run, {"rl.init_from": TEACHER_START, "rl.steps": TEACHER_STEPS, "run.checkpoint_every": TEACHER_STEPS}, threads)
    teacher = teacher_run / "rl" / "final"
    student = args.student
    shape, student_sft = STUDENTS[args.student_shape]
    if student is None:
        student_run = work / f"{args.student_shape}-student" / "student"
        if not (student_run / "sft" / "final").exists():
            toolpolicy("sft", student_run, {**shape, **student_sft}, threads)
        student = student_run / "sft" / "final"
    runs_dir = work / (student.resolve().name if args.student else f"{args.student_shape}-student")

    rate, rate_name = named_setting("rl.lr", args.lr, "lr")
    coef, coef_name = named_setting("algorithm.teacher_coef", args.teacher_coef, "coef")
    shaped, shape_name = named_setting("rl.group_size", args.group_size, "g")
    if args.group_size:
        shaped["rl.prompts_per_step"] = episodes_per_step(CONFIG) // args.group_size
    every_arm, every_arm_name = {**rate, **shaped}, rate_name + shape_name  # the flags every arm takes
    kinds = {"grpo": {}, **{name: {"algorithm.teacher": teacher, **coef, **settings} for name, settings in DISTILLATIONS.items()}}
    variants = {"": {}, f"_mb{args.mini_batches}": {"algorithm.mini_batches": args.mini_batches}}  # grpo, grpo_mb4, ...
    if args.lr_schedule:  # ... and grpo_cosine, grpo_mb4_cosine, ...
        scheduled = {"rl.lr_schedule": args.lr_schedule}
        variants |= {f"{variant}_{args.lr_schedule}": {**settings, **scheduled} for variant, settings in variants.items()}
    methods = {kind + variant: {**settings, **varied} for kind, settings in kinds.items() for variant, varied in variants.items()}
    baseline = {kind + variant: args.against or "grpo" + variant for kind in kinds for variant in variants}
    methods = {name: settings for name, settings in methods.items() if args.arms is None or name in args.arms}
    if args.against and args.against not in methods:
        parser.error(f"--against {args.against}: not among the arms run ({', '.join(methods)})")
    teacher_accuracy = accuracy(work, "teacher", teacher, {}, threads)
    student_accuracy = accuracy(work, f"student-{runs_dir.name}", student, {}, threads)
    target = teacher_accuracy - WITHIN
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in methods}
    for seed in args.seeds:
        for name, settings in methods.items():
            run_name = f"{name}-seed{seed}{every_arm_name}" + ("" if name.startswith("grpo") else coef_name)
            run = rl_run(runs_dir, run_name, student, args.steps, {"run.seed": seed, **every_arm, **settings}, threads, every=args.every)
            checkpoints = sorted((runs_dir / run_name / "rl" / "checkpoints").glob("step_*"))
            curve = [(0, student_accuracy)]
            for checkpoint in checkpoints:
                if name in args.to_target and curve[-1][1] >= target:
                    break
                held_out = accuracy(work, f"{runs_dir.name}-{run_name}-{checkpoint.name}", checkpoint, {}, threads)
                curve.append((int(checkpoint.name.split("_")[1]), held_out))
            runs[name].append({"seed": seed, **run, "held_out": curve, "steps_to_within_2_points": first_within(curve, target)})
            print(f"{run_name}: within 2 points at step {runs[name][-1]['steps_to_within_2_points']}", flush=True)
    steps = {name: [run["steps_to_within_2_points"] for run in done] for name, done in runs.items()}
    write_result(args.out, {
        "config": str(CONFIG.relative_to(ROOT)), "teacher_start": str(TEACHER_START.relative_to(ROOT)), "teacher_steps": TEACHER_STEPS,
        "student": str(args.student) if args.student else {"name": args.student_shape, "shape": shape, "sft": student_sft},
        "eval": {"tasks": EVAL_TASKS, "samples": EVAL_SAMPLES},
        "seeds": args.seeds, "steps": args.steps, "every": args.every, "lr": args.lr, "mini_batches": args.mini_batches,
        "teacher_coef": args.teacher_coef, "group_size": args.group_size, "to_target": args.to_target, "against": args.against,
        "teacher_accuracy": teacher_accuracy, "student_accuracy": student_accuracy, "target": target,
        "steps_to_within_2_points": steps,
        "steps_ratio": {
            name: steps_ratio(steps[name], steps[baseline[name]], [run["steps"] for run in runs[baseline[name]]])
            for name in runs if not name.startswith("grpo") and baseline[name] in runs
        },
        "held_out_at": {name: held_out_at(done) for name, done in runs.items()},
        "runs": runs,
    })
    print(json.dumps({"teacher": teacher_accuracy, "student": student_accuracy, **steps}))


def episodes_per_step(config: Path) -> int:
    """Episodes a step of `config`: its prompts_per_step x group_size.

    >>> episodes_per_step(CONFIG)
    96
    """
    rl = load_config(config).rl
    return rl.prompts_per_step * rl.group_size


def named_setting(key: str, value: float | None, tag: str) -> tuple[dict[str, float], str]:
    """A flag's setting and the suffix it gives run names (`-TAGVALUE`); none for a flag not given.

    >>> named_setting("rl.lr", 0.0002, "lr")
    ({'rl.lr': 0.0002}, '-lr0.0002')
    >>> named_setting("rl.lr", None, "lr")
    ({}, '')
    """
    return ({key: value}, f"-{tag}{value:g}") if value else ({}, "")


def steps_ratio(method: list[int | None], grpo: list[int | None], grpo_ran: list[int]) -> dict[str, Any]:
    """A method's steps to the target over GRPO's, per seed, and the ratio of the means over the seeds where both got there.

    A seed where GRPO did not get there in the steps its run took (`grpo_ran`) gives the method's
    steps over those, a bound the true ratio is below (`bound_seeds`: their indices in the list);
    one where the method did not, None.

    >>> steps_ratio([4, 6, 10, None], [20, 30, None, 24], [50, 50, 50, 50])
    {'per_seed': [0.2, 0.2, 0.2, None], 'bound_seeds': [2], 'of_means': 0.2}
    """
    both = [(m, g) for m, g in zip(method, grpo) if m is not None and g is not None]
    return {
        "per_seed": [None if m is None else m / (g or ran) for m, g, ran in zip(method, grpo, grpo_ran)],
        "bound_seeds": [i for i, (m, g) in enumerate(zip(method, grpo)) if m is not None and g is None],
        "of_means": sum(m for m, _ in both) / sum(g for _, g in both) if both else None,
    }


def held_out_at(done: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Held-out accuracy at each evaluated step: the mean over seeds with its 95% t interval."""
    by_step: dict[int, list[float]] = {}
    for run in done:
        for step, value in run["held_out"]:
            by_step.setdefault(step, []).append(value)
    return {step: interval(values) for step, values in sorted(by_step.items())}


if __name__ == "__main__":
    main()
