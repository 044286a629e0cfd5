"""`bfcl_multi_turn`: BFCL v4's multi-turn categories as an environment of toolpolicy's engine.

An entry is a conversation of several user turns over one or more of BFCL's backends (a
file system, trading, travel booking, ...). The model is shown the functions of the
backends the entry involves (`task_specs`); its calls run, through toolpolicy's gate, on
this episode's own backend instances (`BfclSession`). When it answers without a call,
the turn ends and the next user message follows; after the last turn the episode ends.

Scoring is BFCL's (bfcl_eval's multi_turn_checker, whose `state_checker` and
`response_checker` run here unchanged). The session replays the ground truth of each
turn on a second set of instances as the turn ends, and on every turn whose ground truth
is not empty checks, in order:
    the model made at least one call in the turn ("multi_turn:empty_turn_model_response");
    every backend instance's public state equals the replay's ("instance_state_mismatch");
    every result of the turn's ground-truth calls is among the results of the model's calls
    so far, in any order ("execution_response_mismatch").
The first failure fails the entry; so does an episode cut before its last turn ends
(BFCL's "force_terminated"). Outcome, read by the rewards:

    goal_reached     BFCL's verdict: the entry is solved (`goal_state`, `task_success` read it)
    bfcl_error       the first failure's BFCL error type, "" when solved
    bfcl_detail      its message, with the differing attributes or the missing results
    turns_completed  user turns the model finished, of `turns`
    category         the entry's BFCL category

Differences from BFCL's inference loop, on purpose: calls are the chat template's JSON
tool calls checked against the function docs' schemas (BFCL's prompting handlers decode
Python syntax and run whatever decodes), so a call with a misspelt argument is an invalid
call the model sees rather than a Python TypeError; a call the gate denies never runs; a
model's steps are bounded by the config's `max_turns` over the whole episode, where BFCL
allows 20 per turn. As in BFCL, a withheld (miss_func) function is only hidden from the
listed docs: its backend has the method, so a call to it runs (BFCL's own ground truth of
multi_turn_miss_func_49 calls `tail` two turns before `tail` is shown). With the gate off, the replay of the ground truth scores 100% on every
entry of every category (tests/test_bfcl_multi_turn.py).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from toolpolicy.envs.base import Env, Session, cycled_draw
from toolpolicy.envs.bfcl.backends import (
    accepted_arguments, fresh_instances, method_owners, parse_call, run_method, tool_spec,
)
from toolpolicy.envs.bfcl.data import BACKENDS, CATEGORIES, Entry, function_docs, load_entries, split_of
from toolpolicy.tools import ToolSet
from toolpolicy.tools.schema_tool import SchemaTool, schema_tool
from toolpolicy.types import Message, Task, ToolResult, ToolSpec

POLICY_FILE = Path(__file__).with_name("policy.yaml")

SYSTEM_PROMPT = (
    "You complete the user's requests by calling the functions listed. Keep calling functions until "
    "the request is done, then reply without a call; the user's next request follows. If a request "
    "cannot be done with the functions or the details you have, say what is missing and make no call."
)

MORE_FUNCTIONS = "I have updated some more functions you can choose from. What about now?"
"""BFCL's user message on the turn where withheld functions are added (after their docs, as in
its prompting mode: DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING)."""

DONE, CANNOT = "Done.", "I cannot do that with the functions and details I have."
"""The demonstrator's closing words on a turn it completed / on a turn with nothing to call."""

def listed_functions(entry: Entry, turn: int) -> list[dict[str, Any]]:
    """The function docs the model has at `turn`: its backends' in order, less those still withheld."""
    withheld = {name for at, names in entry.held_out.items() if at > turn for name in names}
    return [doc for name in entry.classes for doc in function_docs(name) if doc["name"] not in withheld]


def added_functions(entry: Entry, turn: int) -> list[dict[str, Any]]:
    """The docs of the functions that `turn` adds (miss_func), in the backends' order."""
    names = set(entry.held_out.get(turn, ()))
    return [doc for name in entry.classes for doc in function_docs(name) if doc["name"] in names]


