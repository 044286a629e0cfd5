"""`hotel`: a hotel desk on a real SQLite database, with a written policy and a simulated guest.

Each episode gets a private copy of the seed database (`HotelSession`). The model
reads the policy as markdown in its system prompt; the same rules, machine-checked,
are policy.yaml (also examples/policies/hotel.yaml): the policy of the engine's one
gate unless `gate.policy` names another. That gate alone judges the calls: those it
denied are the episode's `gate_deny` events, and in shadow mode (`eval --gate off`)
those it would have denied ran and are its `violation` events. The session learns each
admitted call's decision (`run_admitted`), so that a forbidden write run in shadow mode
counts as a violation and not also as a wrong write. Outcome, read by the rewards:

    goal_reached   the final database hashes like the reference run's (tasks.goal_hash)
    wrong_writes   writes the policy allowed that the reference does not make
                   (silent wrong-state writes: wrong booking, wrong amount, unconfirmed change);
                   wrong_write_calls lists them as name(arguments)
    writes         successful write calls
    category, kind the task's
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolpolicy.envs.base import Env, Session
from toolpolicy.envs.hotel.database import TODAY, canonical_hash, fresh_copy
from toolpolicy.envs.hotel.expert import ExpertStyle, expert_turns
from toolpolicy.envs.hotel.tasks import make_tasks, plan_calls
from toolpolicy.envs.hotel.tools import make_tools
from toolpolicy.envs.hotel.user import UserFactory, scenario_text, scripted_user
from toolpolicy.gate import Decision, Policy
from toolpolicy.types import Message, Task, ToolCall, ToolResult

POLICY_FILE = Path(__file__).with_name("policy.yaml")

# The policy as the model reads it: the rules of policy.yaml in words, plus what no gate
# condition can see (asking which booking, confirming a change), which only the database
# comparison checks. Kept to a few lines: the tiny model pays for every prompt token.
POLICY_MARKDOWN = f"""Hotel desk. Today: {TODAY}.
Rules:
- Verify the guest (id, last name, birth year) before using bookings.
- Only their own bookings; read one before changing it.
- Cancel only confirmed bookings over 48h before check-in, or insured.
- Change only confirmed bookings, to dates after today; ask to confirm first.
- Refund at most paid minus refunded.
- Ask which booking if unclear. Refuse politely with the reason.
- Disputes: handoff."""

# Sessions compare writes by these arguments only: free text may differ from the reference.
FREE_TEXT_ARGUMENTS = ("text", "summary")


def write_key(call: ToolCall) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """A write as the database check sees it: the tool and its non-free-text arguments."""
    return call.name, tuple(sorted((k, v) for k, v in call.arguments.items() if k not in FREE_TEXT_ARGUMENTS))


class HotelSession(Session):
    """One episode: its database copy and its guest; it sees every admitted call run."""

    def __init__(self, task: Task, user: UserFactory) -> None:
        self.task = task
        self.db = fresh_copy(task.info["db_seed"])
        self.tools = make_tools(self.db)
        self.effects = {spec.name: spec.effect for spec in self.tools.specs()}
        self.user = user(task)
        reference = plan_calls(task.info["plan"])
        self.expected_writes = Counter(write_key(c) for c in reference if self.effects[c.name] == "write")
        self.writes = 0
        self.wrong_writes: list[str] = []  # permitted writes the reference does not make, as name(arguments)

    def run_admitted(self, call: ToolCall, decision: Decision) -> ToolResult:
        """Run `call`, which the gate allowed, or denied in shadow mode (`decision.allowed`
        False: a violation the gate counts, so not also a wrong write), and count its write."""
        result = self.tools.call(call)
        if not result.ok or self.effects.get(call.name) != "write":
            return result
        self.writes += 1
        key = write_key(call)
        if self.expected_writes[key] > 0:
            self.expected_writes[key] -= 1
        elif decision.allowed:
            self.wrong_writes.append(f"{call.name}({', '.join(f'{k}={v}' for k, v in key[1])})")
        return result

    def on_answer(self, messages: list[Message]) -> list[Message] | None:
        text = self.user.reply(messages)
        return None if text is None else [Message("user", text)]

    def finish(self) -> dict[str, Any]:
        """The outcome for the rewards. Raises if the simulated user failed (an endpoint
        down): the engine then marks the episode an infrastructure error, not a failure."""
        try:
            reached = canonical_hash(self.db) == self.task.info["goal_hash"]
        finally:
            self.db.close()
        if error := getattr(self.user, "error", None):
            raise RuntimeError(f"the simulated user failed: {error}")
        return {
            "goal_reached": reached, "wrong_writes": len(self.wrong_writes), "wrong_write_calls": self.wrong_writes, "writes": self.writes,
            "category": self.task.info["category"], "kind": self.task.info["kind"],
        }


@dataclass(frozen=True)
class HotelOptions:
    """hotel's options (env.OPTION in a config)."""

    db_seed: int = 0
    """The seed of the hotel's database (its guests and bookings) and of its tasks."""


class HotelEnv(Env):
    """Hotel stays on SQLite; see the module docstring.

    Args:
        options: its options (HotelOptions).
        user: the simulated guest, a factory `(task) -> User` (env.user, env.user_url; the
            scripted guest by default).
    """

    name = "hotel"
    system_prompt = POLICY_MARKDOWN
    policy_file = POLICY_FILE
    success_reward = "task_success"
    default_rewards = {
        "task_success": 1.0,
        "policy_violation": -0.25,
        "invalid_call_count": -0.1,
        "wrong_state_writes": 0.0,
        "goal_state": 0.0,
        "facts_communicated": 0.0,
        "tool_call_count": 0.0,
    }

    def __init__(self, options: HotelOptions = HotelOptions(), user: UserFactory = scripted_user) -> None:
        self.db_seed = options.db_seed
        self.user = user
        self.policy = Policy.load(POLICY_FILE)
        self.tools = make_tools(fresh_copy(self.db_seed))  # the specs the template lists and the gate checks; episodes use their own copy

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        return make_tasks(split, n, seed, self.db_seed)

    def on_answer(self, task: Task, messages: list[Message]) -> list[Message] | None:
        raise RuntimeError("hotel episodes run in a session: use env.session(task)")

    def session(self, task: Task) -> HotelSession:
        return HotelSession(task, self.user)

    def user_scenario(self, task: Task) -> str:
        """The guest's situation and wishes, for a served model playing the guest."""
        return scenario_text(task)

    def expert_turns(self, task: Task, rng: random.Random, style: ExpertStyle) -> list[Message]:
        """The imperfect demonstrator's assistant turns for `task` (see expert.py)."""
        return expert_turns(task, rng, style)
