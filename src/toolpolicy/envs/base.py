"""What an environment is: task data, a turn hook and scoring inputs.

The rollout engine owns the turn loop, tool execution and tokens. An environment
only says which tasks exist, how an episode starts, what happens when the
assistant answers without calling a tool (a simulated user may reply; by
default the episode ends), and which reward weights score it.
"""

from __future__ import annotations

from typing import Protocol

from toolpolicy.tools import ToolSet
from toolpolicy.types import Message, Task


class Env(Protocol):
    """The contract every environment meets. `Split` names are "train" and "eval"."""

    name: str
    tools: ToolSet
    system_prompt: str
    default_rewards: dict[str, float]

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


def opening(system_prompt: str, task: Task) -> list[Message]:
    """The usual start of an episode: the system prompt and the task as a user turn."""
    return [Message("system", system_prompt), Message("user", task.prompt)]
