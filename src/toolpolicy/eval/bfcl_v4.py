"""BFCL v4's single-turn categories, read from the installed `bfcl-eval` package.

`toolpolicy eval CONFIG --bfcl v4 [--categories simple_python,live_multiple ...]`
scores a model on the Berkeley Function Calling Leaderboard's own test files and
possible answers (`bfcl_eval/data/`), nothing copied into this repository. The
package is installed without its dependencies (`pip install --no-deps
bfcl-eval`); only its data files are read here, as JSON.

The model sees each entry as BFCL shows it to a function-calling model: every
description ends with the language hint, Java and JavaScript parameters are
strings holding a source literal (their type named in the description), and "."
in function names is written "_". Irrelevance entries pass when no call is
made, relevance entries when any call is.

Scores follow BFCL's leaderboard: per-category accuracy; non-live AST as the
unweighted mean of simple (itself the mean of Python, Java and JavaScript),
multiple, parallel and parallel multiple; live AST as the accuracy over all live
AST entries (weighted by count); hallucination as the mean of irrelevance and
live irrelevance. BFCL v4's overall score weights non-live, live, hallucination,
multi-turn and agentic 10:10:10:30:40; `single_turn` is the first three at their
equal weights, the part of the overall that these categories decide.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from toolpolicy.envs.bfcl.data import BfclDataError, data_dir
from toolpolicy.eval.bfcl import BfclFileError, Entry, check_names
from toolpolicy.types import Message

AST_CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
)
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
CATEGORIES = AST_CATEGORIES + RELEVANCE_CATEGORIES
NON_LIVE_SIMPLE = ("simple_python", "simple_java", "simple_javascript")
NON_LIVE_REST = ("multiple", "parallel", "parallel_multiple")
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
HALLUCINATION = ("irrelevance", "live_irrelevance")
OVERALL_WEIGHTS = {"non_live": 10, "live": 10, "hallucination": 10, "multi_turn": 30, "agentic": 40}
"""BFCL v4's weights for its overall score."""
INSTALL = "pip install --no-deps bfcl-eval==2026.3.23"
_HINTS = {"python": "Python 3 syntax", "java": "Java 8 SDK syntax", "javascript": "JavaScript syntax"}


def data_folder() -> Path:
    """`bfcl_eval/data` of the installed package, found without importing it (its imports pull API clients)."""
    try:
        return data_dir()
    except BfclDataError as error:
        raise BfclFileError(f"BFCL v4 reads its data from the bfcl-eval package: {error}") from None


def parse_categories(text: str | None) -> tuple[str, ...]:
    """A comma-separated list of categories ("all", or none given: every single-turn one)."""
    if not text or text == "all":
        return CATEGORIES
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in CATEGORIES]
    if unknown:
        raise BfclFileError(f"unknown BFCL v4 categories {unknown}; choose from {', '.join(CATEGORIES)}")
    return names


def load_v4(categories: tuple[str, ...] = CATEGORIES, folder: Path | None = None) -> list[Entry]:
    """Every entry of the categories, with its possible answers."""
    folder = folder or data_folder()
    entries = []
    for category in categories:
        rows = _read(folder / f"BFCL_v4_{category}.json")
        answers = {} if category in RELEVANCE_CATEGORIES else {r["id"]: r["ground_truth"] for r in _read(folder / "possible_answer" / f"BFCL_v4_{category}.json")}
        for row in rows:
            entries.append(_entry(row, category, answers, folder))
    return entries


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise BfclFileError(f"{path}: missing from the bfcl-eval package; reinstall it: {INSTALL}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def language_of(category: str) -> str:
    return {"simple_java": "java", "simple_javascript": "javascript"}.get(category, "python")


def _entry(row: dict[str, Any], category: str, answers: dict[str, Any], folder: Path) -> Entry:
    where = f"{folder}/BFCL_v4_{category}.json: {row['id']}"
    if category not in RELEVANCE_CATEGORIES and row["id"] not in answers:
        raise BfclFileError(f"{where}: no possible answer")
    language = language_of(category)
    check_names(row["function"], where)
    (turn,) = row["question"]  # single-turn: one turn of messages
    return Entry(
        id=row["id"],
        category=category,
        messages=[Message(m["role"], str(m.get("content", ""))) for m in turn],
        functions=row["function"],
        expected=answers.get(row["id"], []),
        language=language,  # type: ignore[arg-type]
        kind="relevance" if category == "live_relevance" else "ast",
        shown=shown_functions(row["function"], language),
    )


def shown_functions(functions: list[dict[str, Any]], language: str) -> list[dict[str, Any]]:
    """The functions as BFCL shows them: the language hint, and Java/JavaScript values as strings."""
    hint = f" Note that the provided function is in {_HINTS[language]}."
    if language == "python":  # only the description changes: no deep copy (live entries carry long schemas)
        return [{**function, "description": function.get("description", "") + hint} for function in functions]
    shown = copy.deepcopy(functions)
    for function in shown:
        function["description"] = function.get("description", "") + hint
        name = "Java" if language == "java" else "JavaScript"
        for schema in (function.get("parameters") or {}).get("properties", {}).values():
            kind = schema.get("type")
            text = schema.get("description", "")
            if kind == "any":
                text += f" This parameter can be of any type of {name} object in string representation."
            else:
                text += f" This is {name} {kind} type parameter in string representation."
            if kind in ("Array", "ArrayList", "array") and "items" in schema:
                text += f" The list elements are of type {schema.pop('items')['type']}; they are not in string representation."
            if language == "javascript" and kind == "dict" and "properties" in schema:
                text += f" The dictionary entries have the following schema; they are not in string representation. {json.dumps(schema.pop('properties'))}"
            schema["description"], schema["type"] = text, "string"
    return shown


def bfcl_scores(by_category: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """BFCL's group scores from per-category accuracy and counts; a group with a category not run is None."""

    def accuracy(name: str) -> float | None:
        return by_category[name]["accuracy"] if name in by_category else None

    def mean(values: list[float | None]) -> float | None:
        return None if any(v is None for v in values) else sum(values) / len(values)  # type: ignore[arg-type]

    simple = mean([accuracy(c) for c in NON_LIVE_SIMPLE])
    non_live = mean([simple, *(accuracy(c) for c in NON_LIVE_REST)])
    live = None
    if all(c in by_category for c in LIVE_AST):
        live = sum(by_category[c]["accuracy"] * by_category[c]["n"] for c in LIVE_AST) / sum(by_category[c]["n"] for c in LIVE_AST)
    hallucination = mean([accuracy(c) for c in HALLUCINATION])
    return {
        "non_live_simple": simple,
        "non_live": non_live,
        "live": live,
        "hallucination": hallucination,
        "relevance": accuracy("live_relevance"),
        "single_turn": mean([non_live, live, hallucination]),
    }
