"""What an environment is: task data, a turn hook and scoring inputs.

The rollout engine owns the turn loop, tool execution and tokens. An environment
only says which tasks exist, how an episode starts, what happens when the
assistant answers without calling a tool (a simulated user may reply; by
default the episode ends), and which reward weights score it.

An environment whose tools change state (a database, files) gives each episode
its own `Session` through an optional `session(task)` method: the tools bound to
that episode's copy of the state, the user's replies, and at the end an outcome
(e.g. whether the database reached the goal state) that reward functions read
from `Episode.outcome`. Environments without one share `env.tools` across
episodes (`open_session` wraps them).

The engine's gate is the only judge of a call. A session that needs to know what it
decided (hotel counts a write the policy forbade, run in shadow mode, as a violation and
not also as a wrong write) defines `run_admitted(call, decision)`: the engine then runs
every admitted call through it instead of `session.tools.call`.

A session (or an environment without one) that sets `single_turn = True` ends the episode
after the model's first assistant turn, whether it called tools or not: its calls are
gated and counted (`tool_call`, `invalid_call` events) but their observations are never
shown, because nothing follows. `bfcl` uses it: BFCL's single-turn entries score the calls
of one answer and have no backends to run them on.

An environment that shows pictures may offer `reading_pictures(n, seed)`: pictures with
what lies where (types.Reading), which the embedded vision-language model learns to read
before SFT (model/reading.py).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from toolpolicy.tools import ToolSet
from toolpolicy.types import Message, Task, ToolCall, ToolResult, ToolSpec

if TYPE_CHECKING:
    from toolpolicy.gate import Decision


class Env(Protocol):
    """The contract every environment meets. `Split` names are "train" and "eval"."""

    name: str
    tools: ToolSet
    system_prompt: str
    default_rewards: dict[str, float]
    success_reward: str
    """The reward function (a built-in name or an import path, as in a config's `rewards`)
    whose value 1.0 means the episode succeeded: accuracy and pass^k count it."""

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        """`n` tasks of `split`, the same for the same arguments."""
        ...

    def initial_messages(self, task: Task) -> list[Message]:
        """The conversation the model sees before its first turn."""
        ...

    def on_answer(self, task: Task, messages: list[Message]) -> list[Message] | None:
        """Called after an assistant message with no tool call: the messages that
        follow it (a user reply), or None to end the episode."""
        ...


class Session(Protocol):
    """One episode's live state."""

    tools: ToolSet

    def on_answer(self, messages: list[Message]) -> list[Message] | None:
        """As Env.on_answer, for this episode."""
        ...

    def finish(self) -> dict[str, Any]:
        """End the episode: release its resources and return its outcome for the rewards."""
        ...


class SharedSession:
    """The session of an environment without per-episode state: its tools and hooks."""

    def __init__(self, env: Env, task: Task) -> None:
        self.env, self.task, self.tools = env, task, env.tools
        self.single_turn = bool(getattr(env, "single_turn", False))

    def on_answer(self, messages: list[Message]) -> list[Message] | None:
        return self.env.on_answer(self.task, messages)

    def finish(self) -> dict[str, Any]:
        return {}


def open_session(env: Env, task: Task) -> Session:
    """The environment's own session for `task` if it has per-episode state, else a shared one."""
    make = getattr(env, "session", None)
    return make(task) if make is not None else SharedSession(env, task)


def run_admitted(session: Session, call: ToolCall, decision: Decision) -> ToolResult:
    """Run a call the gate admitted: through the session's `run_admitted` if it has one
    (it learns the gate's decision: allowed, or denied in shadow mode), else its tools."""
    run = getattr(session, "run_admitted", None)
    return run(call, decision) if run is not None else session.tools.call(call)


def listed_specs(env: Env, task: Task) -> list[ToolSpec]:
    """The tools the model is shown for `task`. Most environments show `env.tools` on every
    task; one whose tasks each have their own tools (bfcl_multi_turn: the backends an entry
    involves) says which through an optional `task_specs(task)`, while `env.tools` stays
    the whole set the gate knows."""
    specs = getattr(env, "task_specs", None)
    return specs(task) if specs is not None else env.tools.specs()


def opening(system_prompt: str, task: Task) -> list[Message]:
    """The usual start of an episode: the system prompt and the task as a user turn."""
    return [Message("system", system_prompt), Message("user", task.prompt)]


def cycled_draw(pool: Sequence[str], n: int, key: str) -> list[str]:
    """`n` ids from `pool`, as passes of fresh shuffles of all of it (seeded by `key`): each
    id is drawn once per pass, and a draw past the pool's size starts the next pass."""
    if not pool:
        raise ValueError(f"cycled_draw: no ids to draw from ({key})")
    rng = random.Random(key)
    chosen: list[str] = []
    while len(chosen) < n:
        chosen.extend(rng.sample(list(pool), len(pool)))
    return chosen[:n]
