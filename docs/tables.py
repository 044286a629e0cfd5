"""The results tables of the documentation, rendered from the result files committed beside it.

The pages live in docs/ (and README.md); their figures come from files under docs/results/
and bench/results/; this module, beside the pages, turns those files into the markdown
tables the pages show. It is not part of the toolpolicy package: the package trains and
evaluates, and this file only knows which experiment wrote which table and on which page it
stands (PAGES). Run it with the project's Python (it reads eval summaries with toolpolicy's own
readers), from the repository root:

    python docs/tables.py publish runs/demo/eval/sft.json runs/demo/eval/rl.json --to docs/results/demo
    python docs/tables.py render demo           # prints the markdown table to paste into its page
    python docs/tables.py render bfcl-prose     # a BFCL table, from its bench/results file
    python docs/tables.py pages                 # each table and the page that shows it

`publish` copies eval summaries (eval/NAME.json, keys from toolpolicy.eval.metrics.summarize)
into the repository, adds `published_from` (the file it copied) and copies the eval's
resolved config (NAME.config.yaml) beside it. tests/test_docs_results.py renders every
table from those files and requires its page to contain it verbatim, so a figure on a page
is always one the eval wrote. The BFCL tables (BFCL_TABLES) are rendered the same way
from the results files bench/bfcl_compare.py writes, the distillation tables (DISTILL_TABLES) from
bench/distill_calc.py's, the sampling-speed tables (SPEED_TABLES) from bench/decode_floor.py's
and the AgentDojo task-scope tables (SCOPE_TABLES) from bench/agentdojo_scoped.py's. The
tables carry no bold: a cell to stress is stressed in the prose around it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from toolpolicy.envs.bfcl.single_data import CATEGORIES
from toolpolicy.report.comparison import format_value
from toolpolicy.report.run_files import RunFileError, read_eval

ROOT = Path(__file__).resolve().parents[1]
"""The repository this file belongs to."""
RESULTS = ROOT / "docs" / "results"
"""Where published summaries live, one folder per table."""


def demo_table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The main job's before/after table: SFT vs RL on `calc`'s held-out tasks.

    Changes of rates are in percentage points; of the needless easy calls, relative
    (the goal was to at least halve them); of the hard calls, a difference.
    """

    def rate(label: str, *keys: str) -> tuple[str, ...]:
        b, a = _value(before, *keys), _value(after, *keys)
        return label, _percent(b), _percent(a), f"{(a - b) * 100:+.1f} pts"

    easy_b, easy_a = (_value(s, "by_difficulty", "easy", "tool_calls_per_episode") for s in (before, after))
    hard_b, hard_a = (_value(s, "by_difficulty", "hard", "tool_calls_per_episode") for s in (before, after))
    relative = f"{(easy_a - easy_b) / easy_b * 100:+.0f}%" if easy_b else "n/a"
    return _markdown(
        ("held-out", "SFT (before)", "RL (after)", "change"),
        [
            rate("accuracy", "accuracy"),
            rate("accuracy, easy", "by_difficulty", "easy", "accuracy"),
            rate("accuracy, hard", "by_difficulty", "hard", "accuracy"),
            ("tool calls / episode, easy (all needless)", _count(easy_b), _count(easy_a), relative),
            ("tool calls / episode, hard", _count(hard_b), _count(hard_a), f"{hard_a - hard_b:+.2f}"),
            rate("invalid-call rate", "invalid_call_rate"),
            rate("pass^4 (all 4 samples right)", "pass_hat_k", "4"),
        ],
    )


def hotel_table(
    sft_off: dict[str, Any], rl_off: dict[str, Any], sft_on: dict[str, Any], rl_on: dict[str, Any]
) -> str:
    """The hotel desk's table: SFT and RL models, each with the gate off (shadow) and on."""
    columns = (sft_off, rl_off, sft_on, rl_on)

    def row(label: str, show: Callable[[dict[str, Any]], str]) -> tuple[str, ...]:
        return label, *(show(summary) for summary in columns)

    def pair(first: str, second: str) -> Callable[[dict[str, Any]], str]:
        def show(s: dict[str, Any]) -> str:
            a, b = (_value(s, "by_category", c, "accuracy") for c in (first, second))
            return f"{a * 100:.1f} / {b * 100:.1f}%"
        return show

    return _markdown(
        ("", "SFT, gate off", "RL, gate off", "SFT, gate on", "RL, gate on"),
        [
            row("success (pass^1)", lambda s: _percent(_value(s, "pass_hat_k", "1"))),
            *(row(f"pass^{k}", lambda s, k=k: _percent(_value(s, "pass_hat_k", str(k)))) for k in (2, 3, 4)),
            row("violation attempts / episode", lambda s: _count(_value(s, "violations_per_episode"))),
            row("violating calls that ran / episode", lambda s: _count(_value(s, "violations_run_per_episode"))),
            row("silent wrong-state writes / episode", lambda s: f"{_value(s, 'wrong_writes_per_episode'):.3f}"),
            row("malformed calls", lambda s: _percent(_value(s, "invalid_call_rate"))),
            row("success: feasible / forbidden", pair("feasible", "forbidden")),
            row("success: ambiguous / multi-step", pair("ambiguous", "multi_step")),
            row("tool calls / episode", lambda s: _count(_value(s, "tool_calls_per_episode"))),
        ],
    )


