"""`bfcl`'s demonstrator: one right answer per single-turn entry, from its possible answer."""

from __future__ import annotations

import random
import re
from typing import Any, Literal

from toolpolicy.envs.bfcl.answers import right_calls
from toolpolicy.envs.bfcl.single_data import shown_name
from toolpolicy.envs.bfcl.single_turn import BfclEnv, checked_schema
from toolpolicy.gate.schema import ArgumentSchema
from toolpolicy.types import Message, Task, ToolCall, ToolSpec

NO_FUNCTION_FITS = "None of the functions I have fits this request, so I will not call one."
"""The bfcl demonstrator's answer to an irrelevance entry: plain text, no call."""


def demonstrate(task: Task, rng: random.Random, env: BfclEnv, *, optional: Literal["left_out", "given"] = "left_out") -> list[Message]:
    """One right answer to a BFCL single-turn entry (`bfcl_answer`); exact, `rng` unused.

    Args:
        optional: what becomes of a parameter the possible answer lets be left out ("") but
            also gives a value other than null: left out, or given that value. BFCL's held-out
            answers require a value for 88% of the parameters they name and let 11% be left out or
            given; the live ones require one for 64% and let 36% be left out or given (docs/bfcl.md).
    """
    return [bfcl_answer(env.entries[task.id], optional == "given")]


def bfcl_answer(entry: Any, optional: bool = False) -> Message:
    """The demonstrator's assistant message for one BFCL single-turn entry (single_data.Entry):

    - irrelevance (no expected call): NO_FUNCTION_FITS, no call;
    - relevance (any call passes): a call the gate admits to the function sharing the most
      words with the question, its required parameters filled (`_filled`);
    - otherwise the possible answer's calls, each parameter at its first acceptable value,
      the optional ones whose acceptable values include "" (may be left out) left out, or
      with `optional` given their first other value where they have one besides null
      (`answers.right_calls(minimal=True)`), named as the model is shown them.

    An entry whose possible answer cannot be written (a required parameter with no acceptable
    value; eval.bfcl_agreement.INTENDED_ANSWER_REJECTED) gets a call BFCL's checker rejects."""
    if entry.kind == "relevance":
        return Message("assistant", "", (_relevant_call(entry),))
    if not entry.expected:
        return Message("assistant", NO_FUNCTION_FITS)
    calls = tuple(ToolCall(shown_name(c.name), c.arguments) for c in right_calls(entry, minimal=True, optional=optional))
    return Message("assistant", "", calls)


def _relevant_call(entry: Any) -> ToolCall:
    """A call to one of the entry's functions that the gate admits: the functions in order of the
    words their name and description share with the question, the first whose filled call fits."""
    question = " ".join(m.content for m in entry.messages if m.role == "user")
    asked = set(re.findall(r"[a-z]{3,}", question.lower()))

    def shared(spec: ToolSpec) -> int:
        return len(asked & set(re.findall(r"[a-z]{3,}", f"{spec.name.replace('_', ' ')} {spec.description}".lower())))

    specs = sorted(entry.specs(), key=shared, reverse=True)  # stable: ties keep the entry's order
    for spec in specs:
        call = ToolCall(spec.name, _filled(spec.parameters, question))
        if ArgumentSchema(checked_schema(spec)).problem(call.arguments) is None:
            return call
    raise ValueError(f"{entry.id}: no function of the entry takes a call filled from its schema")


def _filled(schema: dict[str, Any], text: str) -> Any:
    """A value of `schema`: its first enum value, else one of its type (an object with its
    required properties filled, `text` for a string)."""
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: _filled(properties.get(name) or {}, text) for name in schema.get("required") or ()}
    return {"integer": 1, "number": 1.0, "boolean": True, "array": []}.get(kind, text)
