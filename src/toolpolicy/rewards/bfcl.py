"""Function-call matching by the rules of the Berkeley Function Calling Leaderboard (BFCL).

An entry gives the functions a model may call and, per expected call, the
acceptable values of each parameter:

    {"calculate_area": {"base": [10], "unit": ["cm", "centimeters", ""]}}

The empty string marks a parameter that may be left out. `match_calls` gives the
verdict of BFCL's AST checker (Patil et al., "The Berkeley Function Calling
Leaderboard", 2024; the checker of the `bfcl-eval` package, which the tests run
side by side with this one on every entry of BFCL v4):

- the function name is exact; every required parameter is present; no parameter
  outside the function's schema or the acceptable table;
- the value's Python type must be the schema's exactly (an int is never a bool
  nor a float), except that an int is taken for a float parameter and a value of
  the answers' own type is taken as a "variable" (answers written as strings for
  an int parameter accept a string, compared as written);
- a list's items are type-checked one level deep against the item type, or the
  type of the answer's items (an int in a float list only where the answer has one);
- strings are compared after lower-casing and removing spaces and , . / - _ * ^
  (so "April 1, 2024" matches "april 1 2024"), a list's strings likewise (only
  at its top level), dicts key by key, lists of dicts dict by dict; numbers and
  booleans by Python equality (so 1 equals 1.0, and True equals 1 where the
  answers' type differs from the schema's);
- several expected calls (parallel) take, each in turn, the first unused call
  that matches it. That is greedy, as BFCL's checker is: when an earlier expected
  call takes a call a later one needed, the entry fails even though another
  pairing would match (f(x=1) and f() against f(x=1 or left out) then f(x=1)).
  Scores keep that verdict so they are BFCL's;
- an entry with no expected call (irrelevance) passes only if no call is made.

Java and JavaScript entries (`language`) take each value as a string holding a
source literal, read by `toolpolicy.rewards.bfcl_literals` the way BFCL reads it.

`call_reward` turns the same comparison into fine-grained reward components in
the style of ToolRL (Qian et al., 2025): format, tool names, parameter names and
parameter values, each in [0, 1], so a partly right call earns partial credit.

`verdict` and `components` are the two for one BFCL entry (relevance entries pass with
any call), taking the entry's `scoring()` as keywords; `bfcl_correct` and the
`bfcl_*` components after it are the same as reward functions of an Episode of the
`bfcl` environment, which carries the entry's scoring inputs in `task.info["bfcl"]`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from toolpolicy.rewards.bfcl_literals import JAVA_TYPES, JS_TYPES, UnreadableType, read_java, read_js
from toolpolicy.types import Episode, ToolCall

Expected = dict[str, dict[str, list[Any]]]
"""One expected call: {function name: {parameter: [acceptable values]}}."""
Language = Literal["python", "java", "javascript"]
Kind = Literal["ast", "relevance"]
"""How an entry is checked: "ast" against its expected calls, "relevance" passes with any call."""

_PUNCTUATION = re.compile(r"[ ,./\-_*^]")
PYTHON_TYPES: dict[str, type] = {
    "string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list, "dict": dict, "any": str,
    "number": float, "object": dict,  # JSON Schema's names, for files of our own
}
"""The Python type each BFCL Python type is checked as ("any" means a string, as in BFCL)."""
_LITERALS = {"java": (JAVA_TYPES, read_java, ("Array", "ArrayList")), "javascript": (JS_TYPES, read_js, ("array",))}


def normalize(text: str) -> str:
    """BFCL's string standardisation: lower case, without spaces and , . / - _ * ^, single quotes as double.

    >>> normalize("April 1, 2024") == normalize("april 1 2024")
    True
    """
    return _PUNCTUATION.sub("", text).lower().replace("'", '"')


@dataclass(frozen=True)
class Match:
    """Whether the calls match, and why not (one line per problem, empty when they do)."""

    ok: bool
    problems: tuple[str, ...] = ()


def match_calls(
    calls: Sequence[ToolCall], functions: Sequence[dict[str, Any]], expected: Sequence[Expected], language: Language = "python"
) -> Match:
    """BFCL's verdict on a model's calls: each expected call in turn takes the first unused call that matches it."""
    if not expected:
        return Match(not calls, () if not calls else (f"expected no call (irrelevant request), got {len(calls)}",))
    if len(calls) != len(expected):
        return Match(False, (f"expected {len(expected)} call(s), got {len(calls)}",))
    schemas = {f["name"]: f for f in functions}
    unused = list(range(len(calls)))
    for want in expected:
        tried = {j: call_problems(calls[j], schemas, want, language) for j in unused}
        matched = next((j for j, problems in tried.items() if not problems), None)
        if matched is None:
            return Match(False, tuple(min(tried.values(), key=len)))
        unused.remove(matched)
    return Match(True)


def call_problems(call: ToolCall, schemas: dict[str, dict[str, Any]], expected: Expected, language: Language = "python") -> list[str]:
    """What is wrong with `call` as the one expected call (empty: it matches)."""
    ((name, acceptable),) = expected.items()
    if call.name != name:
        return [f"function {call.name!r} is not {name!r}"]
    parameters = (schemas.get(name) or {}).get("parameters") or {}
    properties, required = parameters.get("properties") or {}, parameters.get("required") or []
    problems = [f"{name}: missing required parameter {p!r}" for p in required if p not in call.arguments]
    for param, value in call.arguments.items():
        if param not in properties or param not in acceptable:
            problems.append(f"{name}: unexpected parameter {param!r}")
            continue
        problems += value_problems(f"{name}.{param}", value, properties[param], acceptable[param], language)
    problems += [
        f"{name}: missing parameter {p!r}" for p, values in acceptable.items() if p not in call.arguments and "" not in values
    ]
    return problems


def value_problems(where: str, value: Any, schema: dict[str, Any], acceptable: list[Any], language: Language = "python") -> list[str]:
    """BFCL's type check of one argument against its schema, then its comparison with the acceptable values."""
    kind = schema.get("type", "any")
    item_kind = (schema.get("items") or {}).get("type")
    if language == "python":
        want, item_type = PYTHON_TYPES.get(kind), PYTHON_TYPES.get(item_kind) if kind in ("array", "tuple") else None
        if kind == "float" and type(value) is int:
            value = float(value)
    else:
        types, read, nested = _LITERALS[language]
        if not isinstance(value, str):
            return [f"{where}: a {language} value is written as a string literal, got {type(value).__name__}"]
        want, item_type = types.get(kind), types.get(item_kind) if kind in nested else None
        try:
            value = read(value, kind, item_kind if kind in nested else None)
        except UnreadableType as error:
            return [f"{where}: {error}"]
    if want is None:  # a type BFCL does not name: compare the value alone
        return [] if _plain_equal(value, acceptable) else [f"{where}: {value!r:.60} is not one of {acceptable!r:.80}"]
    answer_type = next((type(a) for a in acceptable if a != ""), None)
    variable = answer_type is not None and answer_type is not want
    if type(value) is want:
        if item_type is not None and not any(_items_typed(value, answer, item_type) for answer in acceptable):
            return [f"{where}: the items of {value!r:.40} are not {item_kind}"]
    elif answer_type is not None and type(value) is answer_type:
        variable = True
    else:
        return [f"{where}: expected {kind}, got {type(value).__name__} {value!r:.40}"]
    ok = value in acceptable if variable or want not in (dict, list, str) else _COMPARE[want, item_type is dict](value, acceptable)
    return [] if ok else [f"{where}: {value!r:.60} is not one of {acceptable!r:.80}"]


