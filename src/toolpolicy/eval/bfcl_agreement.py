"""Does our BFCL matcher give the official checker's verdict? A differential run over BFCL v4.

For every entry of the AST categories it builds right answers (the first
acceptable value of each parameter, the last, and only the parameters needed)
and systematic mutations of the first (wrong value, wrong type, missing or
extra parameter, wrong name, dropped or extra call, int for float and float for
int, a number for a bool and a bool for a number, changed case and punctuation,
calls reversed), writes
them as a model would (Java and JavaScript values as source literals), and asks
both `toolpolicy.rewards.bfcl.match_calls` and `bfcl_eval`'s `ast_checker` for a
verdict. A checker that raises counts as its own verdict ("error"), so a crash
on one side only is a disagreement too.

The official checker is imported from the installed package with one stand-in:
its model table (`bfcl_eval.constants.model_config`) imports every vendor's API
client, and the checker reads it only to learn whether a model writes "." in
names as "_". The stand-in says no for every model, which is how the calls here
are written (`Entry.called` has already turned shown names back).

    python -m toolpolicy.eval.bfcl_agreement    # prints the agreement and every disagreement
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from toolpolicy.eval.bfcl import Entry
from toolpolicy.envs.bfcl.answers import answer_values, parameters_of, right_calls, schema_of, written
from toolpolicy.eval.bfcl_v4 import AST_CATEGORIES, load_v4
from toolpolicy.rewards.bfcl import verdict
from toolpolicy.types import ToolCall

Verdict = bool | str  # True / False, or "error: <exception type>"

INTENDED_ANSWER_REJECTED = {
    "simple_java_36": "ArrayList of Java `any`: BFCL reads every item as a string, so the answer's 42 and true never match",
    "simple_java_65": "ArrayList of Java `any`: BFCL reads every item as a string, so the answer's true never matches",
    "simple_java_64": "the HashMap answer {'format': 'epoch_millis'} is not a table of acceptable values; BFCL compares with its characters",
    "live_simple_106-63-0": "required parameter auto_loan_payment_start (and others) missing from the possible answer",
    "live_simple_112-68-0": "acceptable values [] for parameters that may not be left out",
    "live_multiple_507-149-4": "required parameter origin_airport has only '' (left out) as its answer",
    "live_multiple_862-181-3": "the answer gives journey_start_time, which Trains_1_FindTrains does not take",
    "live_multiple_964-207-0": "the answer gives 'question'; transfer_to_human_agent takes (and requires) 'statement'",
}
"""BFCL v4 entries whose intended answer BFCL's own checker rejects, and why: no model scores them as meant."""
ASKED_TWICE = {
    "live_simple_29-7-2": "live_irrelevance_118-7-8",
    "live_simple_176-102-0": "live_irrelevance_567-175-0",
    "live_multiple_262-125-1": "live_irrelevance_565-173-0",
}
"""Entries that expect a call, and the live_irrelevance entry with the same messages and tools that expects none."""


def official_checker() -> Callable[[Entry, list[ToolCall]], Verdict]:
    """`bfcl_eval`'s ast_checker as a verdict on an entry and calls."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stand_in = types.ModuleType(name)
        stand_in.MODEL_CONFIG_MAPPING = _NoUnderscoreToDot()  # type: ignore[attr-defined]
        sys.modules[name] = stand_in
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    languages = {"python": Language.PYTHON, "java": Language.JAVA, "javascript": Language.JAVASCRIPT}

    def verdict(entry: Entry, calls: list[ToolCall]) -> Verdict:
        output = [{call.name: call.arguments} for call in calls]  # the checker reads them and changes nothing
        return _verdict(lambda: ast_checker(entry.functions, output, entry.expected, languages[entry.language], entry.category, "toolpolicy")["valid"])

    return verdict


class _NoUnderscoreToDot(dict):
    def __missing__(self, key: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(underscore_to_dot=False)


def ours(entry: Entry, calls: list[ToolCall]) -> Verdict:
    return _verdict(lambda: verdict(calls, **entry.scoring()).ok)


def _verdict(check: Callable[[], bool]) -> Verdict:
    try:
        return bool(check())
    except Exception as error:  # a checker that cannot decide: its own verdict, compared like the others
        return f"error: {type(error).__name__}"


# ---- answers as a model would write them -------------------------------------------------


# ---- mutations ---------------------------------------------------------------------------


def _changed_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        return value + " extra"
    if isinstance(value, list):
        return value[:-1] if value else ["extra"]
    if isinstance(value, dict):
        return {**value, "extra_key": "extra"}
    return "extra"


def _other_type(value: Any) -> Any:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return 7
    if isinstance(value, list):
        return value[0] if value else ""
    if isinstance(value, dict):
        return [value]
    return 7


def _recased(value: Any) -> Any:
    if isinstance(value, str):
        return f" {value.upper()}, -_. "
    if isinstance(value, list):
        return [_recased(item) for item in value]
    if isinstance(value, dict):
        return {key: _recased(item) for key, item in value.items()}
    return value


def _number_swap(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return float(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_number_swap(item) for item in value]
    return value


def _as_bool(value: Any) -> Any:
    """A number written as a bool (1 as True, 0 as False): equal in Python, another type in BFCL."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 1
    return value


