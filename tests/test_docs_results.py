"""The docs' results tables and the shipped checkpoint's hash equal the committed files they come from.

A table's figures are eval summaries published under docs/results/TABLE/ (or a bench's
results file under bench/results/), rendered by docs/tables.py, and shown on the page
docs/tables.py's PAGES names for it. To refresh one: run the evals, then

    python docs/tables.py publish RUN_DIR/eval/NAME.json ... --to docs/results/TABLE
    python docs/tables.py render TABLE    # paste into its page (python docs/tables.py pages lists them)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
README = ROOT / "README.md"
CHECKPOINT_HASH = RESULTS / "calc-sft.sha256"


def _docs_tables():
    """docs/tables.py, loaded from its file: it lives beside the pages, outside the package."""
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "docs" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


tables = _docs_tables()
BFCL_TABLES, DISTILL_TABLES, PAGES, TABLES = tables.BFCL_TABLES, tables.DISTILL_TABLES, tables.PAGES, tables.TABLES
SPEED_TABLES, SCOPE_TABLES = tables.SPEED_TABLES, tables.SCOPE_TABLES
BfclTable, DistillTable = tables.BfclTable, tables.DistillTable
bfcl_table, demo_table, distill_table, hotel_table = tables.bfcl_table, tables.demo_table, tables.distill_table, tables.hotel_table
main, render, summary_paths = tables.main, tables.render, tables.summary_paths
scope_goals_table, scope_suites_table = tables.scope_goals_table, tables.scope_suites_table


def assert_page_shows(table: str) -> None:
    page = PAGES[table]
    missing = [str(p.relative_to(ROOT)) for p in summary_paths(table, RESULTS) if not p.is_file()]
    if missing:
        pytest.fail(f"{page}'s {table} table has no published source: missing {', '.join(missing)}. Run the evals, then "
                    f"`python docs/tables.py publish RUN_DIR/eval/NAME.json ... --to docs/results/{table}`",
                    pytrace=False)
    rendered = render(table, RESULTS)
    if rendered not in (ROOT / page).read_text():
        pytest.fail(f"{page}'s {table} table differs from its published source; it should read:\n{rendered}", pytrace=False)


def test_every_table_has_one_page_that_exists():
    registered = {*TABLES, *BFCL_TABLES, *DISTILL_TABLES, *SPEED_TABLES, *SCOPE_TABLES}
    assert set(PAGES) == registered, f"tables without a page: {sorted(registered - set(PAGES))}; pages of no table: {sorted(set(PAGES) - registered)}"
    assert all((ROOT / page).is_file() for page in PAGES.values()), [page for page in PAGES.values() if not (ROOT / page).is_file()]


def test_demo_table_is_the_published_eval():
    assert PAGES["demo"] == "README.md"  # the main job's result is the guide's own
    assert_page_shows("demo")


def test_hotel_table_is_the_published_eval():
    assert_page_shows("hotel")


def test_methods_table_is_the_published_benchmark():
    assert_page_shows("methods")


def test_distillation_methods_table_is_the_published_benchmark():
    assert_page_shows("methods-teacher")


def test_bfcl_methods_table_is_the_published_benchmark():
    assert_page_shows("methods-bfcl")


def test_zoom_table_is_the_published_eval():
    assert_page_shows("zoom")


def test_smollm2_calc_table_is_the_published_eval():
    assert_page_shows("smollm2-calc")


@pytest.mark.parametrize("table", sorted(BFCL_TABLES))
def test_bfcl_tables_are_the_published_comparisons(table):
    assert_page_shows(table)


@pytest.mark.parametrize("table", sorted(DISTILL_TABLES))
def test_distillation_tables_are_the_published_benchmarks(table):
    assert_page_shows(table)


def test_readme_quotes_the_recorded_hash_of_the_shipped_checkpoint():
    digest, path = CHECKPOINT_HASH.read_text().split()  # sha256sum's "HASH  PATH", checkable with sha256sum -c
    assert path == "checkpoints/calc-sft/model.safetensors"
    assert hashlib.sha256((ROOT / path).read_bytes()).hexdigest() == digest, f"{path} is not the file {CHECKPOINT_HASH} records"
    assert f"`{digest}`" in README.read_text(), f"README.md does not quote the SHA-256 in {CHECKPOINT_HASH}"


def calc_summary(accuracy, easy, hard, calls_easy, calls_hard, invalid, pass4):
    by_difficulty = {"easy": {"accuracy": easy, "tool_calls_per_episode": calls_easy},
                     "hard": {"accuracy": hard, "tool_calls_per_episode": calls_hard}}
    return {"accuracy": accuracy, "by_difficulty": by_difficulty, "invalid_call_rate": invalid, "pass_hat_k": {"4": pass4}}


def test_demo_table_rows_and_formats():
    before = calc_summary(0.6567, 0.9914, 0.3350, 0.3844, 0.3562, 0.0711, 0.47333)
    after = calc_summary(0.9650, 0.9677, 0.9624, 0.0, 1.0, 0.0, 0.9100)
    # changes from the unrounded values: easy 96.77 - 99.14 = -2.37 -> -2.4 pts; hard calls 1 - 0.3562 = +0.64;
    # easy calls relative, (0 - 0.3844) / 0.3844 = -100%; pass^4 91.00 - 47.333 = +43.67 -> +43.7 pts
    assert demo_table(before, after) == """\
