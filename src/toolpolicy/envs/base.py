"""What an environment is: task data, a turn hook and scoring inputs.

The rollout engine owns the turn loop, tool execution and tokens. An environment
only says which tasks exist, how an episode starts, what happens when the
assistant answers without calling a tool (a simulated user may reply; by
default the episode ends), and which reward weights score it.

`Env` and `Session` are base classes: the members an environment must give are
annotated on them, and every hook it may give is a method or attribute with the
default most environments want, so a type checker (and a reader) sees what there is
to override. The engine calls the hooks; it never asks whether one exists.

Subclassing `Env` is the way to write one. A plain class with only the required
members (a plugin written to the contract alone, a test's small environment) still
works: `as_env` gives the engine a view of it that shares its attributes and takes the
base's defaults for the hooks it lacks. Adopting it once where an environment enters
(`make_env`, the engine's constructor), rather than requiring the base, keeps every
such class running unchanged, and the rest of the code still meets one type whose
hooks it calls without asking whether they exist.

Hooks:

- `session(task)`: an environment whose tools change state (a database, files)
  gives each episode its own `Session`: the tools bound to that episode's copy of
  the state, the user's replies, and at the end an outcome (e.g. whether the
  database reached the goal state) that reward functions read from
  `Episode.outcome`. By default episodes share `env.tools` (`SharedSession`).
- `Session.run_admitted(call, decision)`: the engine's gate is the only judge of a
  call. A session that needs to know what it decided (hotel counts a write the
  policy forbade, run in shadow mode, as a violation and not also as a wrong write)
  overrides it; by default it runs the call on `session.tools`.
- `single_turn = True` (on a session, or on an environment for its shared session)
  ends the episode after the model's first assistant turn, whether it called tools
  or not: its calls are gated and counted (`tool_call`, `invalid_call` events) but
  their observations are never shown, because nothing follows. `bfcl` uses it:
  BFCL's single-turn entries score the calls of one answer and have no backends
  to run them on.
- `task_specs(task)`: the tools the model is shown for `task`; by default
  `env.tools`. An environment whose tasks each have their own tools (bfcl,
  bfcl_multi_turn) overrides it, while `env.tools` stays the whole set the gate knows.
- `policy_file`: the policy the gate enforces when the config names none ("": allow all).
- `user_scenario(task)`: what a served model playing the user (`env.user_url`) is
  told about `task`; only an environment with a simulated user gives it.
- `reading_pictures(n, seed)`: an environment that shows pictures gives pictures
  with what lies where (types.Reading), which the embedded vision-language model
  learns to read before SFT (model/reading.py).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from toolpolicy.tools import ToolSet
from toolpolicy.types import Message, Reading, Task, ToolCall, ToolResult, ToolSpec

if TYPE_CHECKING:
    from toolpolicy.gate import Decision

Probability = Annotated[float, Field(ge=0, le=1)]
"""An option of a demonstrator (or environment) that is a probability: checked in [0, 1]."""


class Session:
    """One episode's live state: its tools, the replies to its answers, its outcome."""

    tools: ToolSet
    single_turn: bool = False
    """True ends the episode after the first assistant turn (see the module docstring)."""

    def on_answer(self, messages: list[Message]) -> list[Message] | None:
        """As Env.on_answer, for this episode."""
        return None

    def run_admitted(self, call: ToolCall, decision: Decision) -> ToolResult:
        """Run a call the gate admitted (allowed, or denied in shadow mode: `decision.allowed`)."""
        return self.tools.call(call)

    def finish(self) -> dict[str, Any]:
        """End the episode: release its resources and return its outcome for the rewards."""
        return {}


class Env:
    """The contract every environment meets. `Split` names are "train" and "eval"."""

    name: str
    tools: ToolSet
    system_prompt: str
    default_rewards: dict[str, float]
    success_reward: str
    """The reward function (a built-in name or an import path, as in a config's `rewards`)
    whose value 1.0 means the episode succeeded: accuracy and pass^k count it."""
    single_turn: bool = False
    """True ends each episode of the shared session after its first assistant turn."""
    policy_file: str | Path = ""
    """The policy file the gate enforces unless the config's `gate.policy` names one; "": none."""

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        """`n` tasks of `split`, the same for the same arguments."""
        raise NotImplementedError(f"{type(self).__name__} gives no tasks")

    def initial_messages(self, task: Task) -> list[Message]:
        """The conversation the model sees before its first turn: by default the system
        prompt and the task as a user turn."""
        return opening(self.system_prompt, task)

    def on_answer(self, task: Task, messages: list[Message]) -> list[Message] | None:
        """Called after an assistant message with no tool call: the messages that
        follow it (a user reply), or None to end the episode (the default)."""
        return None

    def session(self, task: Task) -> Session:
        """The episode's own state; by default `env.tools`, shared by every episode."""
        return SharedSession(self, task)

    def task_specs(self, task: Task) -> list[ToolSpec]:
        """The tools the model is shown for `task`; by default `env.tools`."""
        return self.tools.specs()

    def user_scenario(self, task: Task) -> str:
        """What a served model playing the user is told about `task` (env.user_url)."""
        raise NotImplementedError(f"environment {self.name!r} has no simulated user to play")

    def reading_pictures(self, n: int, seed: int) -> list[Reading]:
        """`n` pictures as the model sees them, with what lies where (types.Reading)."""
        raise NotImplementedError(f"environment {self.name!r} shows no pictures")


def shows_each_task_its_tools(env: Env) -> bool:
    """Whether `env` overrides `task_specs`: its tasks have no one set of tools in common."""
    return type(env).task_specs is not Env.task_specs


def offers_reading_pictures(env: Env) -> bool:
    """Whether `env` overrides `reading_pictures`."""
    return type(env).reading_pictures is not Env.reading_pictures


class SharedSession(Session):
    """The session of an environment without per-episode state: its tools and hooks."""

    def __init__(self, env: Env, task: Task) -> None:
        self.env, self.task, self.tools = env, task, env.tools
        self.single_turn = env.single_turn

    def on_answer(self, messages: list[Message]) -> list[Message] | None:
        return self.env.on_answer(self.task, messages)


def as_env(env: object) -> Env:
    """`env` itself if it is an Env; else a view of it (sharing its attributes) whose class
    is its own with Env's defaults under it, for an environment written without the base."""
    return env if isinstance(env, Env) else _adopted(env, Env)  # type: ignore[return-value]


def as_session(session: object) -> Session:
    """`session` itself if it is a Session; else a view of it, as `as_env`."""
    return session if isinstance(session, Session) else _adopted(session, Session)  # type: ignore[return-value]


def open_session(env: Env, task: Task) -> Session:
    """The session of one episode of `task`."""
    return as_session(env.session(task))


def _adopted(thing: object, base: type) -> object:
    view = object.__new__(_under(type(thing), base))
    view.__dict__ = thing.__dict__  # one state: what the engine changes, the caller sees
    return view


@cache
def _under(own: type, base: type) -> type:
    """`own` with `base` after it in the method order: its members win, the base fills in."""
    return type(own.__name__, (own, base), {"__module__": own.__module__, "__doc__": own.__doc__})


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
