"""The calls a BFCL single-turn entry's possible answer accepts, written as a model sends
them: the bfcl demonstrator's answers (envs/bfcl/demonstrator.py) and the right answers
eval/bfcl_agreement.py checks BFCL's checker and ours against."""

from __future__ import annotations

from typing import Any

from toolpolicy.envs.bfcl.single_data import Entry
from toolpolicy.rewards.bfcl_literals import java_literal, js_literal
from toolpolicy.types import ToolCall


def parameters_of(entry: Entry, function: str) -> dict[str, Any]:
    """The parameters schema of one of the entry's functions ({} for a name it does not offer)."""
    return next(((f.get("parameters") or {}) for f in entry.functions if f["name"] == function), {})


def schema_of(entry: Entry, function: str, param: str) -> dict[str, Any]:
    return parameters_of(entry, function).get("properties", {}).get(param) or {}


def pick(options: list[Any], last: bool = False) -> tuple[bool, Any]:
    """(given?, value): the first (or last) acceptable value; not given when "" comes first or is all there is."""
    values = [o for o in options if o != ""]
    if not values or (not last and options[0] == ""):
        return False, None
    return True, values[-1] if last else values[0]


def _concrete(value: Any, schema: dict[str, Any], last: bool) -> Any:
    """A dict answer is a table of acceptable values per key, a list of dicts a list of such tables: pick from each."""
    kind = schema.get("type")
    if isinstance(value, dict) and kind in ("dict", "object", "HashMap"):
        return _pick_table(value, last)
    if isinstance(value, list) and (schema.get("items") or {}).get("type") in ("dict", "object", "HashMap"):
        return [_pick_table(item, last) if isinstance(item, dict) else item for item in value]
    return value


def _pick_table(table: dict[str, Any], last: bool) -> dict[str, Any]:
    out = {}
    for key, options in table.items():
        given, value = pick(options, last) if isinstance(options, list) else (True, options)
        if given:
            out[key] = value
    return out


def written(entry: Entry, schema: dict[str, Any], value: Any) -> Any:
    """`value` as the model writes it: itself in Python, a source literal in Java and JavaScript."""
    if entry.language == "python":
        return value
    kind, item_kind = schema.get("type", "any"), (schema.get("items") or {}).get("type")
    return (java_literal if entry.language == "java" else js_literal)(value, kind, item_kind)


def answer_values(entry: Entry, last: bool = False, minimal: bool = False, optional: bool = False) -> list[ToolCall]:
    """The expected calls with acceptable values, in order, before any is written as a literal.

    By default a parameter is given when its first acceptable value is not "" (the
    last value with `last`). `minimal` is the oracle's answer: only the parameters
    the schema requires or the answer cannot do without, each with its first value;
    with `optional` too, every parameter that has an acceptable value besides "" and null.
    """
    calls = []
    for k, want in enumerate(entry.expected):
        ((function, table),) = want.items()
        required = set(parameters_of(entry, function).get("required") or ())
        arguments = {}
        for param, options in table.items():
            if minimal:
                values = [o for o in options if o != ""]
                given = bool(values) and (param in required or "" not in options)
                if optional and not given:  # may be left out: given a value, if one besides null
                    values = [o for o in values if o is not None]
                    given = bool(values)
                value = values[0] if given else None
            else:
                given, value = pick(options, last)
            if given:
                arguments[param] = _concrete(value, schema_of(entry, function, param), last)
        calls.append(ToolCall(function, arguments, f"call_{k}"))
    return calls


def right_calls(entry: Entry, last: bool = False, minimal: bool = False, optional: bool = False) -> list[ToolCall]:
    """`answer_values` as a model would send them."""
    return [
        ToolCall(c.name, {p: written(entry, schema_of(entry, c.name, p), v) for p, v in c.arguments.items()}, c.id)
        for c in answer_values(entry, last, minimal, optional)
    ]
