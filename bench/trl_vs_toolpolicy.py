"""TRL's GRPOTrainer against toolpolicy's RL step on identical work: sampled tokens per second.

What is compared: whole GRPO steps (rollout with its tool calls, rewards, advantages, every
micro-batch's forward and backward, optimizer step) of `toolpolicy train` (`train_rl`,
called as the CLI calls it, so whatever the rollout backend and trainer do now is measured)
and of trl's `GRPOTrainer.train()`. The figure is sampled tokens per second over whole steps
(the tokens the policy sampled and the loss covers, summed over the measured steps, over
their summed wall time), with seconds per step beside it and the ratio toolpolicy / TRL;
beside it, the median over steps of each step's tokens per second, which one step slowed
by another job on a shared machine moves less.
Each step is also split into rollout (sampling with tool calls, scoring) and the rest.
`--toolpolicy-set key=value` runs toolpolicy with other config fields for *how* it works
(e.g. `backend=vllm`); the work stays the same. The JSON keeps every step of every run,
the load average around each run and the commit (flagging uncommitted changes under src/).

Why it is fair, setting by setting:
- the same model and tokenizer (`--checkpoint`, by default checkpoints/calc-sft, a 1.8M-parameter
  Qwen2) and the same prompts, token for token: both sides draw calc's training tasks with
  toolpolicy's `train_seed`, TRL in the same order (`shuffle_dataset=False`), and every
  repeat checks that each episode's prompt ids, as each side sampled from them, are equal;
- the same tools block: `--chat-tools` is toolpolicy's `chat_tools`, template (the
  checkpoint's own tools section) or system (Qwen2.5's Hermes tools block in the system
  message, for a template with none, such as SmolLM2's); TRL's single-turn prompt is
  toolpolicy's own rendering as text, so it holds the same block;
- per step 12 tasks x 8 samples at temperature 1.0 (no top-p/top-k), one generation batch =
  one optimizer step (TRL: `num_iterations=1`, `steps_per_generation` =
  `gradient_accumulation_steps` = 96 / 16, so no extra forward for old log-probabilities);
  micro-batches of 16 on both sides;
- the same objective: GRPO group mean/std advantages, DAPO token-mean loss (TRL's
  `loss_type="dapo"`), clip 0.2/0.28, beta 0 with no reference model (toolpolicy:
  `log_kl: false`), every group trained (toolpolicy: no dynamic sampling), AdamW
  (0.9, 0.99) at a constant lr 1e-4, gradient clip 1.0, no gradient checkpointing (TRL's
  default, switched off);
- the same weights trained, in the same precision: every weight, or with `--lora-rank R` a
  LoRA adapter of rank R and alpha `--lora-alpha` (default 2R) on toolpolicy's
  `lora_target_modules` (the q, k, v, o, gate, up and down projections) with its
  `lora_dropout` (0), given to TRL as `peft_config`; each run records its trainable
  parameters. float32 (TRL's default `bf16` switched off), or with `--dtype bfloat16`
  (toolpolicy's `dtype`, TRL's `bf16`) autocast to bfloat16 with float32 trainable weights;
  a LoRA model's frozen base is then stored in bfloat16 on both sides (TRL loads it so,
  toolpolicy casts it);
- the same budget: `max_completion_length` (TRL) = `max_tokens` = `max_turn_tokens`
  (toolpolicy): tokens after the prompt, tool output included, and the most one turn may sample;
- each run in a fresh process with the same torch thread count (and OMP_NUM_THREADS), runs
  alternated toolpolicy, TRL, toolpolicy, TRL ... so machine drift hits both; the first
  `--warmup` steps of every run are left out. Repeat r uses seed + r for its tasks and
  samples (the same tasks on both sides), so repeats vary the work as well as the machine.

The two settings:
- single_turn: one assistant turn. Both prompts list the calculator (calc-sft was trained
  with it); TRL gets the rendered prompt as text with a plain reward function on the
  completion and runs no tool loop; toolpolicy runs calc with `max_turns: 1`.
- multi_turn: up to 4 assistant turns with the calculator. TRL runs its own tool loop
  (`GRPOTrainer(tools=[calculator])`, `max_tool_calling_iterations=3`): after each turn
  it parses calls with the tokenizer's response template, runs them, appends the tool
  turn's tokens (masked out of the loss) and generates again; toolpolicy runs its engine.
  TRL renders the conversation with the tokenizer's own template, so this setting needs a
  checkpoint whose template has a tools section, and `--chat-tools template`: on SmolLM2's
  template TRL's model would never see the calculator. The bench refuses it there; run such
  a model with `--settings single_turn`.

Where the work is not identical (logged per step so it can be seen):
- sampling is random on each side (own seeds), so the episodes differ; the counts per step
  (sampled tokens, turns, tool calls, accuracy) show they are alike, and the figure is per
  sampled token;
- a malformed call (a few percent of this checkpoint's calls) gets an error observation and
  another turn in toolpolicy; TRL's parser falls back to plain text, so the episode ends there;
- single_turn: a calculator call in the one turn still runs in toolpolicy (its result is
  appended, masked, before the episode is cut), so toolpolicy's sequences are a little longer;
- TRL's reward has calc's correctness and excess-call terms but not the -0.2 per malformed
  call, which it cannot see; the reward changes advantages, not the amount of work;
- toolpolicy puts a step's episodes into micro-batches group by group (each prompt runs
  once, its responses attending to it) and by length within a group; TRL shuffles them
  and runs every prompt with every sample. That is a difference of the implementations,
  which is what is measured;
- with LoRA in bfloat16, TRL samples through peft's `generate`, which calls the inner
  model's forward, not the autocast one: the frozen base runs in bfloat16 as on toolpolicy's
  side, but the adapter's products in float32 (peft casts their input to the adapter's
  dtype), where toolpolicy's autocast runs them in bfloat16. The update is autocast on both.

    OMP_NUM_THREADS=1 .venv/bin/python bench/trl_vs_toolpolicy.py [--steps 3] [--warmup 1] [--repeats 3]
        [--threads 1] [--settings single_turn,multi_turn] [--toolpolicy-set backend=vllm]
    OMP_NUM_THREADS=1 .venv/bin/python bench/trl_vs_toolpolicy.py --checkpoint models/smollm2 \
        --lora-rank 8 --chat-tools system --dtype bfloat16 --settings single_turn

Defaults take about 10 minutes on a quiet 2-core machine; results go to
bench/results/trl_vs_toolpolicy.json, those of another checkpoint, LoRA, dtype or
`--chat-tools` to bench/results/trl_vs_toolpolicy_<checkpoint folder>[_lora<R>][_bf16].json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from grpo_sides import SIDES, Workload, template_shows_tools
from result_file import write_result

ROOT = Path(__file__).resolve().parent.parent
SIDES_SCRIPT = Path(__file__).resolve().parent / "grpo_sides.py"
RESULTS = ROOT / "bench" / "results"
PUBLISHED = {"checkpoint": "checkpoints/calc-sft", "lora_rank": 0, "dtype": "float32", "chat_tools": "template"}
"""The work of bench/results/trl_vs_toolpolicy.json; any other gets a result file of its own (`default_out`)."""
SETTINGS = {  # name -> (max_turns, max_completion_tokens): calc-sft's one turn (64) and episode (192) budgets
    "single_turn": (1, 64),
    "multi_turn": (4, 192),
}
PER_SETTING = ("setting", "max_turns", "max_completion_tokens")
COUNTS = ("episodes", "sampled_tokens", "assistant_turns", "tool_calls", "malformed_calls", "correct")


def workload(args: argparse.Namespace, setting: str, repeat: int) -> Workload:
    """One run's work. Repeat r draws its tasks and samples with seed + r: both sides get the
    same tasks in a repeat, and the repeats together cover more than one set of tasks."""
    max_turns, budget = SETTINGS[setting]
    return Workload(
        setting=setting, checkpoint=args.checkpoint, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha,
        dtype=args.dtype, chat_tools=args.chat_tools, max_turns=max_turns,
        max_completion_tokens=budget, prompts=args.prompts, group_size=args.group_size, micro_batch=args.micro_batch,
        temperature=1.0, lr=1e-4, seed=args.seed + repeat, warmup_steps=args.warmup, steps=args.steps, threads=args.threads,
        toolpolicy_set=args.toolpolicy_set,
    )


def check_tools(parser: argparse.ArgumentParser, args: argparse.Namespace, settings: list[str]) -> None:
    """Refuse work on which the two sides could not show the model the same tools."""
    shows_tools = template_shows_tools(str(ROOT / args.checkpoint))
    if "multi_turn" in settings and not shows_tools:
        parser.error(
            f"multi_turn is not a fair comparison on {args.checkpoint}: its chat template has no tools section (it "
            "renders the same prompt with the calculator as without), and TRL's tool loop renders with that template, "
            "so TRL's model would never see the calculator, which toolpolicy can show such a model only in the system "
            "message (chat_tools: system); run --settings single_turn"
        )
    if "multi_turn" in settings and args.chat_tools != "template":
        parser.error(
            "multi_turn needs --chat-tools template: TRL's tool loop renders tools, calls and results with the "
            "tokenizer's own template, so toolpolicy must show them the same way"
        )
    if args.chat_tools == "template" and not shows_tools:
        parser.error(
            f"the chat template of {args.checkpoint} has no tools section (it renders the same prompt with the "
            "calculator as without); pass --chat-tools system to list the tools in a Hermes block in the system message"
        )


def default_out(args: argparse.Namespace) -> Path:
    """bench/results/trl_vs_toolpolicy.json for the published work, else
    trl_vs_toolpolicy_<checkpoint folder>[_lora<R>][_bf16].json, so it is never overwritten."""
    chosen = {key: getattr(args, key) for key in PUBLISHED}
    if chosen == PUBLISHED:
        return RESULTS / "trl_vs_toolpolicy.json"
    parts = [Path(args.checkpoint).name]
    parts += [f"lora{args.lora_rank}"] if args.lora_rank else []
    parts += ["bf16"] if args.dtype == "bfloat16" else []
    return RESULTS / f"trl_vs_toolpolicy_{'_'.join(parts)}.json"


def run_side(side: str, work: Workload, folder: Path) -> dict[str, Any]:
    """One run of one side in a fresh process; its step records, wall time and the load around it."""
    folder.mkdir(parents=True, exist_ok=True)
    workload_file, out_file, log_file = folder / "workload.json", folder / f"{side}.json", folder / f"{side}.log"
    workload_file.write_text(json.dumps(asdict(work)))
    threads = str(work.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TRL_EXPERIMENTAL_SILENCE": "1"}
    load_before, began = os.getloadavg()[0], time.perf_counter()
    with log_file.open("w") as log:
        command = [sys.executable, str(SIDES_SCRIPT), side, str(workload_file), str(out_file)]
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=log)
    if done.returncode:
        tail = "\n".join(log_file.read_text().splitlines()[-30:])
        raise RuntimeError(f"{side} run failed (exit {done.returncode}); last lines of {log_file}:\n{tail}")
    result = json.loads(out_file.read_text())
    result.update(wall_seconds=time.perf_counter() - began, load_before=load_before, load_after=os.getloadavg()[0])
    return result


def tokens_per_second(steps: list[dict[str, Any]]) -> float:
    return sum(s["sampled_tokens"] for s in steps) / sum(s["seconds"] for s in steps)


def summarise(runs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """One side's figures over its runs' measured steps (warm-up steps dropped from each run)."""
    per_run = [run["steps"][warmup:] for run in runs]
    steps = [step for run in per_run for step in run]
    seconds = [s["seconds"] for s in steps]
    rollout = [s["rollout_seconds"] for s in steps]
    per_step = {key: statistics.mean(s[key] for s in steps) for key in COUNTS}
    return {
        "sampled_tokens_per_s": tokens_per_second(steps),
        "sampled_tokens_per_s_median_step": statistics.median(s["sampled_tokens"] / s["seconds"] for s in steps),
        "s_per_step": statistics.mean(seconds),
        "s_per_step_median": statistics.median(seconds),
        "rollout_s_per_step": statistics.mean(rollout),
        "update_s_per_step": statistics.mean(a - b for a, b in zip(seconds, rollout)),
        "per_repeat_sampled_tokens_per_s": [tokens_per_second(run) for run in per_run],
        "steps_measured": len(steps),
        "per_step": {**per_step, "accuracy": per_step["correct"] / per_step["episodes"]},
    }


def compare(runs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Both sides' figures for one setting and the ratios toolpolicy / TRL (pooled, and per repeat pair)."""
    sides = {side: summarise([r for r in runs if r["side"] == side], warmup) for side in SIDES}
    ours, theirs = sides["toolpolicy"], sides["trl"]
    pairs = zip(ours["per_repeat_sampled_tokens_per_s"], theirs["per_repeat_sampled_tokens_per_s"])
    return {
        **sides,
        "toolpolicy_over_trl": {
            "sampled_tokens_per_s": ours["sampled_tokens_per_s"] / theirs["sampled_tokens_per_s"],
            "sampled_tokens_per_s_per_repeat": [a / b for a, b in pairs],
            "sampled_tokens_per_s_median_step": ours["sampled_tokens_per_s_median_step"]
            / theirs["sampled_tokens_per_s_median_step"],
            "s_per_step": ours["s_per_step"] / theirs["s_per_step"],
        },
        "prompts_identical": all(r["prompts_identical"] for r in runs if r["side"] == "trl"),
    }


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "HEAD") + (" (with uncommitted changes)" if git("status", "--porcelain", "--", "src") else "")


