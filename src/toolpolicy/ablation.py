"""`toolpolicy ablate CONFIG`: several algorithm presets, same environment, seeds and budget.

    toolpolicy ablate src/toolpolicy/configs/ablation.yaml [--presets grpo,dapo] [--seeds 0,1] [--jobs 2]

Every (preset, seed) pair is one RL run from the config's `init_from` (or `cold_start`)
with the config's steps and samples, then one evaluation on the same held-out tasks
(`eval_seed` is shared, so every run faces the same tasks) with the gate off: an
environment with a policy counts the attempts to break it instead of stopping them. Runs go in parallel
processes, `jobs` at a time, each with cores / jobs threads. The run folder gets:

    <preset>-s<seed>/   the run (metrics.jsonl, rl/final, eval/final.json)
    ablation.json       every run's figures
    ablation.md         the table: mean over seeds and the spread (min..max) per preset
    ablation.png        accuracy with each seed's value, tool calls by difficulty (or
                        violation attempts, where tasks have no difficulty),
                        invalid-call rate and the reward curves

A difference between two presets smaller than their seed spread is within noise;
the table marks the presets whose mean accuracy is within the best one's spread.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from statistics import mean
from typing import Any

from tqdm.auto import tqdm

from toolpolicy.build import load_config
from toolpolicy.config import Config, ConfigError

FIGURES = (
    ("accuracy", "accuracy", None),
    ("accuracy easy", "accuracy", "easy"),
    ("accuracy hard", "accuracy", "hard"),
    ("pass^4", "pass_hat_k", "4"),
    ("tool calls easy", "tool_calls_per_episode", "easy"),
    ("tool calls hard", "tool_calls_per_episode", "hard"),
    ("invalid-call rate", "invalid_call_rate", None),
    ("violation attempts", "violations_per_episode", None),
)
"""(label, summary key, group): a group is a difficulty, or for pass^k the k. A column
no run reports (no difficulties, fewer than 4 trials) is left out of the table."""
PERCENT = {"accuracy", "accuracy easy", "accuracy hard", "pass^4", "invalid-call rate"}


def run_ablation(path: str, overrides: list[str], presets: list[str], seeds: list[int], jobs: int) -> Path:
    """Train and evaluate every (preset, seed); write the table and plots; return the table's path.

    Each run's config is the file with its overrides, plus `algorithm.preset`, `run.seed`,
    `run.dir` and `rl.init_from` for that run: the preset sets every field of `algorithm` (and
    `rewards`) the file leaves unset (so an ablation config should set none of them, unless
    all presets are to share it)."""
    cfg = load_config(path, overrides)
    start = cfg.rl.init_from or cfg.sft.cold_start
    if not start:
        raise ConfigError("an ablation starts every run from one checkpoint: set rl.init_from (or sft.cold_start)")
    from toolpolicy.algorithms import PRESETS  # here: importing algorithms loads torch

    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        raise ConfigError(f"unknown preset(s) {unknown}; valid: {sorted(PRESETS)}")
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    pairs = [(preset, seed) for preset in presets for seed in seeds]
    results = []
    context = get_context("spawn")  # fresh interpreters: no torch state shared across forks
    before = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # the runs inherit it: one progress bar for the whole ablation
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [
                pool.submit(train_and_evaluate, path, overrides, start, preset, seed, str(run_dir / f"{preset}-s{seed}"), threads)
                for preset, seed in pairs
            ]
            for future in tqdm(as_completed(futures), total=len(futures), desc="ablation runs", disable=False):
                results.append(future.result())
    finally:
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before
    results.sort(key=lambda r: (presets.index(r["preset"]), r["seed"]))
    (run_dir / "ablation.json").write_text(json.dumps(results, indent=2))
    table = run_dir / "ablation.md"
    table.write_text(ablation_table(results, presets, cfg) + "\n")
    ablation_plot(results, presets, run_dir / "ablation.png")
    return table


def train_and_evaluate(
    path: str, overrides: list[str], start: str, preset: str, seed: int, folder: str, threads: int
) -> dict[str, Any]:
    """One run in its own process: RL with `preset` and `seed`, then the held-out evaluation."""
    from toolpolicy.eval.run import evaluate
    from toolpolicy.report.run_files import read_metrics
    from toolpolicy.trainer.rl import train_rl
    from toolpolicy.build import prepare_run_dir

    own = [f"algorithm.preset={preset}", f"run.seed={seed}", f"run.dir={folder}", f"rl.init_from={start}", f"run.threads={threads}"]
    cfg = load_config(path, [*overrides, *own])
    run_dir = Path(folder)
    began = time.perf_counter()
    final = train_rl(cfg, prepare_run_dir(cfg))
    summary = evaluate(cfg, final, "final", run_dir, gate=False)  # what the policy does with nothing stopping it
    rows = read_metrics(run_dir / "metrics.jsonl")
    if rows is None:
        raise FileNotFoundError(f"{run_dir / 'metrics.jsonl'}: RL wrote no metrics")
    rewards = [r["reward"] for r in rows if r["phase"] == "rl"]
    return {
        "preset": preset,
        "seed": seed,
        "minutes": (time.perf_counter() - began) / 60,
        "figures": {label: figure(summary, key, group) for label, key, group in FIGURES},
        "reward_curve": rewards,
    }


def figure(summary: dict[str, Any], key: str, group: str | None) -> float | None:
    if group is None:
        value = summary.get(key)
    elif key == "pass_hat_k":
        value = summary.get(key, {}).get(group)
    else:
        value = summary.get("by_difficulty", {}).get(group, {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def ablation_table(results: list[dict[str, Any]], presets: list[str], cfg: Config) -> str:
    """Markdown: per preset, the mean over seeds of every figure with its min..max."""
    seeds = sorted({r["seed"] for r in results})
    labels = [label for label, _, _ in FIGURES if any(r["figures"].get(label) is not None for r in results)]
    lines = [
        f"Ablation on `{cfg.env.name}`: {cfg.rl.steps} RL steps x {cfg.rl.prompts_per_step} tasks x {cfg.rl.group_size} samples, "
        f"seeds {seeds}, from `{cfg.rl.init_from or cfg.sft.cold_start}`; held-out {cfg.eval.tasks} tasks x {cfg.eval.samples} "
        "samples. Each cell: mean over seeds (min..max).",
        "",
        "| preset | " + " | ".join(labels) + " | minutes | within noise of best |",
        "|---" * (len(labels) + 3) + "|",
    ]
    spreads = {p: [r["figures"]["accuracy"] for r in results if r["preset"] == p] for p in presets}
    best = max(presets, key=lambda p: mean(spreads[p]))
    for preset in presets:
        runs = [r for r in results if r["preset"] == preset]
        cells = [_cell([r["figures"].get(label) for r in runs], label in PERCENT) for label in labels]
        minutes = mean(r["minutes"] for r in runs)
        noise = "best" if preset == best else ("yes" if max(spreads[preset]) >= min(spreads[best]) else "no")
        lines.append(f"| {preset} | " + " | ".join(cells) + f" | {minutes:.1f} | {noise} |")
    return "\n".join(lines)


def _cell(values: list[float | None], percent: bool) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    scale, unit = (100, "%") if percent else (1, "")
    low, high, avg = min(known) * scale, max(known) * scale, mean(known) * scale
    return f"{avg:.1f}{unit} ({low:.1f}..{high:.1f})" if percent else f"{avg:.2f} ({low:.2f}..{high:.2f})"


def ablation_plot(results: list[dict[str, Any]], presets: list[str], path: Path) -> None:
    """Accuracy per preset (bar: mean, dots: seeds), tool calls by difficulty, invalid-call rate, reward curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from toolpolicy.report.plots import smooth

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    x = range(len(presets))
    by_preset = {p: [r for r in results if r["preset"] == p] for p in presets}

    def bars(ax: Any, label: str, title: str, scale: float = 1.0) -> None:
        means = [mean([(r["figures"].get(label) or 0) * scale for r in by_preset[p]]) for p in presets]
        ax.bar(x, means, color="#457b9d", alpha=0.8)
        for i, p in enumerate(presets):
            values = [(r["figures"].get(label) or 0) * scale for r in by_preset[p]]
            ax.scatter([i] * len(values), values, color="#1d3557", s=14, zorder=3)
        ax.set_xticks(list(x), presets, rotation=30)
        ax.set_title(title)

    bars(axes[0][0], "accuracy", "Held-out accuracy (%), bar = mean, dots = seeds", 100)
    if any(r["figures"].get("tool calls easy") is not None for r in results):
        width = 0.4
        for offset, (label, colour) in zip((-width / 2, width / 2), (("tool calls easy", "#a8dadc"), ("tool calls hard", "#e63946"))):
            means = [mean([r["figures"][label] or 0 for r in by_preset[p]]) for p in presets]
            axes[0][1].bar([i + offset for i in x], means, width, label=label, color=colour)
        axes[0][1].set_xticks(list(x), presets, rotation=30)
        axes[0][1].set_title("Tool calls per episode by difficulty")
        axes[0][1].legend()
    else:
        bars(axes[0][1], "violation attempts", "Policy violation attempts per episode (gate off)")
    bars(axes[1][0], "invalid-call rate", "Invalid-call rate (%)", 100)
    for preset in presets:
        curves = [r["reward_curve"] for r in by_preset[preset] if r["reward_curve"]]
        if curves:
            length = min(len(c) for c in curves)
            averaged = [mean(c[i] for c in curves) for i in range(length)]
            axes[1][1].plot(range(1, length + 1), smooth(averaged), label=preset)
    axes[1][1].set_title("Training reward (mean over seeds, smoothed)")
    axes[1][1].set_xlabel("RL step")
    axes[1][1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