def _plain_equal(value: Any, acceptable: list[Any]) -> bool:
    if isinstance(value, str):
        return _same_string(value, acceptable)
    return value in acceptable


def _items_typed(value: list[Any], answer: Any, item_type: type) -> bool:
    """One level of item types: each item of the schema's item type or of the answer's items' type.

    An answer that is not a list (the "" of an optional parameter) checks nothing.
    """
    if not isinstance(answer, list):
        return True
    answer_item_type = next((type(a) for a in answer if a != ""), None)
    return all(type(item) is item_type or type(item) is answer_item_type for item in value)


def _same_string(value: str, acceptable: list[Any]) -> bool:
    return normalize(value) in {normalize(a) for a in acceptable if type(a) is str}


def _plain(item: Any) -> Any:
    return normalize(item) if type(item) is str else item


def _same_list(value: list[Any], acceptable: list[Any]) -> bool:
    """Top-level strings normalised, everything else by equality; "" among the answers stands for []."""
    return [_plain(item) for item in value] in [[_plain(item) for item in answer] for answer in acceptable]


def _same_dict(value: dict[str, Any], acceptable: list[Any]) -> bool:
    return any(_dict_matches(value, answer) for answer in acceptable if answer != "")


def _dict_matches(value: dict[str, Any], answer: dict[str, list[Any]]) -> bool:
    """Every key of `value` is allowed with an acceptable value; every key left out may be."""
    for key, got in value.items():
        if key not in answer or _plain(got) not in [_plain(option) for option in answer[key]]:
            return False
    return all(key in value or "" in options for key, options in answer.items())


