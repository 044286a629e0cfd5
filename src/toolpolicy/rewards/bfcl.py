"""Function-call matching in the style of the Berkeley Function Calling Leaderboard (BFCL).

An entry gives the functions a model may call and, per expected call, the
acceptable values of each parameter:

    {"calculate_area": {"base": [10], "unit": ["cm", "centimeters", ""]}}

The empty string marks a parameter that may be left out. `match_calls` applies
BFCL's AST-checker rules (Patil et al., "The Berkeley Function Calling
Leaderboard", 2024), for Python-typed functions:

- the function name is exact; every required parameter is present; no parameter
  outside the function's schema or the acceptable table;
- types are checked against the schema, with an int accepted where a float is
  expected (a bool is never a number);
- strings are compared after lower-casing and removing spaces and , . / - _ * ^
  (so "April 1, 2024" matches "april 1 2024"); lists element by element with
  the same rule for their strings; dicts key by key;
- several expected calls (parallel) match the model's calls in any order, one to
  one; an entry with no expected call (irrelevance) passes only if no call is made.

`call_reward` turns the same comparison into fine-grained reward components in
the style of ToolRL (Qian et al., 2025): format, tool names, parameter names and
parameter values, each in [0, 1], so a partly right call earns partial credit.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolpolicy.types import ToolCall

Expected = dict[str, dict[str, list[Any]]]
"""One expected call: {function name: {parameter: [acceptable values]}}."""

_PUNCTUATION = re.compile(r"[ ,./\-_*^]")
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "float": (float, int),
    "number": (float, int),
    "boolean": (bool,),
    "array": (list, tuple),
    "tuple": (list, tuple),
    "dict": (dict,),
    "object": (dict,),
}
MAX_EXPECTED_CALLS = 8  # matching tries assignments; BFCL's parallel entries have at most a handful


def normalize(text: str) -> str:
    """BFCL's string standardisation: lower case, without spaces and , . / - _ * ^.

    >>> normalize("April 1, 2024") == normalize("april 1 2024")
    True
    """
    return _PUNCTUATION.sub("", text).lower().replace("'", '"')


@dataclass(frozen=True)
class Match:
    """Whether the calls match, and why not (one line per problem, empty when they do)."""

    ok: bool
    problems: tuple[str, ...] = ()


def match_calls(calls: Sequence[ToolCall], functions: Sequence[dict[str, Any]], expected: Sequence[Expected]) -> Match:
    """BFCL's verdict on a model's calls: the expected calls in any order, one to one."""
    if not expected:
        return Match(not calls, () if not calls else (f"expected no call (irrelevant request), got {len(calls)}",))
    if len(calls) != len(expected):
        return Match(False, (f"expected {len(expected)} call(s), got {len(calls)}",))
    if len(expected) > MAX_EXPECTED_CALLS:
        raise ValueError(f"an entry expects {len(expected)} calls; at most {MAX_EXPECTED_CALLS} are supported")
    schemas = {f["name"]: f for f in functions}
    table = [[call_problems(call, schemas, want) for call in calls] for want in expected]
    for order in itertools.permutations(range(len(calls))):
        if all(not table[i][j] for i, j in enumerate(order)):
            return Match(True)
    closest = min(itertools.permutations(range(len(calls))), key=lambda order: sum(len(table[i][j]) for i, j in enumerate(order)))
    return Match(False, tuple(p for i, j in enumerate(closest) for p in table[i][j]))


def call_problems(call: ToolCall, schemas: dict[str, dict[str, Any]], expected: Expected) -> list[str]:
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
        problems += value_problems(f"{name}.{param}", value, properties[param], acceptable[param])
    problems += [
        f"{name}: missing parameter {p!r}" for p, values in acceptable.items() if p not in call.arguments and "" not in values
    ]
    return problems


def value_problems(where: str, value: Any, schema: dict[str, Any], acceptable: list[Any]) -> list[str]:
    """Type check against the schema, then the value against the acceptable ones."""
    kind = schema.get("type", "any")
    allowed = _TYPES.get(kind)
    if allowed is not None and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
        return [f"{where}: expected {kind}, got {type(value).__name__} {value!r:.40}"]
    if isinstance(value, str):
        ok = normalize(value) in {normalize(a) for a in acceptable if isinstance(a, str) and a != ""}
    elif isinstance(value, (list, tuple)):
        ok = any(_same_list(value, a) for a in acceptable if isinstance(a, (list, tuple)))
    elif isinstance(value, dict):
        ok = any(_same_dict(value, a) for a in acceptable if isinstance(a, dict))
    else:
        ok = any(_same_scalar(value, a) for a in acceptable)
    return [] if ok else [f"{where}: {value!r:.60} is not one of {acceptable!r:.80}"]


def _same_scalar(value: Any, answer: Any) -> bool:
    """Numbers by value (5 == 5.0), booleans only with booleans, never with a string."""
    return isinstance(value, bool) == isinstance(answer, bool) and not isinstance(answer, str) and value == answer


def _plain(item: Any) -> Any:
    return normalize(item) if isinstance(item, str) else item


def _same_list(value: Sequence[Any], answer: Sequence[Any]) -> bool:
    if len(value) != len(answer):
        return False
    for got, want in zip(value, answer):
        if isinstance(got, dict) and isinstance(want, dict):
            if not _same_dict(got, want):
                return False
        elif isinstance(got, str) or isinstance(want, str):
            if not (isinstance(got, str) and isinstance(want, str) and normalize(got) == normalize(want)):
                return False
        elif not _same_scalar(got, want):
            return False
    return True


def _same_dict(value: dict[str, Any], answer: dict[str, Any]) -> bool:
    """Every key of `value` is allowed with an acceptable value; every key left out may be."""
    for key, got in value.items():
        options = answer.get(key)
        if options is None:
            return False
        options = options if isinstance(options, list) else [options]
        if _plain(got) not in [_plain(o) for o in options if o != ""]:
            return False
    return all(key in value or (isinstance(o, list) and "" in o) for key, o in answer.items())


def call_reward(
    calls: Sequence[ToolCall], malformed: int, functions: Sequence[dict[str, Any]], expected: Sequence[Expected]
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
        scored = [(_param_scores(c, acceptable, properties), i) for i, c in enumerate(unused) if c.name == name]
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


def _param_scores(call: ToolCall, acceptable: dict[str, list[Any]], properties: dict[str, Any]) -> tuple[float, float]:
    """(parameter-name Jaccard, share of acceptable values) of `call` against one expected call."""
    needed = {p for p, values in acceptable.items() if "" not in values} | set(call.arguments)
    union = needed | {p for p in acceptable if p in call.arguments}
    names = len(set(call.arguments) & set(acceptable)) / max(1, len(union))
    given = [p for p in call.arguments if p in acceptable and p in properties]
    right = sum(not value_problems(p, call.arguments[p], properties[p], acceptable[p]) for p in given)
    return names, right / max(1, len(needed))