| held-out | SFT (before) | RL (after) | change |
|---|---|---|---|
| accuracy | 65.7% | 96.5% | +30.8 pts |
| accuracy, easy | 99.1% | 96.8% | -2.4 pts |
| accuracy, hard | 33.5% | 96.2% | +62.7 pts |
| tool calls / episode, easy (all needless) | 0.38 | 0.00 | -100% |
| tool calls / episode, hard | 0.36 | 1.00 | +0.64 |
| invalid-call rate | 7.1% | 0.0% | -7.1 pts |
| pass^4 (all 4 samples right) | 47.3% | 91.0% | +43.7 pts |"""


def test_demo_table_without_easy_calls_before_has_no_relative_change():
    summary = calc_summary(0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 0.25)
    assert "| tool calls / episode, easy (all needless) | 0.00 | 0.00 | n/a |" in demo_table(summary, summary)


def test_demo_table_names_a_missing_figure():
    summary = calc_summary(0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 0.25)
    del summary["pass_hat_k"]
    with pytest.raises(ValueError, match=r"'sft' has no number at pass_hat_k\.4"):
        demo_table({**summary, "name": "sft"}, summary)


def hotel_summary(pass_hat, violations, ran, wrong_writes, malformed, categories, calls):
    return {
        "pass_hat_k": {str(k): p for k, p in enumerate(pass_hat, start=1)},
        "violations_per_episode": violations, "violations_run_per_episode": ran,
        "wrong_writes_per_episode": wrong_writes, "invalid_call_rate": malformed, "tool_calls_per_episode": calls,
        "by_category": {c: {"accuracy": a} for c, a in zip(("feasible", "forbidden", "ambiguous", "multi_step"), categories)},
    }


def test_hotel_table_rows_and_formats():
    sft_off = hotel_summary((0.6833, 0.5667, 0.5125, 0.4833), 0.967, 0.967, 0.0042, 0.027, (0.879, 0.278, 0.812, 0.8), 2.57)
    rl_off = hotel_summary((0.9125, 0.875, 0.8375, 0.8), 0.033, 0.033, 0.0208, 0.010, (0.922, 0.917, 0.875, 0.9), 2.82)
    sft_on = hotel_summary((0.4375, 0.2306, 0.1292, 0.0833), 1.05, 0.0, 0.0833, 0.173, (0.517, 0.347, 0.375, 0.4), 2.35)
    rl_on = hotel_summary((0.9167, 0.8833, 0.85, 0.8167), 0.021, 0.0, 0.0208, 0.009, (0.922, 0.917, 0.875, 0.95), 2.79)
    assert hotel_table(sft_off, rl_off, sft_on, rl_on) == """\