def smollm2_calc_table(always: dict[str, Any], sft: dict[str, Any], rl: dict[str, Any]) -> str:
    """SmolLM2 on `calc`: SFT on a demonstrator that always calls on hard tasks and never on
    easy ones, SFT on the imperfect demonstrator, and RL from the latter; one greedy trial a task."""
    columns = (always, sft, rl)

    def row(label: str, *keys: str, show: Callable[[float], str] = _percent) -> tuple[str, ...]:
        return label, *(show(_value(summary, *keys)) for summary in columns)

    return _markdown(
        ("held-out, greedy", "SFT, always-calling demonstrator", "SFT, imperfect demonstrator", "then RL"),
        [
            row("accuracy", "accuracy"),
            row("accuracy, easy", "by_difficulty", "easy", "accuracy"),
            row("accuracy, hard", "by_difficulty", "hard", "accuracy"),
            row("tool calls / episode, easy (all needless)", "by_difficulty", "easy", "tool_calls_per_episode", show=_count),
            row("tool calls / episode, hard", "by_difficulty", "hard", "tool_calls_per_episode", show=_count),
            row("invalid-call rate", "invalid_call_rate"),
        ],
    )


def methods_table(*results: dict[str, Any]) -> str:
    """Rollout methods against GRPO (bench/methods.py), one block of rows per environment: the
    held-out accuracy over seeds with its 95% t interval, the paired difference to GRPO with
    its interval, the tokens sampled and the minutes a run took."""

    def spread(figure: dict[str, float]) -> str:
        return f"{figure['mean'] * 100:.1f} +- {figure['half_width'] * 100:.1f}"

    rows = []
    for result in results:
        for method, figures in result["summary"].items():
            difference = figures["minus_grpo"]
            rows.append((
                result["env"], method, spread(figures["held_out"]),
                "" if method == "grpo" or difference is None else f"{spread(difference)} pts",
                f"{figures['sampled_tokens'] / 1000:.0f}k", f"{figures['wall_minutes']:.1f}",
            ))
    return _markdown(("env", "method", "held-out accuracy (%)", "minus GRPO", "tokens sampled", "minutes"), rows)


def zoom_table(sft: dict[str, Any], rl_early: dict[str, Any], rl: dict[str, Any]) -> str:
    """The embedded VLM on `zoom` after SFT, part-way through RL and after it. A zoom is faithful
    when its region holds the code: the share is 1 - unfaithful_zooms / tool_call_count (both per
    episode)."""
    columns = (sft, rl_early, rl)

    def faithful(summary: dict[str, Any]) -> float:
        zooms = _value(summary, "rewards", "tool_call_count")
        return 1.0 - _value(summary, "rewards", "unfaithful_zooms") / zooms if zooms else float("nan")

    def row(label: str, *keys: str, show: Callable[[float], str] = _percent) -> tuple[str, ...]:
        return label, *(show(_value(summary, *keys)) for summary in columns)

    return _markdown(
        ("held-out, one sample a task", "SFT", "RL, 300 steps", "RL, 900 steps"),
        [
            row("accuracy", "accuracy"),
            row("accuracy, easy", "by_difficulty", "easy", "accuracy"),
            row("accuracy, hard", "by_difficulty", "hard", "accuracy"),
            row("zooms / episode, easy (all needless)", "by_difficulty", "easy", "tool_calls_per_episode", show=_count),
            row("zooms / episode, hard", "by_difficulty", "hard", "tool_calls_per_episode", show=_count),
            ("zooms whose region holds the code", *(_percent(faithful(summary)) for summary in columns)),
            row("tokens / episode", "tokens_per_episode", show=_count),
        ],
    )


