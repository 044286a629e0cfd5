"""BFCL-style call matching: one hand-written case per rule, and the ToolRL-style reward."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import toolpolicy.rewards.bfcl
from toolpolicy.cli import main
from toolpolicy.eval.bfcl import BfclFileError, load_entries
from toolpolicy.rewards.bfcl import call_reward, match_calls, normalize
from toolpolicy.types import ToolCall

AREA = {
    "name": "triangle_area",
    "description": "Area of a triangle.",
    "parameters": {
        "type": "dict",
        "properties": {
            "base": {"type": "integer"},
            "height": {"type": "float"},
            "unit": {"type": "string"},
            "exact": {"type": "boolean"},
        },
        "required": ["base", "height"],
    },
}
WEATHER = {
    "name": "weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "dict",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "array", "items": {"type": "string"}},
            "options": {"type": "dict"},
        },
        "required": ["city"],
    },
}
FUNCTIONS = [AREA, WEATHER]
AREA_ANSWER = {"triangle_area": {"base": [10], "height": [5.0], "unit": ["cm", "centimeters", ""], "exact": [True, ""]}}
WEATHER_ANSWER = {
    "weather": {"city": ["New York, NY", "NYC"], "days": [["Mon", "Tue"], ""], "options": [{"units": ["metric"], "lang": ["en", ""]}, ""]}
}


def area(**arguments) -> ToolCall:
    return ToolCall("triangle_area", arguments)


def weather(**arguments) -> ToolCall:
    return ToolCall("weather", arguments)


CASES = [
    # (rule, calls, expected answers, matches?)
    ("exact match", [area(base=10, height=5.0)], [AREA_ANSWER], True),
    ("wrong function name", [ToolCall("triangle_areas", {"base": 10, "height": 5.0})], [AREA_ANSWER], False),
    ("required parameter missing", [area(base=10)], [AREA_ANSWER], False),
    ("unknown parameter", [area(base=10, height=5.0, colour="red")], [AREA_ANSWER], False),
    ("optional parameter left out", [area(base=10, height=5.0)], [AREA_ANSWER], True),
    ("optional parameter given right", [area(base=10, height=5.0, unit="centimeters")], [AREA_ANSWER], True),
    ("optional parameter given wrong", [area(base=10, height=5.0, unit="inches")], [AREA_ANSWER], False),
    ("int accepted for float", [area(base=10, height=5)], [AREA_ANSWER], True),
    ("float not accepted for int", [area(base=10.0, height=5.0)], [AREA_ANSWER], False),
    ("string not accepted for number", [area(base="10", height=5.0)], [AREA_ANSWER], False),
    ("bool is not an int", [area(base=True, height=5.0)], [AREA_ANSWER], False),
    ("boolean value", [area(base=10, height=5.0, exact=True)], [AREA_ANSWER], True),
    ("boolean wrong type", [area(base=10, height=5.0, exact="true")], [AREA_ANSWER], False),
    ("wrong number value", [area(base=11, height=5.0)], [AREA_ANSWER], False),
    ("string: case and punctuation ignored", [weather(city="new york ny")], [WEATHER_ANSWER], True),
    ("string: alternative accepted", [weather(city="nyc")], [WEATHER_ANSWER], True),
    ("string: different word", [weather(city="Boston")], [WEATHER_ANSWER], False),
    ("list equal after normalising", [weather(city="NYC", days=["mon", "TUE"])], [WEATHER_ANSWER], True),
    ("list order matters", [weather(city="NYC", days=["Tue", "Mon"])], [WEATHER_ANSWER], False),
    ("list length matters", [weather(city="NYC", days=["Mon"])], [WEATHER_ANSWER], False),
    ("list has wrong type", [weather(city="NYC", days="Mon, Tue")], [WEATHER_ANSWER], False),
    ("dict key by key", [weather(city="NYC", options={"units": "Metric"})], [WEATHER_ANSWER], True),
    ("dict unknown key", [weather(city="NYC", options={"units": "metric", "wind": "kmh"})], [WEATHER_ANSWER], False),
    ("dict wrong value", [weather(city="NYC", options={"units": "imperial"})], [WEATHER_ANSWER], False),
    ("dict required key missing", [weather(city="NYC", options={"lang": "en"})], [WEATHER_ANSWER], False),
    ("parallel in order", [area(base=10, height=5.0), weather(city="NYC")], [AREA_ANSWER, WEATHER_ANSWER], True),
    ("parallel in any order", [weather(city="NYC"), area(base=10, height=5.0)], [AREA_ANSWER, WEATHER_ANSWER], True),
    ("parallel, one call short", [area(base=10, height=5.0)], [AREA_ANSWER, WEATHER_ANSWER], False),
    ("parallel, one too many", [area(base=10, height=5.0)] * 2, [AREA_ANSWER], False),
    (
        "parallel, same function twice with different values",
        [area(base=3, height=5.0), area(base=10, height=5.0)],
        [AREA_ANSWER, {"triangle_area": {"base": [3], "height": [5.0]}}],
        True,
    ),
    ("parallel, each call used once", [area(base=10, height=5.0)] * 2, [AREA_ANSWER, {"triangle_area": {"base": [3], "height": [5.0]}}], False),
    (
        # BFCL pairs greedily: the first expected call takes the first call it accepts (unit="cm"), and the
        # second, which needs unit="cm", is left with the one without; the other pairing would match
        "parallel, paired greedily as BFCL does",
        [area(base=10, height=5.0, unit="cm"), area(base=10, height=5.0)],
        [AREA_ANSWER, {"triangle_area": {"base": [10], "height": [5.0], "unit": ["cm"]}}],
        False,
    ),
    ("bool is never a number, even where answers allow 1", [area(base=True, height=5.0)], [AREA_ANSWER], False),
    ("answers of another type are a variable, compared as written", [area(base="n", height=5.0)],
     [{"triangle_area": {"base": ["n"], "height": [5.0]}}], True),
    ("a variable is not normalised", [area(base="N", height=5.0)], [{"triangle_area": {"base": ["n"], "height": [5.0]}}], False),
    ("list items: the item type or the answer items' type", [weather(city="NYC", days=[1, 2])],
     [{"weather": {"city": ["NYC"], "days": [[1.0, 2.0]]}}], False),
    ("irrelevance: no call is right", [], [], True),
    ("irrelevance: any call is wrong", [weather(city="NYC")], [], False),
    ("relevant: no call is wrong", [], [AREA_ANSWER], False),
]


@pytest.mark.parametrize(("rule", "calls", "expected", "matches"), CASES, ids=[case[0] for case in CASES])
def test_matcher_rules(rule: str, calls: list[ToolCall], expected: list, matches: bool) -> None:
    result = match_calls(calls, FUNCTIONS, expected)
    assert result.ok is matches, result.problems
    assert bool(result.problems) is not matches  # a failure always says why


def test_problems_name_the_parameter() -> None:
    result = match_calls([area(base=10, height=5.0, unit="inches")], FUNCTIONS, [AREA_ANSWER])
    assert result.problems == ("triangle_area.unit: 'inches' is not one of ['cm', 'centimeters', '']",)
    assert "missing required parameter 'height'" in match_calls([area(base=10)], FUNCTIONS, [AREA_ANSWER]).problems[0]


def test_normalize_and_doctests() -> None:
    assert normalize("It's 5-6 p.m.") == 'it"s56pm'
    assert doctest.testmod(toolpolicy.rewards.bfcl).failed == 0


def test_reward_gives_partial_credit() -> None:
    perfect = call_reward([area(base=10, height=5.0)], 0, FUNCTIONS, [AREA_ANSWER])
    assert perfect == {"format": 1.0, "tool_name": 1.0, "param_names": 1.0, "param_values": 1.0, "total": 1.0}
    # right function, one of two required values wrong: names all right, values half right
    half = call_reward([area(base=11, height=5.0)], 0, FUNCTIONS, [AREA_ANSWER])
    assert half["param_names"] == 1.0 and half["param_values"] == 0.5 and half["total"] == pytest.approx(3.5 / 4)
    # an extra unknown parameter: names 2 of 3 agree (Jaccard), values 2 right of 3 needed or given
    extra = call_reward([area(base=10, height=5.0, colour="red")], 0, FUNCTIONS, [AREA_ANSWER])
    assert extra["param_names"] == pytest.approx(2 / 3) and extra["param_values"] == pytest.approx(2 / 3)
    # wrong function: no credit beyond format
    wrong = call_reward([weather(city="NYC")], 0, FUNCTIONS, [AREA_ANSWER])
    assert wrong == {"format": 1.0, "tool_name": 0.0, "param_names": 0.0, "param_values": 0.0, "total": 0.25}
    # one of two parallel calls made, plus a malformed one: names 1/2, format 0
    partial = call_reward([area(base=10, height=5.0)], 1, FUNCTIONS, [AREA_ANSWER, WEATHER_ANSWER])
    assert partial["format"] == 0.0 and partial["tool_name"] == 0.5 and partial["param_values"] == 0.5
    assert call_reward([], 0, FUNCTIONS, [])["total"] == 1.0
    assert call_reward([weather(city="NYC")], 0, FUNCTIONS, [])["total"] == 0.25


SAMPLE = Path(__file__).parent.parent / "examples" / "bfcl" / "sample.jsonl"
SMOKE = Path(__file__).parent.parent / "src" / "toolpolicy" / "configs" / "smoke.yaml"
SERVER = Path(__file__).parent / "fixtures" / "chat_server.py"


def test_the_sample_file_loads_with_every_category() -> None:
    entries = load_entries(SAMPLE)
    assert len(entries) == 24
    assert {e.category for e in entries} == {"simple", "multiple", "parallel", "parallel_multiple", "irrelevance"}
    schema = entries[0].specs()[0].parameters
    assert schema["type"] == "object" and schema["properties"]["amount"]["type"] == "number"


def test_limit_takes_the_first_entries_of_each_category_and_an_entry_samples_alike_in_any_subset(tmp_path: Path) -> None:
    """`--limit 2`: the first two entries of each of the sample's 5 categories (one has a
    single entry), in file order. Each entry samples from its own seeded stream, so with
    --limit it answers exactly as in the full run (at temperature 3, where the tiny model's
    answers vary from draw to draw)."""
    from toolpolicy.eval.bfcl import first_per_category

    entries = load_entries(SAMPLE)
    firsts = first_per_category(entries, 2)
    assert len(firsts) == 2 + 2 + 2 + 2 + 1 and firsts == [e for e in entries if e in firsts]
    assert all(sum(f.category == e.category for f in firsts) == min(2, sum(x.category == e.category for x in entries)) for e in entries)
    assert first_per_category(entries, None) == entries

    shipped = Path(__file__).parent.parent / "checkpoints" / "calc-sft"
    texts = {}
    for limit in ([], ["--limit", "1"]):
        run_dir = tmp_path / f"limit{len(limit)}"
        settings = [f"run.dir={run_dir}", f"eval.checkpoint={shipped}", "eval.temperature=3.0", "rollout.max_turn_tokens=16"]
        assert main(["eval", str(SMOKE), "--bfcl", str(SAMPLE), *limit, *[x for s in settings for x in ("--set", s)]]) == 0
        rows = [json.loads(line) for line in (run_dir / "eval" / "bfcl_results.jsonl").read_text().splitlines()]
        texts[len(limit)] = {r["id"]: r["text"] for r in rows}
    assert len(texts[2]) == 5 and all(texts[0][key] == text for key, text in texts[2].items())
    assert main(["eval", str(SMOKE), "--bfcl", str(SAMPLE), "--limit", "0"]) == 2


def test_trials_score_several_sampled_answers_an_entry_and_their_pass_at_k(tmp_path: Path, capsys) -> None:
    """--trials 3 at temperature 3 (the tiny model's answers vary): three rows an entry, sample 0
    the answer a run of one sample gives, pass@k and pass^k per category from the rows, and the
    table's pass@3 column; greedy with --trials is an error, greedy with the config's samples
    one answer an entry."""
    from toolpolicy.eval.metrics import pass_rates

    shipped = Path(__file__).parent.parent / "checkpoints" / "calc-sft"
    base = ["eval", str(SMOKE), "--bfcl", str(SAMPLE), "--limit", "2", "--set", f"eval.checkpoint={shipped}",
            "--set", "rollout.max_turn_tokens=16"]
    rows, summaries = {}, {}
    for trials, temperature in ((3, 3.0), (1, 3.0), (2, 0.0)):
        run_dir = tmp_path / f"t{trials}"
        settings = ["--set", f"run.dir={run_dir}", "--set", f"eval.temperature={temperature}"]
        assert main([*base, *settings, "--trials", str(trials)]) == (2 if temperature == 0 else 0)
        if temperature:
            rows[trials] = [json.loads(line) for line in (run_dir / "eval" / "bfcl_results.jsonl").read_text().splitlines()]
            summaries[trials] = json.loads((run_dir / "eval" / "bfcl.json").read_text())
    assert "greedy answers are the same every time" in capsys.readouterr().err
    entries = [r["id"] for r in rows[1]]
    assert len(entries) == 9 and [r["id"] for r in rows[3]] == [i for i in entries for _ in range(3)]
    assert [r["sample"] for r in rows[3]] == [0, 1, 2] * 9
    assert [r["text"] for r in rows[3] if r["sample"] == 0] == [r["text"] for r in rows[1]]
    assert len({r["text"] for r in rows[3]}) > 9  # the samples differ
    summary = summaries[3]
    assert summary["n"] == 9 and summary["samples"] == 3 and "pass" not in summaries[1]
    for category, row in summary["by_category"].items():
        ids = dict.fromkeys(r["id"] for r in rows[3] if r["category"] == category)
        right = [sum(r["ok"] for r in rows[3] if r["id"] == i) for i in ids]
        assert row["pass"] == pass_rates(right, 3) and row["accuracy"] == sum(right) / (3 * len(right))
    run_dir = tmp_path / "greedy"
    assert main([*base, "--set", f"run.dir={run_dir}", "--set", "eval.temperature=0", "--set", "eval.samples=4"]) == 0
    assert "one greedy answer an entry (eval.samples 4" in capsys.readouterr().err
    assert len((run_dir / "eval" / "bfcl_results.jsonl").read_text().splitlines()) == 9


def test_eval_bfcl_scores_a_served_oracle_perfectly(tmp_path: Path, capsys) -> None:
    """The oracle sends each entry's first acceptable values (parallel calls reversed): 100%."""
    env = {**os.environ, "BFCL_ORACLE": str(SAMPLE)}
    server = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = server.stdout.readline().split()[1]
        settings = [f"run.dir={tmp_path}", f"eval.served_url=http://127.0.0.1:{port}/v1", "eval.served_model=bfcl-oracle"]
        assert main(["eval", str(SMOKE), "--bfcl", str(SAMPLE), *[x for s in settings for x in ("--set", s)]]) == 0
    finally:
        server.kill()
        server.wait()
    summary = json.loads((tmp_path / "eval" / "bfcl.json").read_text())
    assert summary["n"] == 24 and summary["accuracy"] == 1.0 and summary["reward"]["total"] == 1.0
    assert "parallel_multiple" in capsys.readouterr().out


def test_eval_bfcl_runs_a_local_checkpoint_and_reports_bad_files(tmp_path: Path) -> None:
    shipped = Path(__file__).parent.parent / "checkpoints" / "calc-sft"
    answers = tmp_path / "answers.jsonl"
    questions = tmp_path / "questions.jsonl"
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:4]]
    questions.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "ground_truth"}) + "\n" for r in rows))
    answers.write_text("".join(json.dumps({"id": r["id"], "ground_truth": r["ground_truth"]}) + "\n" for r in rows))
    args = ["eval", str(SMOKE), "--bfcl", str(questions), "--answers", str(answers), "--set", f"run.dir={tmp_path}",
            "--set", f"eval.checkpoint={shipped}"]
    assert main(args) == 0
    results = [json.loads(line) for line in (tmp_path / "eval" / "bfcl_results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["sample"]) for r in results] == [(r["id"], s) for r in rows for s in (0, 1)]  # smoke.yaml: eval.samples 2
    assert all(r["ok"] == (not r["problems"]) for r in results)  # a calculator model cannot book rooms
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "simple_0", "question": "hi", "function": []}\n')
    assert main(["eval", str(SMOKE), "--bfcl", str(broken), "--set", f"eval.checkpoint={shipped}"]) == 2
    with pytest.raises(BfclFileError, match=r"broken.jsonl:1: 'question' must be a list"):
        load_entries(broken)
    with pytest.raises(BfclFileError, match="no ground truth for 'simple_0'"):
        load_entries(questions)