def _same_dict_list(value: list[Any], acceptable: list[Any]) -> bool:
    """Dict by dict, in order, against one of the acceptable lists of dicts."""
    return any(
        len(value) == len(answer) and all(want != "" and _dict_matches(got, want) for got, want in zip(value, answer))
        for answer in acceptable
    )


_COMPARE = {
    (str, False): _same_string,
    (list, False): _same_list,
    (list, True): _same_dict_list,
    (dict, False): _same_dict,
}


def call_reward(
    calls: Sequence[ToolCall],
    malformed: int,
    functions: Sequence[dict[str, Any]],
    expected: Sequence[Expected],
    language: Language = "python",
) -> dict[str, float]:
    """ToolRL-style components in [0, 1] and their mean as "total".

    format: 1 when no call was malformed; tool_name: Jaccard overlap of called and
    expected function names (as multisets); param_names and param_values: over
    expected calls, each paired with the best-scoring unused call of the same name,
    the share of parameter names that agree (Jaccard) and of values that are acceptable. An irrelevant request
    answered without a call scores 1 on all four.
    """
    fmt = 1.0 if malformed == 0 else 0.0
    if not expected:
        score = 1.0 if not calls else 0.0
        return {"format": fmt, "tool_name": score, "param_names": score, "param_values": score, "total": (fmt + 3 * score) / 4}
    wanted = [next(iter(e)) for e in expected]
    got = [c.name for c in calls]
    shared = sum(min(wanted.count(n), got.count(n)) for n in set(wanted))
    names = shared / (len(wanted) + len(got) - shared)
    schemas = {f["name"]: f for f in functions}
    param_names, param_values = [], []
    unused = list(calls)
    for want in expected:
        ((name, acceptable),) = want.items()
        properties = ((schemas.get(name) or {}).get("parameters") or {}).get("properties") or {}
        scored = [(_param_scores(c, acceptable, properties, language), i) for i, c in enumerate(unused) if c.name == name]
        if not scored:
            param_names.append(0.0)
            param_values.append(0.0)
            continue
        (names_score, values_score), best = max(scored, key=lambda item: (item[0][1], item[0][0]))
        unused.pop(best)
        param_names.append(names_score)
        param_values.append(values_score)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    parts = {"format": fmt, "tool_name": names, "param_names": mean(param_names), "param_values": mean(param_values)}
    return {**parts, "total": mean(list(parts.values()))}