@dataclass(frozen=True)
class BfclTable:
    """A table of BFCL scores from one results file of bench/bfcl_compare.py: a row a run
    (its label, its name in the file, and the run its intervals are against, if any)."""

    source: str
    """The results file, relative to the repository root."""
    rows: tuple[tuple[str, str, str | None], ...]
    against: str = ""
    """What the rows' intervals are against, in the header ("minus SFT, all"); no interval columns when empty."""
    category_digits: int = 1
    whole: bool = True
    """A column of the accuracy over every entry the runs scored."""


def bfcl_table(comparison: dict[str, Any], table: BfclTable) -> str:
    """Accuracy per category (BFCL's order), BFCL's non-live AST summary where every run has it,
    and each row's paired 95% interval over all entries and over those that expect calls."""
    unknown = sorted({name for _, *names in table.rows for name in names if name} - set(comparison["runs"]))
    if unknown:
        raise ValueError(f"{table.source} has no run {', '.join(unknown)} (its runs: {', '.join(comparison['runs'])})")
    runs = [comparison["runs"][run] for _, run, _ in table.rows]
    categories = [c for c in CATEGORIES if all(c in run["by_category"] for run in runs)]
    non_live = all(run["bfcl"]["non_live"] is not None for run in runs)

    def interval(figure: dict[str, float]) -> str:
        return f"{figure['mean'] * 100:+.1f} [{figure['low'] * 100:+.1f}, {figure['high'] * 100:+.1f}]"

    def row(label: str, run: dict[str, Any], name: str, before: str | None) -> tuple[str, ...]:
        cells = [label, *(f"{run['by_category'][c]['accuracy'] * 100:.{table.category_digits}f}%" for c in categories)]
        cells += [_percent(run["bfcl"]["non_live"])] if non_live else []
        cells += [_percent(run["accuracy"])] if table.whole else []
        if table.against:
            difference = comparison["differences"][f"{name} - {before}"] if before else None
            cells += [interval(difference), interval(difference["calls"])] if difference else ["", ""]
        return tuple(cells)

    header = ["model", *categories, *(["non-live AST"] if non_live else []), *(["all entries"] if table.whole else [])]
    header += [f"minus {table.against}, all", f"minus {table.against}, call entries"] if table.against else []
    return _markdown(tuple(header), [row(label, run, name, before) for (label, name, before), run in zip(table.rows, runs)])