| | SFT, gate off | RL, gate off | SFT, gate on | RL, gate on |
|---|---|---|---|---|
| success (pass^1) | 68.3% | 91.2% | 43.8% | 91.7% |
| pass^2 | 56.7% | 87.5% | 23.1% | 88.3% |
| pass^3 | 51.2% | 83.8% | 12.9% | 85.0% |
| pass^4 | 48.3% | 80.0% | 8.3% | 81.7% |
| violation attempts / episode | 0.97 | 0.03 | 1.05 | 0.02 |
| violating calls that ran / episode | 0.97 | 0.03 | 0.00 | 0.00 |
| silent wrong-state writes / episode | 0.004 | 0.021 | 0.083 | 0.021 |
| malformed calls | 2.7% | 1.0% | 17.3% | 0.9% |
| success: feasible / forbidden | 87.9 / 27.8% | 92.2 / 91.7% | 51.7 / 34.7% | 92.2 / 91.7% |
| success: ambiguous / multi-step | 81.2 / 80.0% | 87.5 / 90.0% | 37.5 / 40.0% | 87.5 / 95.0% |
| tool calls / episode | 2.57 | 2.82 | 2.35 | 2.79 |"""


def test_publish_then_render(tmp_path, capsys):
    evals = tmp_path / "run" / "eval"
    evals.mkdir(parents=True)
    for name, summary in (("sft", calc_summary(0.5, 1.0, 0.0, 0.5, 0.0, 0.1, 0.25)),
                          ("rl", calc_summary(0.75, 1.0, 0.5, 0.25, 1.0, 0.0, 0.5))):
        (evals / f"{name}.json").write_text(json.dumps({"name": name, **summary}))
    (evals / "sft.config.yaml").write_text("env: calc\n")
    results = tmp_path / "results"

    assert main(["publish", str(evals / "sft.json"), "--to", str(results / "demo")]) == 0
    published = json.loads((results / "demo" / "sft.json").read_text())
    assert published["published_from"] == str(evals / "sft.json") and published["accuracy"] == 0.5
    assert (results / "demo" / "sft.config.yaml").read_text() == "env: calc\n"
    capsys.readouterr()
    assert main(["render", "demo", "--results", str(results)]) == 1
    assert f"needs {results / 'demo' / 'rl.json'}:" in capsys.readouterr().err

    assert main(["publish", str(evals / "rl.json"), "--to", str(results / "demo")]) == 0
    capsys.readouterr()
    assert main(["render", "demo", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| held-out | SFT (before) | RL (after) | change |\n")
    assert "| tool calls / episode, easy (all needless) | 0.50 | 0.25 | -50% |" in out


def test_distill_table_steps_per_seed_best_accuracy_and_an_unknown_arm():
    def run(seed, reached, steps, *curve):
        return {"seed": seed, "steps_to_within_2_points": reached, "steps": steps, "held_out": [[0, 0.9], *curve]}

    results = {
        "long.json": {"runs": {"grpo": [run(0, None, 100, [50, 0.5], [100, 0.75]), run(2, 40, 100, [40, 0.875])]}},
        "short.json": {"runs": {"mixed": [run(0, 10, 30, [10, 0.96875], [20, 0.25]), run(1, None, 30, [30, 0.125])]}},
    }
    table = DistillTable((("GRPO", "long.json", "grpo"), ("mixed", "short.json", "mixed")))
    assert distill_table(results, table).splitlines() == [
        "| method | seed 0 | seed 1 | seed 2 | best held-out, by seed |",
        "|---|---|---|---|---|",
        "| GRPO | not in 100 | | 40 | 75.0% / 87.5% |",
        "| mixed | 10 | not in 30 | | 96.9% / 12.5% |",
    ]
    with pytest.raises(ValueError, match="no such arm in short.json: grpo"):
        distill_table(results, DistillTable((("x", "short.json", "grpo"),)))
    # An arm evaluated only up to its first checkpoint within 2 points has no best to show.
    results["long.json"]["to_target"] = ["grpo"]
    assert distill_table(results, table).splitlines()[2] == "| GRPO | not in 100 | | 40 | evaluated up to the target only |"


def test_bfcl_table_rows_intervals_and_an_unknown_run():
    def run(accuracy, python, irrelevance, non_live):
        return {"accuracy": accuracy, "bfcl": {"non_live": non_live},
                "by_category": {"irrelevance": {"accuracy": irrelevance}, "simple_python": {"accuracy": python}}}

    comparison = {"runs": {"a": run(0.5, 0.25, 1.0, 0.0625), "b": run(0.625, 0.5, 0.75, 0.125)},
                  "differences": {"b - a": {"mean": 0.125, "low": -0.01, "high": 0.26, "calls": {"mean": 0.25, "low": 0.1, "high": 0.4}}}}
    table = BfclTable("x.json", (("first", "a", None), ("second", "b", "a")), against="the first")
    assert bfcl_table(comparison, table).splitlines() == [
        "| model | simple_python | irrelevance | non-live AST | all entries | minus the first, all | minus the first, call entries |",
        "|---|---|---|---|---|---|---|",
        "| first | 25.0% | 100.0% | 6.2% | 50.0% | | |",
        "| second | 50.0% | 75.0% | 12.5% | 62.5% | +12.5 [-1.0, +26.0] | +25.0 [+10.0, +40.0] |",
    ]
    assert bfcl_table(comparison, BfclTable("x.json", (("a", "a", None),), category_digits=0, whole=False)).splitlines()[2] == "| a | 25% | 100% | 6.2% |"
    with pytest.raises(ValueError, match=r"x.json has no run c \(its runs: a, b\)"):
        bfcl_table(comparison, BfclTable("x.json", (("c", "c", "a"),)))


@pytest.mark.parametrize("table", sorted(SPEED_TABLES))
def test_speed_tables_are_the_published_benchmark(table):
    assert_page_shows(table)


@pytest.mark.parametrize("table", sorted(SCOPE_TABLES))
def test_agentdojo_scope_tables_are_the_published_replay(table):
    assert PAGES[table] == "docs/agentdojo.md"
    assert_page_shows(table)


def test_scope_tables_rows_and_formats():
    def replay(unnarrowed, goals, denials_static=0, denials_scoped=0):
        return {"rules": {
            "user_tasks": 12, "benign_calls": 30, "pairs": 48,
            "false_denials_static": [{}] * denials_static, "false_denials_scoped": [{}] * denials_scoped,
            "injections_admitted_static": 2 / 48, "injections_admitted_scoped": 1 / 48,
            "attack_success_static": 0.0, "attack_success_scoped": 0.0,
            "unnarrowed_tasks": unnarrowed, "goals": goals,
        }}

    goal = {"user_tasks": 12, "admitted_static": ["user_task_0", "user_task_1", "user_task_2"], "admitted_scoped": ["user_task_2"]}
    result = {"suites": {"slack": replay(["user_task_10", "user_task_9"], {"post": goal}, 1, 1),
                         "travel": {**replay([], {"mail": {**goal, "admitted_scoped": []}}), "planner": {}}}}
    # 2 / 48 = 4.17% -> 4.2%, 1 / 48 = 2.08% -> 2.1%; user tasks sorted by number, not as text
    assert scope_suites_table(result).splitlines()[2:] == [
        "| slack | 12 | 30 | 1 -> 1 | 48 | 4.2% -> 2.1% | 0.0% -> 0.0% | `user_task_9`, `user_task_10` |",
        "| travel | 12 | 30 | 0 -> 0 | 48 | 4.2% -> 2.1% | 0.0% -> 0.0% | none |",
    ]
    assert scope_goals_table(result).splitlines()[2:] == [
        "| slack | `post` | 3 of 12 -> 1 of 12 |",
        "| travel | `mail` | 3 of 12 -> 0 of 12 |",
    ]