VALUE_MUTATIONS: dict[str, Callable[[Any], Any]] = {
    "wrong value": _changed_value,
    "wrong type": _other_type,
    "case and punctuation": _recased,
    "int for float / float for int / int for bool": _number_swap,
    "bool for number": _as_bool,
}
"""Mutations of one argument's value, applied before it is written as a literal."""


def mutations(entry: Entry) -> Iterator[tuple[str, list[ToolCall]]]:
    """(what changed, calls): every mutation of the first right answer."""
    base = right_calls(entry)
    raw = [call.arguments for call in answer_values(entry)]
    for k, call in enumerate(base):
        def replaced(arguments: dict[str, Any], name: str | None = None) -> list[ToolCall]:
            return [*base[:k], ToolCall(name or call.name, arguments, call.id), *base[k + 1:]]

        for param in call.arguments:
            schema = schema_of(entry, call.name, param)
            for label, change in VALUE_MUTATIONS.items():
                value = written(entry, schema, change(raw[k][param]))
                if repr(value) != repr(call.arguments[param]):  # 5 == 5.0 and True == 1, but they are other answers
                    yield f"{label}: {call.name}.{param}", replaced({**call.arguments, param: value})
            if entry.language != "python":  # the raw value, not a literal string
                yield f"not a literal string: {call.name}.{param}", replaced({**call.arguments, param: raw[k][param]})
            yield f"missing parameter: {call.name}.{param}", replaced({key: v for key, v in call.arguments.items() if key != param})
        for param in parameters_of(entry, call.name).get("properties", {}):
            if param not in call.arguments:
                yield f"extra parameter: {call.name}.{param}", replaced({**call.arguments, param: written(entry, schema_of(entry, call.name, param), 1)})
        yield f"unknown parameter: {call.name}", replaced({**call.arguments, "unknown_parameter": 1})
        yield f"wrong name: {call.name}", replaced(call.arguments, call.name + "_v2")
        for other in entry.functions:
            if other["name"] != call.name:
                yield f"another function: {other['name']} for {call.name}", replaced(call.arguments, other["name"])
                break
        yield f"dropped call: {call.name}", [*base[:k], *base[k + 1:]]
        yield f"extra call: {call.name}", [*base, call]
    if len(base) > 1:
        yield "calls reversed", base[::-1]


def cases(entry: Entry) -> Iterator[tuple[str, list[ToolCall]]]:
    """Every right answer and mutation of an entry, each set of calls once."""
    seen: set[str] = set()
    right = [("right: first values", right_calls(entry)), ("right: last values", right_calls(entry, last=True)),
             ("right: only what is needed", right_calls(entry, minimal=True))]
    for label, calls in [*right, *mutations(entry)]:
        key = repr([(c.name, sorted(c.arguments.items(), key=lambda kv: kv[0])) for c in calls])
        if key not in seen:
            seen.add(key)
            yield label, calls


# ---- the run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Disagreement:
    id: str
    case: str
    ours: Verdict
    official: Verdict
    calls: list[dict[str, Any]]


def compare(entries: list[Entry]) -> dict[str, Any]:
    """Agreement of the two checkers over every case of every entry, per category, with each disagreement."""
    official = official_checker()
    by_category: dict[str, dict[str, int]] = {}
    disagreements: list[Disagreement] = []
    for entry in entries:
        row = by_category.setdefault(entry.category, {"entries": 0, "cases": 0, "agree": 0, "official_valid": 0})
        row["entries"] += 1
        for label, calls in cases(entry):
            theirs, mine = official(entry, calls), ours(entry, calls)
            row["cases"] += 1
            row["official_valid"] += theirs is True
            if theirs == mine:
                row["agree"] += 1
            else:
                disagreements.append(Disagreement(entry.id, label, mine, theirs, [{c.name: c.arguments} for c in calls]))
    total = sum(r["cases"] for r in by_category.values())
    agree = sum(r["agree"] for r in by_category.values())
    return {
        "cases": total,
        "agree": agree,
        "agreement": agree / total if total else 1.0,
        "by_category": by_category,
        "disagreements": [d.__dict__ for d in disagreements],
    }


def main() -> None:
    report = compare(load_v4(AST_CATEGORIES))
    print(f"{report['agree']}/{report['cases']} cases agree ({report['agreement'] * 100:.3f}%)")
    for name, row in report["by_category"].items():
        print(f"  {name:<24} {row['entries']:>5} entries {row['cases']:>7} cases {row['agree']:>7} agree {row['official_valid']:>6} valid")
    for d in report["disagreements"]:
        print(f"  {d['id']} [{d['case']}] ours={d['ours']} official={d['official']} {d['calls']!r:.300}")


if __name__ == "__main__":
    main()