ENUMERATED_SFT = (
    "SFT 300, then 50 steps with prose and 1,200 enumerated records (`checkpoints/smollm2-bfcl-enumerated`)", "enumerated50", None,
)
"""The row of the shipped enumerated SFT model, the start of the tables after it."""
BFCL_TABLES: dict[str, BfclTable] = {
    "bfcl-l20": BfclTable("bench/results/bfcl_smollm2_l20.json", (
        ("SmolLM2-135M-Instruct, with the tools block", "base", None),
        ("SFT 50 steps, ground-truth records", "sft50", None),
        ("SFT 80 steps, with 400 composed two-call records", "sft80", None),
        ("SFT 120 steps, 1,200 composed, prompts of at most 1,024 tokens (`checkpoints/smollm2-bfcl-sft`)", "sft120", None),
    ), category_digits=0, whole=False),
    "bfcl-all": BfclTable("bench/results/bfcl_smollm2_all.json", (
        ("base (`models/smollm2`)", "base", None),
        ("SFT 120 steps (`checkpoints/smollm2-bfcl-sft`)", "sft", None),
        ("then RL 40 steps (`checkpoints/smollm2-bfcl-rl`)", "rl", None),
    )),
    "bfcl-sft300": BfclTable("bench/results/bfcl_smollm2_sft300.json", (
        ("SFT 300 steps, 1,800 composed (`checkpoints/smollm2-bfcl-sft300`)", "sft300", None),
        ("then RL 40 steps (`checkpoints/smollm2-bfcl-sft300-rl`)", "sft300_rl40", None),
    )),
    "bfcl-unanswerable": BfclTable("bench/results/bfcl_smollm2_unanswerable.json", (
        ("SFT 300 (`checkpoints/smollm2-bfcl-sft300`)", "sft300", None),
        ("then RL 40, no unanswerable entries", "sft300_rl40", "sft300"),
        ("then RL 60, `env.unanswerable: 300`", "sft300_rl60u300", "sft300"),
        ("then RL 60, `env.unanswerable: 600`", "sft300_rl60u600", "sft300"),
    ), against="SFT"),
    "bfcl-prose": BfclTable("bench/results/bfcl_smollm2_prose.json", (
        ("SFT 300 (`checkpoints/smollm2-bfcl-sft300`)", "sft300", None),
        ("then 50 SFT steps, questions one a line", "lines50", "sft300"),
        ("then 50 SFT steps, questions as prose (instead)", "prose50", "lines50"),
        ("prose, then RL 40, `env.unanswerable: 300`", "prose50_rl40", "prose50"),
    ), against="the row above"),
    "bfcl-train-side": BfclTable("bench/results/bfcl_smollm2_train_side.json", (
        ("SFT 300", "sft300", None),
        ("SFT 300, then RL 40 (`checkpoints/smollm2-bfcl-sft300-rl`)", "rl40", "sft300"),
        ("SFT 300 + 50 prose steps", "prose50", None),
        ("prose 50, then RL 40, `env.unanswerable: 300`", "prose50_rl40u300", "prose50"),
        ("SFT 300 + 200 prose steps (50 + 150)", "prose200", "prose50"),
    ), against="its start"),
    "bfcl-lr": BfclTable("bench/results/bfcl_smollm2_lr.json", (
        ("SFT 300 (`checkpoints/smollm2-bfcl-sft300`, as shipped)", "sft300", None),
        ("then RL 15, lr 5e-5, pool of 40 (`bench/methods.py --env bfcl`, GRPO seed 0)", "rl15_lr5e-5", "sft300"),
        ("then RL 10, lr 5e-5, `env.unanswerable: 300`", "rl10u300_lr5e-5", "sft300"),
        ("then RL 20, lr 5e-5, `env.unanswerable: 300`", "rl20u300_lr5e-5", "sft300"),
        ("then RL 10, lr 2e-4, `env.unanswerable: 300`", "rl10u300_lr2e-4", "sft300"),
        ("then RL 20, lr 2e-4, `env.unanswerable: 300`", "rl20u300_lr2e-4", "sft300"),
    ), category_digits=0, against="SFT"),
    "bfcl-enumerated": BfclTable("bench/results/bfcl_smollm2_enumerated.json", (
        ("SFT 300 (`checkpoints/smollm2-bfcl-sft300`)", "sft300", None),
        ("then 50 SFT steps, composed questions as prose", "prose50", "sft300"),
        ("the same 50 steps with 1,200 enumerated records added (instead)", "enumerated50", "prose50"),
    ), against="the row above"),
    "bfcl-enumerated-rl": BfclTable("bench/results/bfcl_smollm2_enumerated_rl.json", (
        ("SFT 300 (`checkpoints/smollm2-bfcl-sft300`)", "sft300", None),
        ("then 50 SFT steps, prose and 1,200 enumerated records (`checkpoints/smollm2-bfcl-enumerated`)", "enumerated50", "sft300"),
        ("then RL 30, `env.unanswerable: 200`", "rl30", "enumerated50"),
    ), against="the row above"),
    "bfcl-enumerated-rl70": BfclTable("bench/results/bfcl_smollm2_enumerated_rl70.json", (
        ENUMERATED_SFT,
        ("then RL 30, `env.unanswerable: 200`", "rl30", "enumerated50"),
        ("the same run resumed to 70 steps", "rl70", "enumerated50"),
    ), against="the enumerated SFT"),
    "bfcl-optional-given": BfclTable("bench/results/bfcl_smollm2_optional_given.json", (
        ENUMERATED_SFT,
        ("the same 50 steps, `demonstrator.optional: given` (instead)", "given50", "enumerated50"),
        ("then RL 30, `env.unanswerable: 200`", "given50_rl30", "given50"),
    ), against="the row above"),
    "bfcl-rl-temperature": BfclTable("bench/results/bfcl_smollm2_rl_temperature.json", (
        ENUMERATED_SFT,
        ("then RL 30, `env.unanswerable: 200`, temperature 1.0", "rl30_t10", "enumerated50"),
        ("the same RL at temperature 0.7 (instead)", "rl30_t07", "enumerated50"),
        ("that run resumed to 60 steps", "rl60_t07", "enumerated50"),
    ), against="the enumerated SFT"),
    "bfcl-rl-calls-only": BfclTable("bench/results/bfcl_smollm2_rl_calls_only.json", (
        ENUMERATED_SFT,
        ("then RL 30 at temperature 0.7, `env.unanswerable: 200` (above)", "rl30_t07", "enumerated50"),
        ("the same RL on call entries only (instead)", "calls30", "enumerated50"),
        ("that run resumed to 60 steps", "calls60", "enumerated50"),
    ), against="the enumerated SFT"),
    "bfcl-archived": BfclTable("bench/results/bfcl_smollm2_archived.json", (
        ENUMERATED_SFT,
        ("the same 50 steps with the archived entries in the pool, `env.archived: true` (instead)", "archived50", "enumerated50"),
    ), against="the enumerated SFT"),
    "bfcl-rl-groups": BfclTable("bench/results/bfcl_smollm2_rl_groups.json", (
        ENUMERATED_SFT,
        ("then RL 30 at temperature 0.7, 8 tasks x 4 answers a step (above)", "rl30_t07", "enumerated50"),
        ("the same RL with 4 tasks x 8 answers a step (instead)", "g8_t07", "enumerated50"),
    ), against="the enumerated SFT"),
    "bfcl-gemma3": BfclTable("bench/results/bfcl_gemma3_sft300.json", (
        ("SmolLM2-135M-Instruct, SFT 300 (`checkpoints/smollm2-bfcl-sft300`)", "smollm2_sft300", None),
        ("Gemma 3 270M (base), the same SFT", "gemma3_sft300", "smollm2_sft300"),
    ), against="SmolLM2"),
}
"""The BFCL tables, each rendered from the results file bench/bfcl_compare.py wrote."""