def user_message(entry: Entry, turn: int) -> str:
    """The user's message of `turn`; on a turn that adds functions, their docs and BFCL's line."""
    added = added_functions(entry, turn)
    if not added:
        return entry.turns[turn]
    docs = "\n".join(json.dumps(tool_spec(doc).to_openai()["function"]) for doc in added)
    return f"{docs}\n{MORE_FUNCTIONS}"


def turn_failure(session: BfclSession, expected: list[str]) -> dict[str, str] | None:
    """BFCL's checks of one turn whose ground truth is not empty (see the module docstring),
    or None when the turn passes. Only JSON-able parts of the checkers' reports are kept."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

    if session.turn_calls == 0:
        return {"error_type": "multi_turn:empty_turn_model_response",
                "detail": f"Model response list is empty for turn {session.turn}"}
    state = state_checker(session.instances, session.reference)
    if not state["valid"]:
        differing = sorted(state["details"]["differences"])
        return {"error_type": state["error_type"], "detail": f"{state['error_message']} Attributes: {differing}"}
    response = response_checker(session.results, expected, session.turn)
    if not response["valid"]:
        missing = [text[:200] for text in response["details"]["missing_items"]]
        return {"error_type": response["error_type"], "detail": f"{response['error_message']} Missing: {missing}"}
    return None


@cache
def unbound_tool(name: str) -> SchemaTool:
    """BFCL function `name` as a tool, its schema checker built once (building one takes tens
    of milliseconds); sessions bind it to their own backends with `dataclasses.replace`."""
    spec = tool_spec(next(doc for backend in BACKENDS for doc in function_docs(backend) if doc["name"] == name))
    return schema_tool(spec, _not_bound(name), "BFCL function", accepted_arguments(spec))


def _not_bound(name: str) -> Callable[..., Any]:
    def never(**arguments: Any) -> None:
        raise RuntimeError(f"{name} runs on an episode's own backends (BfclMultiTurnEnv.session)")

    return never


class BfclSession(Session):
    """One episode of one entry: the model's backend instances, the ground truth's, and BFCL's verdict so far."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.instances = fresh_instances(entry)
        self.reference = fresh_instances(entry)
        self.owners, self.reference_owners = method_owners(self.instances), method_owners(self.reference)
        self.turn = 0
        self.turn_calls = 0
        """Calls that reached a backend in the current turn (BFCL's "model response list")."""
        self.results: list[str] = []
        """Execution results of every call the model made so far, all turns (the response check reads them)."""
        self.failure: dict[str, str] | None = None
        self.tools = self._toolset()
        """Every function of the entry's backends, withheld ones too (see the module docstring)."""

    def _toolset(self) -> ToolSet:
        every = [doc["name"] for name in self.entry.classes for doc in function_docs(name)]
        return ToolSet([replace(unbound_tool(name), fn=self._runner(name)) for name in every])

    def _runner(self, name: str) -> Callable[..., ToolResult]:
        def run(**arguments: Any) -> ToolResult:
            text, raised = run_method(self.owners[name], name, arguments)
            self.results.append(text)
            self.turn_calls += 1
            return ToolResult(text, "tool_error" if raised else None, self._facts())

        run.__name__ = name
        return run

    def _facts(self) -> dict[str, Any]:
        """What the policy reads as `state`: where the entry involves messaging, the
        workspace's user ids (MessageAPI's user_map, added contacts included) as `contacts`."""
        messages = self.instances.get("MessageAPI")
        return {} if messages is None else {"contacts": sorted(messages.user_map.values())}

    def on_answer(self, messages: list[Message]) -> list[Message] | None:
        """The model ended its turn: check it as BFCL does, then the next user turn, or None after the last."""
        self._close_turn()
        self.turn += 1
        if self.turn >= len(self.entry.turns):
            return None
        return [Message("user", user_message(self.entry, self.turn))]

    def _close_turn(self) -> None:
        truth = [parse_call(text, self.reference_owners) for text in self.entry.ground_truth[self.turn]]
        expected = [run_method(self.reference_owners[c.name], c.name, c.arguments)[0] for c in truth]
        if truth and self.failure is None:
            failure = turn_failure(self, expected)
            self.failure = None if failure is None else {**failure, "turn": str(self.turn)}
        self.turn_calls = 0

    def finish(self) -> dict[str, Any]:
        turns = len(self.entry.turns)
        failure = self.failure
        if failure is None and self.turn < turns:
            failure = {"error_type": "multi_turn:force_terminated",
                       "detail": f"the episode ended after {self.turn} of {turns} turns"}
        return {
            "goal_reached": failure is None, "bfcl_error": failure["error_type"] if failure else "",
            "bfcl_detail": failure["detail"] if failure else "", "turns_completed": self.turn, "turns": turns,
            "category": self.entry.category,
        }


