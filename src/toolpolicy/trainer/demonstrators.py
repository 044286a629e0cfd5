"""Demonstrators: what writes the assistant turns of SFT's generated dialogues.

A demonstrator is any callable `(task, rng, env, **options) -> list[Message]`: the
assistant messages of one dialogue, in order, drawing its randomness from `rng`; `env` is
the environment the dialogue runs in, and `options` are its own keyword arguments, given
in the config's `demonstrator` section beside `name` (checked against the signature when
the config is loaded). Tool results and user replies are not its business: the rollout
engine produces them by running the calls, exactly as in RL. `demonstrator.name` names one
by import path or entry point (group `toolpolicy.demonstrators`); empty uses the built-in
of the environment's name. This module imports no torch, so the config checks can resolve
the name on load.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import Field

from toolpolicy.config import ConfigError, DemonstratorSection, EnvSection
from toolpolicy.envs import Env, calc, hotel, zoom
from toolpolicy.registry import DEMONSTRATOR, ExtensionError, is_import_path, resolve_callable
from toolpolicy.types import Message, Task, ToolCall, ToolSpec

Demonstrator = Callable[..., list[Message]]
"""`(task, rng, env, **options) -> [assistant Message]`."""
Probability = Annotated[float, Field(ge=0, le=1)]


def calc_demonstrator(
    task: Task, rng: random.Random, env: Env, *, tool_on_hard: Probability = 0.4, tool_on_easy: Probability = 0.4,
    malformed: Probability = 0.1,
) -> list[Message]:
    """calc's imperfect expert: on a hard task it calls the calculator with probability
    `tool_on_hard` (else it guesses), on an easy one it makes a needless call with probability
    `tool_on_easy`, and a call is first written malformed, then fixed, with probability `malformed`."""
    return calc.expert_turns(task, rng, calc.ExpertStyle(tool_on_hard, tool_on_easy, malformed))


def hotel_demonstrator(
    task: Task, rng: random.Random, env: Env, *, violation: Probability = 0.2, guess: Probability = 0.1,
    slip: Probability = 0.0,
) -> list[Message]:
    """hotel's imperfect desk clerk: with probability `violation` it breaks the policy on a
    task (skips verification, refunds too much, carries out a request it should refuse); with
    `guess` it acts without asking where the answer matters (cancels the first of several
    bookings, changes dates the guest would decline); with `slip`, when the guest gave only a
    name, it verifies a namesake from the lookup list first, then asks for the guest's id."""
    return hotel.expert_turns(task, rng, hotel.ExpertStyle(violation, guess, slip))


def zoom_demonstrator(
    task: Task, rng: random.Random, env: Env, *, zoom_on_hard: Probability = 0.5, right_cell: Probability = 0.8,
    zoom_on_easy: Probability = 0.3,
) -> list[Message]:
    """zoom's imperfect reader: on a hard task it zooms with probability `zoom_on_hard` (else
    it guesses the code), on the pink square with probability `right_cell` (else on another
    cell, then it guesses); on an easy task it zooms needlessly with probability `zoom_on_easy`."""
    return zoom.ZoomEnv.expert_turns(env, task, rng, zoom.ExpertStyle(zoom_on_hard, right_cell, zoom_on_easy))  # type: ignore[arg-type]


def bfcl_multi_turn_demonstrator(task: Task, rng: random.Random, env: Env) -> list[Message]:
    """BFCL's ground truth, replayed exactly (its entries hold no imperfect answers to draw from)."""
    return env.expert_turns(task, rng)  # type: ignore[attr-defined]


NO_FUNCTION_FITS = "None of the functions I have fits this request, so I will not call one."
"""The bfcl demonstrator's answer to an irrelevance entry: plain text, no call."""


def bfcl_demonstrator(task: Task, rng: random.Random, env: Env, *, optional: Literal["left_out", "given"] = "left_out") -> list[Message]:
    """One right answer to a BFCL single-turn entry (`bfcl_answer`); exact, `rng` unused.
    `optional`: what becomes of a parameter the possible answer lets be left out ("") but
    also gives a value other than null: left out, or given that value. BFCL's held-out
    answers require a value for 88% of the parameters they name and let 11% be left out or
    given; the live ones require one for 64% and let 36% be left out or given (docs/bfcl.md)."""
    return [bfcl_answer(env.entries[task.id], optional == "given")]  # type: ignore[attr-defined]


def bfcl_answer(entry: Any, optional: bool = False) -> Message:
    """The demonstrator's assistant message for one BFCL single-turn entry (single_data.Entry):

    - irrelevance (no expected call): NO_FUNCTION_FITS, no call;
    - relevance (any call passes): a call the gate admits to the function sharing the most
      words with the question, its required parameters filled (`_filled`);
    - otherwise the possible answer's calls, each parameter at its first acceptable value,
      the optional ones whose acceptable values include "" (may be left out) left out, or
      with `optional` given their first other value where they have one besides null
      (eval.bfcl_agreement's `right_calls(minimal=True)`), named as the model is shown them.

    An entry whose possible answer cannot be written (a required parameter with no acceptable
    value; eval.bfcl_agreement.INTENDED_ANSWER_REJECTED) gets a call BFCL's checker rejects."""
    from toolpolicy.envs.bfcl.single_data import shown_name
    from toolpolicy.eval.bfcl_agreement import right_calls  # here: the eval layer imports torch

    if entry.kind == "relevance":
        return Message("assistant", "", (_relevant_call(entry),))
    if not entry.expected:
        return Message("assistant", NO_FUNCTION_FITS)
    calls = tuple(ToolCall(shown_name(c.name), c.arguments) for c in right_calls(entry, minimal=True, optional=optional))
    return Message("assistant", "", calls)


def _relevant_call(entry: Any) -> ToolCall:
    """A call to one of the entry's functions that the gate admits: the functions in order of the
    words their name and description share with the question, the first whose filled call fits."""
    from toolpolicy.envs.bfcl.single_turn import checked_schema
    from toolpolicy.gate.schema import ArgumentSchema

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


DEMONSTRATORS: dict[str, Demonstrator] = {
    "calc": calc_demonstrator, "hotel": hotel_demonstrator, "bfcl_multi_turn": bfcl_multi_turn_demonstrator,
    "bfcl": bfcl_demonstrator, "zoom": zoom_demonstrator,
}
"""The built-in demonstrators, by the name of the environment they demonstrate."""


def demonstrator_name(demonstrator: DemonstratorSection, env: EnvSection) -> str:
    """`demonstrator.name`, else the environment's registered name; ConfigError for an
    environment named by import path, which has no built-in to fall back on."""
    if demonstrator.name:
        return demonstrator.name
    if is_import_path(env.name):
        raise ConfigError(
            f"field 'demonstrator.name': environment {env.name!r} has no built-in demonstrator; name one "
            f"(e.g. {DEMONSTRATOR.example}) or train on a file with sft.data"
        )
    return env.name


def demonstrator_for(demonstrator: DemonstratorSection, env: EnvSection) -> Demonstrator:
    """The demonstrator SFT replays (see the module docstring), without its options."""
    try:
        return resolve_callable(DEMONSTRATOR, demonstrator_name(demonstrator, env), DEMONSTRATORS)  # type: ignore[return-value]
    except ExtensionError as error:
        raise ConfigError(f"field 'demonstrator.name': {error}; or train on a file with sft.data") from None