@dataclass(frozen=True)
class DistillTable:
    """A table of bench/distill_calc.py's results files: a row an arm of one file (its label,
    the file relative to the repository root, and the arm's name in it)."""

    rows: tuple[tuple[str, str, str], ...]


def distill_table(results: dict[str, dict[str, Any]], table: DistillTable) -> str:
    """Steps until within 2 points of the teacher on each seed ("not in N" for a run of N steps
    that did not get there) and the best held-out accuracy of each run, seed by seed (not for
    an arm the file's `to_target` names: its runs were evaluated up to the target only)."""
    missing = [f"{source}: {arm}" for _, source, arm in table.rows if arm not in results[source]["runs"]]
    if missing:
        raise ValueError(f"no such arm in {', '.join(missing)}")
    seeds = sorted({run["seed"] for _, source, arm in table.rows for run in results[source]["runs"][arm]})

    def steps(run: dict[str, Any] | None) -> str:
        if run is None:
            return ""
        reached = run["steps_to_within_2_points"]
        return f"not in {run['steps']}" if reached is None else str(reached)

    def row(label: str, runs: list[dict[str, Any]], to_target: bool) -> tuple[str, ...]:
        by_seed = {run["seed"]: run for run in runs}
        best = [max(accuracy for step, accuracy in run["held_out"] if step > 0) for run in runs]
        shown = "evaluated up to the target only" if to_target else " / ".join(_percent(value) for value in best)
        return (label, *(steps(by_seed.get(seed)) for seed in seeds), shown)

    rows = [row(label, results[source]["runs"][arm], arm in results[source].get("to_target", [])) for label, source, arm in table.rows]
    return _markdown(("method", *(f"seed {s}" for s in seeds), "best held-out, by seed"), rows)


