"""BFCL v4's single-turn entries, read from the installed `bfcl-eval` package.

The Berkeley Function Calling Leaderboard's own question files and possible answers
(`bfcl_eval/data/`), nothing copied into this repository; the package is installed
without its dependencies (`pip install --no-deps bfcl-eval`) and only its data files are
read, as JSON. Two readers share this module: `toolpolicy eval --bfcl v4`
(toolpolicy.eval.bfcl_v4, which scores them) and the `bfcl` environment
(toolpolicy.envs.bfcl.single_turn, which trains on them). Scoring is not here: it is
toolpolicy.rewards.bfcl's, from `Entry.scoring()`.

The model sees each entry as BFCL shows it to a function-calling model: every
description ends with the language hint, Java and JavaScript parameters are strings
holding a source literal (their type named in the description), and "." in function
names is written "_". Irrelevance entries expect no call, relevance entries any call.

`load_archived` reads the categories of earlier BFCL versions that v4 keeps under
`data/unused_datasets/` and scores nowhere (ARCHIVED_CATEGORIES), as train material.
"""

from __future__ import annotations

import ast
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolpolicy.envs.bfcl.data import BfclDataError, data_dir
from toolpolicy.types import Message, ToolCall, ToolSpec

AST_CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
)
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
CATEGORIES = AST_CATEGORIES + RELEVANCE_CATEGORIES
CATEGORY_GROUPS = {
    "non_live": tuple(c for c in CATEGORIES if not c.startswith("live_")),
    "live": tuple(c for c in CATEGORIES if c.startswith("live_")),
    "single_turn": CATEGORIES,
    "all": CATEGORIES,
}
"""BFCL's own names for sets of single-turn categories (bfcl-eval's `TEST_COLLECTION_MAPPING`,
as far as it is single-turn). For the `bfcl` environment "non_live" is the held-out split and
"live" the one it trains on."""
ARCHIVED_CATEGORIES = ("exec_simple", "exec_multiple", "exec_parallel", "exec_parallel_multiple")
"""Categories of earlier BFCL versions that v4 ships under `data/unused_datasets/` and scores in no
category of its own: train material only (`load_archived`). Its sql entries are not among them:
their schema asks `conditions` as a list of lists of strings and their answers give a list of
strings, which BFCL's checker takes and a schema check refuses."""
ARCHIVED_LEFT_OUT = {
    "exec_multiple_0": "its answer is an expression (p=1/6), not a value",
    "exec_parallel_multiple_11": "its answer is an expression (amount=500*500), not a value",
    "exec_parallel_multiple_18": "its answer passes a value by position",
    "exec_multiple_45": "its answer passes a parameter the function does not take: no call passes the checker",
    "exec_parallel_31": "its answer passes matrices where the schema asks a list of integers: no call fits both",
    "exec_parallel_multiple_31": "its answer passes matrices where the schema asks a list of integers: no call fits both",
}
"""Archived entries `load_archived` leaves out, and why (tests/test_bfcl_env.py checks the last
three against BFCL's checker and the schema)."""
Category = Literal[CATEGORIES + tuple(CATEGORY_GROUPS)]  # type: ignore[valid-type]  # a category or a group, checked where a config names one
INSTALL = "pip install --no-deps bfcl-eval==2026.3.23"
_HINTS = {"python": "Python 3 syntax", "java": "Java 8 SDK syntax", "javascript": "JavaScript syntax"}
# BFCL writes Python type names in its schemas; models are shown JSON Schema.
_JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array", "int": "integer", "bool": "boolean", "str": "string"}


class BfclFileError(ValueError):
    """An entry that cannot be scored; the message names the file and line."""