def _gate_view(name: str) -> SchemaTool:
    """The tool as the gate reads it: its schema is the argument names the session enforces."""
    tool = unbound_tool(name)
    return replace(tool, spec=replace(tool.spec, parameters=accepted_arguments(tool.spec)))


@cache
def all_tools() -> ToolSet:
    """Every backend's functions, for the gate (a policy may name any of them). The prompt
    lists only the entry's (`BfclMultiTurnEnv.task_specs`), with their types."""
    return ToolSet([_gate_view(doc["name"]) for backend in BACKENDS for doc in function_docs(backend)])


@dataclass(frozen=True)
class BfclMultiTurnOptions:
    """bfcl_multi_turn's options (env.OPTION in a config)."""

    categories: tuple[str, ...] = CATEGORIES
    """The BFCL categories to draw entries from (default: all four)."""


class BfclMultiTurnEnv(Env):
    """BFCL v4's multi-turn entries on their own backends; see the module docstring."""

    name = "bfcl_multi_turn"
    system_prompt = SYSTEM_PROMPT
    policy_file = POLICY_FILE
    success_reward = "task_success"
    default_rewards = {"task_success": 1.0, "invalid_call_count": -0.1, "policy_violation": -0.25, "tool_call_count": 0.0}

    def __init__(self, options: BfclMultiTurnOptions = BfclMultiTurnOptions()) -> None:
        self.categories = tuple(options.categories)
        self.entries = {entry.id: entry for category in self.categories for entry in load_entries(category)}
        self.tools = all_tools()

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        """`n` entries of `split`, shuffled by `seed`; past the split's size it starts a new shuffle."""
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r}: use 'train' or 'eval'")
        pool = sorted(entry_id for entry_id in self.entries if split_of(entry_id) == split)
        return [self.task(entry_id) for entry_id in cycled_draw(pool, n, f"bfcl_multi_turn/{split}/{seed}")]

    def task(self, entry_id: str) -> Task:
        """The task of one entry, by its BFCL id."""
        entry = self.entries[entry_id]
        return Task(entry.id, entry.turns[0], "", {"category": entry.category, "turns": len(entry.turns)})

    def task_specs(self, task: Task) -> list[ToolSpec]:
        """The functions listed to the model for `task`: its backends', less those withheld at first."""
        return [tool_spec(doc) for doc in listed_functions(self.entries[task.id], 0)]

    def on_answer(self, task: Task, messages: list[Message]) -> list[Message] | None:
        raise RuntimeError("bfcl_multi_turn episodes run in a session: use env.session(task)")

    def session(self, task: Task) -> BfclSession:
        return BfclSession(self.entries[task.id])

    def expert_turns(self, task: Task, rng: random.Random, style: Any = None) -> list[Message]:
        """The ground truth as assistant turns: per user turn, its calls in one message then a
        closing reply (or only the reply when there is nothing to call). An exact demonstrator:
        `rng` and `style` are unused (BFCL has no imperfect answers to draw from)."""
        entry = self.entries[task.id]
        owners = method_owners(fresh_instances(entry))
        turns: list[Message] = []
        for truth in entry.ground_truth:
            calls = tuple(parse_call(text, owners) for text in truth)
            if calls:
                turns.append(Message("assistant", "", calls))
            turns.append(Message("assistant", DONE if calls else CANNOT))
        return turns


def demonstrate(task: Task, rng: random.Random, env: BfclMultiTurnEnv) -> list[Message]:
    """BFCL's ground truth, replayed exactly (its entries hold no imperfect answers to draw from)."""
    return env.expert_turns(task, rng)