DISTILL_TABLES: dict[str, DistillTable] = {
    "distill-reward": DistillTable((
        ("GRPO, 100 steps", "bench/results/distill_calc_forward_grpo100.json", "grpo_mb4"),
        ("distillation alone, reverse KL, 30 steps", "bench/results/distill_calc_forward.json", "distill_full_mb4"),
        ("distillation alone, forward KL, 30 steps", "bench/results/distill_calc_forward.json", "distill_forward_mb4"),
        ("reverse KL added to GRPO, 30 steps", "bench/results/distill_calc_reward_seeds.json", "distill_full_reward_mb4"),
    )),
    "distill-one-step": DistillTable((
        ("GRPO", "bench/results/distill_calc_one_step.json", "grpo"),
        ("reverse KL added to GRPO", "bench/results/distill_calc_one_step.json", "distill_full_reward"),
    )),
    "distill-two-step": DistillTable((
        ("GRPO, 1 optimizer step a batch, 200 steps", "bench/results/distill_calc_two_step.json", "grpo"),
        ("reverse KL added to GRPO, 2 optimizer steps a batch, 40 steps", "bench/results/distill_calc_two_step.json",
         "distill_full_reward_mb2"),
        ("reverse KL added to GRPO, 3 optimizer steps a batch, 40 steps", "bench/results/distill_calc_three_step.json",
         "distill_full_reward_mb3"),
    )),
    "distill-cosine": DistillTable((
        ("GRPO, 1 optimizer step a batch, cosine LR over 200 steps", "bench/results/distill_calc_cosine.json", "grpo_cosine"),
        ("reverse KL added to GRPO, 2 optimizer steps a batch, cosine LR over 40 steps", "bench/results/distill_calc_cosine_mb2.json",
         "distill_full_reward_mb2_cosine"),
        ("reverse KL added to GRPO, 3 optimizer steps a batch, cosine LR over 40 steps", "bench/results/distill_calc_cosine.json",
         "distill_full_reward_mb3_cosine"),
        ("reverse KL added to GRPO, 4 optimizer steps a batch, cosine LR over 40 steps", "bench/results/distill_calc_cosine_mb4.json",
         "distill_full_reward_mb4_cosine"),
    )),
    "distill-groups": DistillTable((
        ("GRPO, groups of 8 (12 tasks a step)", "bench/results/distill_calc_cosine.json", "grpo_cosine"),
        ("GRPO, groups of 4 (24 tasks a step)", "bench/results/distill_calc_groups4.json", "grpo_cosine"),
        ("GRPO, groups of 2 (48 tasks a step)", "bench/results/distill_calc_groups2.json", "grpo_cosine"),
        ("reverse KL added to GRPO, groups of 8", "bench/results/distill_calc_cosine.json", "distill_full_reward_mb3_cosine"),
        ("reverse KL added to GRPO, groups of 4", "bench/results/distill_calc_groups4.json", "distill_full_reward_mb3_cosine"),
        ("reverse KL added to GRPO, groups of 2", "bench/results/distill_calc_groups2.json", "distill_full_reward_mb3_cosine"),
        ("reverse KL added to GRPO, groups of 2, teacher weight 2", "bench/results/distill_calc_groups2_coef2.json",
         "distill_full_reward_mb3_cosine"),
        ("GRPO, groups of 2, target from the teacher trained again (97.5%)", "bench/results/distill_calc_groups2_coef3.json",
         "grpo_cosine"),
        ("reverse KL added to GRPO, groups of 2, teacher weight 3, that teacher", "bench/results/distill_calc_groups2_coef3.json",
         "distill_full_reward_mb3_cosine"),
    )),
    "distill-seeds10": DistillTable((
        ("GRPO, groups of 2", "bench/results/distill_calc_groups2_coef3_seeds10.json", "grpo_cosine"),
        ("reverse KL added to GRPO, groups of 2, teacher weight 3", "bench/results/distill_calc_groups2_coef3_seeds10.json",
         "distill_full_reward_mb3_cosine"),
    )),
    "distill-half": DistillTable((
        ("GRPO", "bench/results/distill_calc_half.json", "grpo"),
        ("distillation alone, reverse KL", "bench/results/distill_calc_half.json", "distill_full"),
        ("reverse KL added to GRPO", "bench/results/distill_calc_half.json", "distill_full_reward"),
    )),
}
"""The distillation tables, each rendered from results files bench/distill_calc.py wrote."""


TABLES: dict[str, tuple[Callable[..., str], tuple[str, ...]]] = {
    "demo": (demo_table, ("sft", "rl")),
    "smollm2-calc": (smollm2_calc_table, ("sft-always-calls", "sft", "rl")),
    "hotel": (hotel_table, ("sft-gate-off", "rl-gate-off", "sft-gate-on", "rl-gate-on")),
    "methods": (methods_table, ("calc", "hotel")),
    "methods-teacher": (methods_table, ("hotel",)),
    "methods-bfcl": (methods_table, ("bfcl",)),
    "zoom": (zoom_table, ("sft", "rl-300", "rl")),
}
"""Each table: its renderer and the eval names of its columns, in the renderer's argument order."""


def _on(page: str, *tables: str) -> dict[str, str]:
    return dict.fromkeys(tables, page)


def decode_floor_table(result: dict[str, Any]) -> str:
    """bench/decode_floor.py's synthetic batches: the floor and each sampler's tokens a second."""
    floors = {row["batch"]: row["floor_tokens_per_s"] for row in result["floor"][result["dtype"]]}
    samplers = list(result["sampled"])
    rows = [
        (str(batch), f"{floors[batch]:.0f}", *(
            f"{row['tokens_per_s']:.0f} ({row['share_of_floor']:.0%})" for name in samplers for row in result["sampled"][name] if row["batch"] == batch
        ))
        for batch in sorted(floors)
    ]
    return _markdown(("batch", f"decode floor, {result['dtype']}", *(f"{name}, prefill included (share of the floor)" for name in samplers)), rows)