def _param_scores(
    call: ToolCall, acceptable: dict[str, list[Any]], properties: dict[str, Any], language: Language
) -> tuple[float, float]:
    """(parameter-name Jaccard, share of acceptable values) of `call` against one expected call."""
    needed = {p for p, values in acceptable.items() if "" not in values} | set(call.arguments)
    union = needed | {p for p in acceptable if p in call.arguments}
    names = len(set(call.arguments) & set(acceptable)) / max(1, len(union))
    given = [p for p in call.arguments if p in acceptable and p in properties]
    right = sum(not value_problems(p, call.arguments[p], properties[p], acceptable[p], language) for p in given)
    return names, right / max(1, len(needed))


def verdict(
    calls: Sequence[ToolCall], functions: Sequence[dict[str, Any]], expected: Sequence[Expected],
    language: Language = "python", kind: Kind = "ast",
) -> Match:
    """BFCL's verdict on one entry's calls (with the functions' own names): a relevance entry
    passes with any call, any other as `match_calls` says (no expected call: irrelevance)."""
    if kind == "relevance":
        return Match(bool(calls), () if calls else ("expected a call (relevant request), got none",))
    return match_calls(calls, functions, expected, language)


def components(
    calls: Sequence[ToolCall], malformed: int, functions: Sequence[dict[str, Any]], expected: Sequence[Expected],
    language: Language = "python", kind: Kind = "ast",
) -> dict[str, float]:
    """`call_reward`'s components for one entry; for relevance, any call earns the call parts."""
    if kind == "relevance":
        fmt, score = (1.0 if malformed == 0 else 0.0), float(bool(calls))
        return {"format": fmt, "tool_name": score, "param_names": score, "param_values": score, "total": (fmt + 3 * score) / 4}
    return call_reward(calls, malformed, functions, expected, language)


# ---- reward functions of the `bfcl` environment: one assistant turn, its calls scored ------


def answered_calls(episode: Episode) -> tuple[list[ToolCall], dict[str, Any]] | None:
    """The calls of the episode's assistant turn, each with its function's own name, and the
    entry's scoring inputs (`task.info["bfcl"]`: `Entry.scoring()` and the shown names that
    differ, "names"). None for a turn cut by a budget (its calls were never parsed), broken
    by infrastructure, or of a task with no BFCL entry (another environment's, as goal_state
    reads an outcome it lacks): every component then scores 0."""
    if episode.truncated or episode.infra_error is not None or "bfcl" not in episode.task.info:
        return None
    scoring = dict(episode.task.info["bfcl"])
    names = scoring.pop("names", {})
    turn = next((m for m in episode.messages if m.role == "assistant"), None)
    calls = [ToolCall(names.get(c.name, c.name), c.arguments, c.id) for c in (turn.tool_calls if turn else ())]
    return calls, scoring


def _component(episode: Episode, name: str) -> float:
    answered = answered_calls(episode)
    if answered is None:
        return 0.0
    calls, scoring = answered
    return components(calls, episode.count("invalid_call"), **scoring)[name]


def bfcl_correct(episode: Episode) -> float:
    """1.0 when BFCL's checker accepts the turn's calls (`verdict`: the official ast_checker's
    verdict; irrelevance entries pass with no call, relevance entries with any), else 0.0.
    Undecodable call text is not a call, as in BFCL's own decoding; `bfcl_format` counts it."""
    answered = answered_calls(episode)
    return 0.0 if answered is None else float(verdict(answered[0], **answered[1]).ok)


def bfcl_tool_name(episode: Episode) -> float:
    """ToolRL's tool-name credit: the Jaccard overlap of called and expected function names."""
    return _component(episode, "tool_name")


def bfcl_param_names(episode: Episode) -> float:
    """ToolRL's parameter-name credit: per expected call, the Jaccard overlap of parameter names."""
    return _component(episode, "param_names")


def bfcl_param_values(episode: Episode) -> float:
    """ToolRL's parameter-value credit: per expected call, the share of needed values that are acceptable."""
    return _component(episode, "param_values")


def bfcl_format(episode: Episode) -> float:
    """1.0 when no call of the turn was malformed (undecodable, an unknown function, arguments
    that break the schema: `invalid_call` events), else 0.0."""
    return _component(episode, "format")
