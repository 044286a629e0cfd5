"""Adder: two-digit sums with an `add` tool, the environment of docs/environments.md."""

import random

from toolpolicy.envs.base import Env
from toolpolicy.tools import ToolSet, tool
from toolpolicy.types import Episode, Task, ToolResult


@tool
def add(a: int, b: int) -> ToolResult:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return ToolResult(str(a + b), facts={"last_sum": a + b})  # facts: what the policy reads as `state`


def used_add(episode: Episode) -> float:
    """1.0 if the episode called `add`: a reward function of our own, reported as `used_add`."""
    return 1.0 if episode.count("tool_call") else 0.0


class AdderEnv(Env):  # the base gives the opening, on_answer (no user: an answer ends it) and the other hooks
    name = "adder"
    system_prompt = "Add with the add tool. Finish with: Answer: <number>"
    default_rewards = {"correct_answer": 1.0, "adder.adder:used_add": 0.0}
    success_reward = "correct_answer"
    tools = ToolSet([add])

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        rng = random.Random(f"adder/{split}/{seed}")
        pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(n)]
        return [Task(f"{split}-{i}", f"What is {a} + {b}?", str(a + b)) for i, (a, b) in enumerate(pairs)]