def rollout_speed_table(result: dict[str, Any]) -> str:
    """bench/decode_floor.py's real RL rollouts: sampled tokens a second by environment and backend."""
    rows = [
        (row["env"], row["backend"], str(row["episodes"]), str(row["tokens"]), f"{row['seconds']:.1f}", f"{row['tokens_per_s']:.0f}")
        for row in result["rollouts"]
    ]
    return _markdown(("environment", "backend", "episodes", "sampled tokens", "seconds", "tokens a second"), rows)


SPEED_TABLES: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "decode-floor": ("bench/results/decode_floor.json", decode_floor_table),
    "rollout-speed": ("bench/results/decode_floor.json", rollout_speed_table),
}
"""The sampling-speed tables: the results file each is rendered from, and how."""


def scope_suites_table(result: dict[str, Any]) -> str:
    """bench/agentdojo_scoped.py's replays per suite, the static policy alone -> narrowed by each
    task's rules-derived scope: false denials of ground-truth calls, injection pairs whose every
    injected call was allowed, the suites' own attack success, and the requests whose scope
    narrows nothing (every tool, no bound, no value list)."""
    rows = []
    for name, suite in result["suites"].items():
        replay = suite["rules"]  # the scopes the rules files derive; a planner's are under "planner"
        unnarrowed = sorted(replay["unnarrowed_tasks"], key=lambda task: int(task.rsplit("_", 1)[1]))
        rows.append((
            name, str(replay["user_tasks"]), str(replay["benign_calls"]),
            f"{len(replay['false_denials_static'])} -> {len(replay['false_denials_scoped'])}",
            str(replay["pairs"]),
            f"{_percent(replay['injections_admitted_static'])} -> {_percent(replay['injections_admitted_scoped'])}",
            f"{_percent(replay['attack_success_static'])} -> {_percent(replay['attack_success_scoped'])}",
            ", ".join(f"`{task}`" for task in unnarrowed) or "none",
        ))
    return _markdown(
        ("suite", "user tasks", "benign calls", "false denials, static -> scoped", "injection pairs",
         "AgentDojo injections whose every call was allowed, static -> scoped", "attack success, static -> scoped",
         "requests not narrowed"),
        rows,
    )


def scope_goals_table(result: dict[str, Any]) -> str:
    """bench/agentdojo_scoped.py's attacker goals (calls the static policy admits), each replayed
    after every user task's calls: in how many tasks' contexts every call of it was allowed,
    static policy alone -> narrowed by the task's scope."""
    def allowed(tasks: dict[str, Any], replay: str) -> str:
        return f"{len(tasks[f'admitted_{replay}'])} of {tasks['user_tasks']}"

    rows = [
        (name, f"`{goal}`", f"{allowed(tasks, 'static')} -> {allowed(tasks, 'scoped')}")
        for name, suite in result["suites"].items() for goal, tasks in suite["rules"]["goals"].items()
    ]
    return _markdown(("suite", "goal (calls the static policy admits)",
                      "user tasks in whose context it was allowed, static -> scoped"), rows)


SCOPE_TABLES: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "agentdojo-scope": ("docs/results/agentdojo/scoped.json", scope_suites_table),
    "agentdojo-scope-goals": ("docs/results/agentdojo/scoped.json", scope_goals_table),
}
"""The task-scope tables of AgentDojo: the results file each is rendered from, and how."""
ONE_FILE_TABLES = {**SPEED_TABLES, **SCOPE_TABLES}
"""The tables rendered by a function of one results file."""


PAGES: dict[str, str] = {
    **_on("README.md", "demo"),
    **_on("docs/experiments/calc.md", "smollm2-calc"),
    **_on("docs/experiments/hotel.md", "hotel"),
    **_on("docs/experiments/zoom.md", "zoom"),
    **_on("docs/experiments/methods.md", "methods", "methods-teacher", "methods-bfcl"),
    **_on("docs/experiments/bfcl-sft-and-rl.md", "bfcl-l20", "bfcl-all", "bfcl-sft300", "bfcl-unanswerable", "bfcl-prose",
          "bfcl-train-side", "bfcl-gemma3", "bfcl-lr"),
    **_on("docs/experiments/bfcl-enumerated.md", "bfcl-enumerated", "bfcl-enumerated-rl", "bfcl-enumerated-rl70",
          "bfcl-optional-given", "bfcl-rl-temperature", "bfcl-rl-calls-only", "bfcl-rl-groups", "bfcl-archived"),
    **_on("docs/experiments/distillation.md", *DISTILL_TABLES),
    **_on("docs/speed.md", *SPEED_TABLES),
    **_on("docs/agentdojo.md", *SCOPE_TABLES),
}
"""Each table and the page that shows it (relative to the repository root): the one place a table
is placed. tests/test_docs_results.py requires every table of TABLES, BFCL_TABLES,
DISTILL_TABLES, SPEED_TABLES and SCOPE_TABLES to have a page here, and the page to contain the table as `render` writes it."""