def known_categories(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The single-turn categories `names` name, a group (`CATEGORY_GROUPS`) standing for its
    members, in order, each once; ValueError listing the known names for any other.

    >>> known_categories(["live_simple", "non_live", "simple_python"])[:3]
    ('live_simple', 'simple_python', 'simple_java')
    """
    unknown = [name for name in names if name not in CATEGORIES and name not in CATEGORY_GROUPS]
    if unknown:
        raise ValueError(
            f"unknown BFCL v4 categories {unknown}; choose from {', '.join(CATEGORIES)}, or a group: {', '.join(CATEGORY_GROUPS)}"
        )
    return tuple(dict.fromkeys(c for name in names for c in CATEGORY_GROUPS.get(name, (name,))))


@dataclass(frozen=True)
class Entry:
    """One single-turn question, the functions it offers and what counts as right.

    `expected` holds one {function: {parameter: [acceptable values]}} per expected call
    (toolpolicy.rewards.bfcl's `Expected`). `kind`: "ast" compares the calls with
    `expected` (none expected: no call is right); "relevance" passes with any call at
    all. `shown` is the function list as the model sees it, where it differs from the
    one the answers are checked against (BFCL shows Java and JavaScript parameters as
    strings).
    """

    id: str
    category: str
    messages: list[Message]
    functions: list[dict[str, Any]]
    expected: list[dict[str, dict[str, list[Any]]]]
    language: Literal["python", "java", "javascript"] = "python"
    kind: Literal["ast", "relevance"] = "ast"
    shown: list[dict[str, Any]] | None = None

    def specs(self) -> list[ToolSpec]:
        """The tools as the model is offered them, with "." in names as "_" (what OpenAI-style names allow)."""
        return [
            ToolSpec(shown_name(f["name"]), f.get("description", ""), json_schema(f.get("parameters") or {}))
            for f in self.shown or self.functions
        ]

    def own_names(self) -> dict[str, str]:
        """Shown name -> the function's own name, for the names that differ."""
        return {shown_name(f["name"]): f["name"] for f in self.functions if shown_name(f["name"]) != f["name"]}

    def called(self, calls: list[ToolCall]) -> list[ToolCall]:
        """The calls with each shown name turned back into the function's own."""
        names = self.own_names()
        return [ToolCall(names.get(call.name, call.name), call.arguments, call.id) for call in calls]

    def scoring(self) -> dict[str, Any]:
        """What BFCL's verdict and the reward components read (toolpolicy.rewards.bfcl's
        `verdict` and `components` take it as keywords; the `bfcl` environment's tasks carry it)."""
        return {"functions": self.functions, "expected": self.expected, "language": self.language, "kind": self.kind}


def shown_name(name: str) -> str:
    """A function name as the model is shown it: OpenAI-style names allow no ".", BFCL writes "_" for it."""
    return name.replace(".", "_")


def check_names(functions: list[dict[str, Any]], where: str) -> None:
    """Two functions whose shown names coincide ("a.b" and "a_b") could not be told apart in a call."""
    shown = [shown_name(f["name"]) for f in functions]
    clashes = sorted({name for name in shown if shown.count(name) > 1})
    if clashes:
        raise BfclFileError(f"{where}: functions shown as {clashes} differ only by '.' and '_'; rename one")


def json_schema(schema: Any) -> Any:
    """A BFCL parameter schema with its Python type names ("dict", "float") as JSON Schema's."""
    if isinstance(schema, list):
        return [json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: json_schema(value) for key, value in schema.items()}
    if isinstance(out.get("type"), str):
        if out["type"] == "any":
            del out["type"]
        else:
            out["type"] = _JSON_TYPES.get(out["type"], out["type"])
    return out


def data_folder() -> Path:
    """`bfcl_eval/data` of the installed package, found without importing it (its imports pull API clients)."""
    try:
        return data_dir()
    except BfclDataError as error:
        raise BfclFileError(f"BFCL v4 reads its data from the bfcl-eval package: {error}") from None


def load_v4(categories: tuple[str, ...] = CATEGORIES, folder: Path | None = None) -> list[Entry]:
    """Every entry of the categories, with its possible answers."""
    folder = folder or data_folder()
    entries = []
    for category in categories:
        rows = _read(folder / f"BFCL_v4_{category}.json")
        answers = {} if category in RELEVANCE_CATEGORIES else {r["id"]: r["ground_truth"] for r in _read(folder / "possible_answer" / f"BFCL_v4_{category}.json")}
        for row in rows:
            entries.append(_entry(row, category, answers, folder / f"BFCL_v4_{category}.json"))
    return entries


def load_archived(folder: Path | None = None, left_out: Mapping[str, str] = ARCHIVED_LEFT_OUT) -> list[Entry]:
    """Every entry of the ARCHIVED_CATEGORIES, with answers in the AST form of the others.

    Their answers are written as the calls an executable checker ran ("f(n=20, k=5, p=0.6)");
    `executable_answer` reads them. The entries of `left_out` (ARCHIVED_LEFT_OUT's 6) are not read.
    """
    folder = (folder or data_folder()) / "unused_datasets"
    entries = []
    for category in ARCHIVED_CATEGORIES:
        answers = {r["id"]: r["ground_truth"] for r in _read(folder / "possible_answer" / f"BFCL_v4_{category}.json")}
        path = folder / "question" / f"BFCL_v4_{category}.json"
        for row in _read(path):
            if row["id"] in left_out:
                continue
            if row["id"] in answers:
                answers[row["id"]] = executable_answer(answers[row["id"]], row["function"], f"{path}: {row['id']}")
            entries.append(_entry(row, category, answers, path))
    return entries


def executable_answer(calls: list[str], functions: list[dict[str, Any]], where: str) -> list[dict[str, dict[str, list[Any]]]]:
    """Calls written as Python ("f(a=1, b='x')") as possible answers: each given value the one
    acceptable (`as_typed`); a parameter not given may be left out or take its schema's default.

    >>> f = [{"name": "area", "parameters": {"properties": {"r": {}, "unit": {"default": "cm"}}, "required": ["r"]}}]
    >>> executable_answer(["area(r=-2.5)"], f, "x")
    [{'area': {'r': [-2.5], 'unit': ['', 'cm']}}]
    """
    schemas = {f["name"]: f.get("parameters") or {} for f in functions}
    expected = []
    for text in calls:
        try:
            call = ast.parse(text, mode="eval").body
            function = ast.unparse(call.func) if isinstance(call, ast.Call) else ""
            if function not in schemas or call.args:
                raise ValueError("not a call of an offered function by keywords")
            schema = schemas[function]
            properties = schema.get("properties", {})
            values = {k.arg: [as_typed(ast.literal_eval(k.value), properties.get(k.arg, {}))] for k in call.keywords if k.arg}
        except (SyntaxError, ValueError) as error:
            raise BfclFileError(f"{where}: answer {text!r} cannot be read ({error})") from None
        for name, spec in properties.items():
            if name not in values and name not in schema.get("required", []):
                values[name] = ["", spec["default"]] if "default" in spec else [""]
        expected.append({function: values})
    return expected


def as_typed(value: Any, schema: dict[str, Any]) -> Any:
    """A Python literal as its JSON value under a BFCL schema: tuples as lists, and in a list of
    floats whole numbers as floats (BFCL's checker takes an integer for a float parameter, not
    for a float item of a list). A value outside a list stays as written.

    >>> as_typed((1, 2.5), {"type": "tuple", "items": {"type": "float"}}), as_typed(3, {"type": "float"})
    ([1.0, 2.5], 3)
    """
    if not isinstance(value, (tuple, list)):
        return value
    items = schema.get("items") or {}
    return [float(v) if items.get("type") == "float" and type(v) is int else as_typed(v, items) for v in value]


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise BfclFileError(f"{path}: missing from the bfcl-eval package; reinstall it: {INSTALL}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def language_of(category: str) -> str:
    return {"simple_java": "java", "simple_javascript": "javascript"}.get(category, "python")


def _entry(row: dict[str, Any], category: str, answers: dict[str, Any], path: Path) -> Entry:
    where = f"{path}: {row['id']}"
    if category not in RELEVANCE_CATEGORIES and row["id"] not in answers:
        raise BfclFileError(f"{where}: no possible answer")
    language = language_of(category)
    check_names(row["function"], where)
    (turn,) = row["question"]  # single-turn: one turn of messages
    return Entry(
        id=row["id"],
        category=category,
        messages=alternating([Message(m["role"], str(m.get("content", ""))) for m in turn]),
        functions=row["function"],
        expected=answers.get(row["id"], []),
        language=language,  # type: ignore[arg-type]
        kind="relevance" if category == "live_relevance" else "ast",
        shown=shown_functions(row["function"], language),
    )


def alternating(messages: list[Message]) -> list[Message]:
    """`messages` with each run of one role joined into one message, its contents a paragraph
    each: three live_irrelevance entries ask in several user messages in a row, which
    templates that require alternating roles (Gemma 3's) refuse.

    >>> [m.content for m in alternating([Message("user", "a"), Message("user", "b"), Message("assistant", "c")])]
    ['a\\n\\nb', 'c']
    """
    out: list[Message] = []
    for message in messages:
        if out and out[-1].role == message.role:
            out[-1] = Message(message.role, f"{out[-1].content}\n\n{message.content}")
        else:
            out.append(message)
    return out


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