def software() -> dict[str, Any]:
    """The libraries of both sides and toolpolicy's commit. `write_result` adds the machine
    under "machine": CPU, its AVX512-BF16 and AMX-BF16 flags, cores, Python and torch."""
    versions = {name: version(name) for name in ("transformers", "trl", "peft", "toolpolicy")}
    return {**versions, "toolpolicy_commit": git_commit()}


def print_table(settings: dict[str, Any]) -> None:
    print(f"{'setting':12s} {'side':10s} {'tokens/s':>9s} {'s/step':>7s} {'rollout':>8s} {'update':>7s} "
          f"{'tok/step':>8s} {'turns':>6s} {'calls':>6s} {'acc':>5s}")
    for name, result in settings.items():
        for side in SIDES:
            row, work = result[side], result[side]["per_step"]
            print(f"{name:12s} {side:10s} {row['sampled_tokens_per_s']:9.1f} {row['s_per_step']:7.2f} "
                  f"{row['rollout_s_per_step']:8.2f} {row['update_s_per_step']:7.2f} {work['sampled_tokens']:8.0f} "
                  f"{work['assistant_turns']:6.0f} {work['tool_calls']:6.1f} {work['accuracy']:5.2f}")
        ratio = result["toolpolicy_over_trl"]
        spread = ", ".join(f"{r:.2f}" for r in ratio["sampled_tokens_per_s_per_repeat"])
        print(f"{name:12s} toolpolicy / TRL: tokens/s x{ratio['sampled_tokens_per_s']:.2f} (>1: toolpolicy faster; "
              f"per repeat: {spread}; median step: x{ratio['sampled_tokens_per_s_median_step']:.2f}), "
              f"s/step x{ratio['s_per_step']:.2f}; prompts identical: {result['prompts_identical']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="steps run first in every run and left out")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side and setting, alternated with the other side's")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (and OMP_NUM_THREADS) of every run")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of: {', '.join(SETTINGS)}")
    parser.add_argument("--prompts", type=int, default=12, help="tasks per step")
    parser.add_argument("--group-size", type=int, default=8, help="samples per task")
    parser.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first repeat; repeat r uses seed + r")
    parser.add_argument(
        "--checkpoint", default=PUBLISHED["checkpoint"],
        help="model folder both sides train (relative to the repository, or absolute)",
    )
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA adapter rank on both sides; 0 trains every weight")
    parser.add_argument("--lora-alpha", type=int, help="LoRA scaling numerator (default 2 x rank)")
    parser.add_argument(
        "--chat-tools", choices=("template", "system"), default="template",
        help="toolpolicy's chat_tools: the template's own tools section, or a Hermes block in the system message",
    )
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="compute precision (toolpolicy's dtype, TRL's bf16)"
    )
    parser.add_argument(
        "--toolpolicy-set", action="append", default=[], metavar="KEY=VALUE",
        help="extra toolpolicy config field for how it runs (e.g. backend=vllm), as `toolpolicy train --set`",
    )
    parser.add_argument("--work", default="/tmp/bench-trl-vs-toolpolicy", help="run folders and logs")
    parser.add_argument("--out", help="result file (default: see the end of the description)")
    args = parser.parse_args()
    settings = [name.strip() for name in args.settings.split(",") if name.strip()]
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    if args.lora_rank < 0 or (args.lora_alpha is not None and not args.lora_rank):
        parser.error("--lora-rank must be 0 (every weight) or more, and above 0 for --lora-alpha")
    args.lora_alpha = (args.lora_alpha or 2 * args.lora_rank) if args.lora_rank else 0
    args.out = args.out or str(default_out(args))
    check_tools(parser, args, settings)

    schedule = [(repeat, setting, side) for repeat in range(args.repeats) for setting in settings for side in SIDES]
    runs: list[dict[str, Any]] = []
    prompt_ids: dict[tuple[int, str, str], Any] = {}  # every episode's prompt, as each side sampled from it
    bar = tqdm(schedule, desc="runs", unit="run")
    for repeat, setting, side in bar:
        bar.set_description(f"{setting} {side} #{repeat + 1}")
        result = run_side(side, workload(args, setting, repeat), Path(args.work) / f"{setting}-{repeat}")
        prompt_ids[repeat, setting, side] = result.pop("prompt_ids")
        if side == "trl":  # toolpolicy ran this repeat's setting just before
            result["prompts_identical"] = prompt_ids[repeat, setting, "trl"] == prompt_ids[repeat, setting, "toolpolicy"]
        runs.append({"repeat": repeat, "setting": setting, **result})
        bar.set_postfix_str(f"last {tokens_per_second(result['steps'][args.warmup:]):.0f} tok/s")

    results = {
        "what": "sampled tokens per second over whole GRPO steps (rollout + update), toolpolicy train_rl vs trl GRPOTrainer, "
        "same model, prompts, sampling, budget and objective; see the docstring of bench/trl_vs_toolpolicy.py",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "workload": {
            **{k: v for k, v in asdict(workload(args, settings[0], 0)).items() if k not in PER_SETTING},
            "seed": [args.seed + repeat for repeat in range(args.repeats)],
        },
        "settings": {
            name: {
                "max_turns": SETTINGS[name][0], "max_completion_tokens": SETTINGS[name][1],
                **compare([r for r in runs if r["setting"] == name], args.warmup),
            }
            for name in settings
        },
        "software": software(),
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, results)
    print_table(results["settings"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