def summary_paths(table: str, results: Path = RESULTS) -> list[Path]:
    """The files a table is rendered from: results/TABLE/NAME.json for each column; for a BFCL,
    distillation, speed or scope table its results files, under the repository that holds
    `results` (docs/results)."""
    if table in BFCL_TABLES:
        return [results.parents[1] / BFCL_TABLES[table].source]
    if table in DISTILL_TABLES:
        return [results.parents[1] / source for source in dict.fromkeys(source for _, source, _ in DISTILL_TABLES[table].rows)]
    if table in ONE_FILE_TABLES:
        return [results.parents[1] / ONE_FILE_TABLES[table][0]]
    return [results / table / f"{name}.json" for name in TABLES[table][1]]


def render(table: str, results: Path = RESULTS) -> str:
    """The table as markdown; FileNotFoundError naming every missing summary."""
    paths = summary_paths(table, results)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"the {table} table needs {', '.join(missing)}: run the evals and `publish` them")
    if table in BFCL_TABLES:
        return bfcl_table(json.loads(paths[0].read_text()), BFCL_TABLES[table])
    if table in DISTILL_TABLES:
        return distill_table({str(p.relative_to(results.parents[1])): json.loads(p.read_text()) for p in paths}, DISTILL_TABLES[table])
    if table in ONE_FILE_TABLES:
        return ONE_FILE_TABLES[table][1](json.loads(paths[0].read_text()))
    renderer, _ = TABLES[table]
    return renderer(*(read_eval(p) for p in paths))


def publish(sources: list[Path], to: Path) -> list[Path]:
    """Copy eval summaries into `to`, each with `published_from` added, and their configs beside them."""
    to.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sources:
        summary = read_eval(source)
        if summary is None:
            raise RunFileError(f"{source}: no such eval summary")
        target = to / source.name
        target.write_text(json.dumps({**summary, "published_from": str(source)}, indent=2) + "\n")
        written.append(target)
        config = source.with_name(f"{source.stem}.config.yaml")
        if config.is_file():
            shutil.copyfile(config, to / config.name)
            written.append(to / config.name)
    return written


def _value(summary: dict[str, Any], *keys: str) -> float:
    """summary[k1][k2]...; a ValueError naming the summary and the keys if absent."""
    value: Any = summary
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"eval summary {summary.get('name', '?')!r} has no number at {'.'.join(keys)}")
    return float(value)


def _percent(value: float) -> str:
    return format_value(value, "rate")


def _count(value: float) -> str:
    return format_value(value, "count")


def _markdown(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Cells padded by one space as the pages write them: `| a | b |`, `|---|---|`, `| |` when empty."""
    lines = ["|" + "|".join(f" {cell} " if cell else " " for cell in line) + "|" for line in [header, *rows]]
    return "\n".join([lines[0], "|" + "---|" * len(header), *lines[1:]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python docs/tables.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    pub = commands.add_parser("publish", help="copy eval summaries (RUN_DIR/eval/NAME.json) into the repository")
    pub.add_argument("summaries", type=Path, nargs="+")
    pub.add_argument("--to", type=Path, required=True, help=f"e.g. {RESULTS}/demo")
    show = commands.add_parser("render", help="print a table from the published summaries")
    show.add_argument("table", choices=sorted([*TABLES, *BFCL_TABLES, *DISTILL_TABLES, *ONE_FILE_TABLES]))
    show.add_argument("--results", type=Path, default=RESULTS, help="the folder holding one folder per table")
    commands.add_parser("pages", help="list each table and the page that shows it")
    args = parser.parse_args(argv)
    try:
        if args.command == "publish":
            for path in publish(args.summaries, args.to):
                print(f"wrote {path}")
        elif args.command == "pages":
            for table, page in PAGES.items():
                print(f"{table:24} {page}")
        else:
            print(render(args.table, args.results))
    except (FileNotFoundError, ValueError) as err:  # RunFileError is a ValueError
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
