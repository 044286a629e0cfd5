"""BFCL v4 from the bfcl-eval package: our matcher against the official checker, and a served oracle end to end."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import toolpolicy.rewards.bfcl_literals
from toolpolicy.cli import main
from toolpolicy.eval.bfcl import BfclFileError
from toolpolicy.eval.bfcl_agreement import ASKED_TWICE, INTENDED_ANSWER_REJECTED, compare, official_checker, right_calls
from toolpolicy.eval.bfcl_v4 import AST_CATEGORIES, CATEGORIES, CATEGORY_GROUPS, bfcl_scores, load_v4, parse_categories
from toolpolicy.rewards.bfcl_literals import java_literal, js_literal, read_java, read_js

SMOKE = Path(__file__).parent.parent / "src" / "toolpolicy" / "configs" / "smoke.yaml"
SERVER = Path(__file__).parent / "fixtures" / "chat_server.py"


@pytest.fixture(scope="module")
def ast_entries():
    return load_v4(AST_CATEGORIES)


def test_literals_read_as_bfcl_reads_them() -> None:
    assert doctest.testmod(toolpolicy.rewards.bfcl_literals).failed == 0
    assert read_java("5", "long") == "5" and read_java("5L", "long") == 5  # wrong form: stays the text
    assert read_java('new String[]{"a", b}', "Array", "String") == ['"a"', "b"]  # array items keep their quotes
    assert read_java('new ArrayList<>(Arrays.asList("a", "b"))', "ArrayList", "String") == ["a", "b"]
    assert read_java('new HashMap<String, Object>() {{ put("k", 1.5); put("s", "x"); }}', "HashMap") == {"k": 1.5, "s": "x"}
    assert read_js("1e3", "float") == "1e3" and read_js("[1, 2]", "array", "float") == [1.0, 2.0]
    assert read_js('{n: "12"}', "dict") == {"n": 12}  # quotes stripped before the value is read
    for value, kind, item in [(2.5, "float", None), (7, "long", None), ([1, 2], "Array", "integer"), (["a", "b"], "ArrayList", "String"),
                              ({"k": "v", "n": 2}, "HashMap", None), (True, "boolean", None), (1e-05, "double", None)]:
        assert read_java(java_literal(value, kind, item), kind, item) == value
    for value, kind, item in [("it's", "String", None), (3.0, "float", None), (12, "Bigint", None), (["x", "y"], "array", "String"),
                              ({"a": 1, "b": "c", "d": [1, "e"]}, "dict", None), (False, "Boolean", None)]:
        assert read_js(js_literal(value, kind, item), kind, item) == value


def test_categories_and_missing_package_say_what_to_do(monkeypatch) -> None:
    assert parse_categories(None) == CATEGORIES and parse_categories("simple_java, live_relevance") == ("simple_java", "live_relevance")
    with pytest.raises(BfclFileError, match="unknown BFCL v4 categories \\['multi_turn_base'\\]"):
        parse_categories("multi_turn_base")
    with pytest.raises(BfclFileError, match="or a group: non_live, live, single_turn, all"):
        parse_categories("nonlive")
    assert parse_categories("non_live,live_simple,simple_java") == CATEGORY_GROUPS["non_live"] + ("live_simple",)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(BfclFileError, match="pip install --no-deps bfcl-eval"):
        load_v4(("simple_python",))


def test_category_groups_are_bfcls_own() -> None:
    """The groups as bfcl-eval names them, read from the installed package."""
    pytest.importorskip("bfcl_eval")
    from bfcl_eval.constants.category_mapping import TEST_COLLECTION_MAPPING

    for group, categories in CATEGORY_GROUPS.items():
        assert parse_categories(group) == categories
        if group != "all":  # bfcl-eval's "all" holds the multi-turn and agentic ones too
            assert sorted(categories) == sorted(TEST_COLLECTION_MAPPING[group]), group


def test_group_scores_follow_bfcl_weighting() -> None:
    rows = {c: {"accuracy": 0.0, "n": 10} for c in CATEGORIES}
    rows["simple_java"] = {"accuracy": 0.6, "n": 100}  # simple = (0 + 0.6 + 0) / 3 = 0.2; non-live = 0.2 / 4
    rows["live_parallel"] = {"accuracy": 1.0, "n": 30}  # live weighs by count: 30 / (10 + 10 + 30 + 10)
    rows["irrelevance"] = {"accuracy": 0.5, "n": 240}  # hallucination = (0.5 + 0) / 2
    scores = bfcl_scores(rows)
    assert scores["non_live_simple"] == pytest.approx(0.2) and scores["non_live"] == pytest.approx(0.05)
    assert scores["live"] == pytest.approx(0.5) and scores["hallucination"] == pytest.approx(0.25)
    assert scores["single_turn"] == pytest.approx((0.05 + 0.5 + 0.25) / 3)
    del rows["multiple"]
    assert bfcl_scores(rows)["non_live"] is None and bfcl_scores(rows)["single_turn"] is None


def test_matcher_agrees_with_the_official_checker_on_every_ast_entry_and_mutation(ast_entries) -> None:
    report = compare(ast_entries)
    assert report["by_category"].keys() == set(AST_CATEGORIES)
    assert sum(r["entries"] for r in report["by_category"].values()) == len(ast_entries) == 2501
    assert report["cases"] > 20 * len(ast_entries)
    print(f"\nagreement with bfcl_eval's ast_checker: {report['agree']}/{report['cases']} cases")
    assert report["disagreements"] == [], "\n".join(f"{d['id']} [{d['case']}] ours={d['ours']} official={d['official']}" for d in report["disagreements"])


def test_the_oracle_answer_is_what_the_official_checker_accepts(ast_entries) -> None:
    official = official_checker()
    rejected = {e.id for e in ast_entries if official(e, right_calls(e, minimal=True)) is not True}
    assert rejected == set(INTENDED_ANSWER_REJECTED)
    # the questions BFCL asks twice, expecting a call once and no call once, with the same tools
    entries = {e.id: e for e in [*ast_entries, *load_v4(("live_irrelevance",))]}
    for asks_a_call, asks_none in ASKED_TWICE.items():
        one, other = entries[asks_a_call], entries[asks_none]
        assert one.messages == other.messages and one.specs() == other.specs()
        assert one.expected and not other.expected


ORACLE_CATEGORIES = ("simple_java", "simple_javascript", "parallel_multiple", "live_parallel", "live_parallel_multiple", "live_relevance", "irrelevance")


def test_eval_bfcl_v4_scores_a_served_oracle(tmp_path: Path, capsys) -> None:
    """Categories of every kind through the CLI and an HTTP endpoint: right wherever BFCL's checker allows it.

    (bench/bfcl_v4.py oracle runs all of them.)
    """
    server = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, text=True, env={**os.environ, "BFCL_ORACLE": "v4"})
    try:
        port = server.stdout.readline().split()[1]
        settings = [f"run.dir={tmp_path}", f"eval.served_url=http://127.0.0.1:{port}/v1", "eval.served_model=bfcl-oracle", "eval.samples=1"]
        args = ["eval", str(SMOKE), "--bfcl", "v4", "--categories", ",".join(ORACLE_CATEGORIES)]
        assert main([*args, *[x for s in settings for x in ("--set", s)]]) == 0
    finally:
        server.kill()
        server.wait()
    summary = json.loads((tmp_path / "eval" / "bfcl_v4.json").read_text())
    results = [json.loads(line) for line in (tmp_path / "eval" / "bfcl_v4_results.jsonl").read_text().splitlines()]
    assert summary["by_category"].keys() == set(ORACLE_CATEGORIES) and summary["n"] == len(results) == 100 + 50 + 200 + 16 + 24 + 16 + 240
    assert {r["id"] for r in results if not r["ok"]} == {"simple_java_36", "simple_java_64", "simple_java_65"}
    assert summary["by_category"]["simple_java"]["accuracy"] == 0.97
    assert all(summary["by_category"][c]["accuracy"] == 1.0 for c in ORACLE_CATEGORIES if c != "simple_java")
    assert summary["groups"]["relevance"] == 1.0 and summary["groups"]["non_live"] is None  # multiple and parallel not run
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in ORACLE_CATEGORIES}
    assert rows.keys() == set(ORACLE_CATEGORIES)  # the live categories are env bfcl's train split, never shown as held out
    assert all(rows[c].endswith("train split" if c.startswith("live_") else "held out") for c in ORACLE_CATEGORIES)
    assert "scored on its own training data" in out
