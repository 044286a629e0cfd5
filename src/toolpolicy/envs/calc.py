"""`calc`: arithmetic questions where a calculator helps on some and is needless on others.

Easy tasks are one-digit sums, a table of 100 facts the tiny model learns by heart.
Hard tasks are multi-digit products and sums that it cannot do in its head: the only way to get them right is to call the calculator. The RL claim this
environment demonstrates is that a model can learn *when* to call a tool: always
on hard tasks, rarely on easy ones.

`expert_turns` is the deliberately imperfect demonstrator used for the SFT cold
start: it calls the tool on only some hard tasks (guessing otherwise), calls it
needlessly on many easy ones, and sometimes writes a malformed call and then
fixes it. Its flaws are what RL has to repair.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from toolpolicy.envs.base import Env, Probability
from toolpolicy.tools import ToolSet, calculator
from toolpolicy.types import Message, Task, ToolCall

SYSTEM_PROMPT = "Solve the arithmetic. Use the calculator when unsure. Finish with: Answer: <number>"


@dataclass(frozen=True)
class ExpertStyle:
    """How often the demonstrator does what, per task."""

    tool_on_hard: float = 0.4
    """Probability of calling the calculator on a hard task (otherwise it guesses)."""
    tool_on_easy: float = 0.4
    """Probability of calling the calculator on an easy task (a needless call)."""
    malformed: float = 0.1
    """Probability that a call is first written malformed, then corrected."""


def _easy(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"{a} + {b}", a + b


def _hard(rng: random.Random) -> tuple[str, int]:
    if rng.random() < 0.5:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        return f"{a} * {b}", a * b
    a, b, c = (rng.randint(100, 9999) for _ in range(3))
    return f"{a} + {b} + {c}", a + b + c


@dataclass(frozen=True)
class CalcOptions:
    """calc's options (env.OPTION in a config)."""

    hard_fraction: float = 0.5
    """The share of tasks that are hard (multi-digit products and sums the model must compute
    with the calculator); the others are one-digit sums."""


class CalcEnv(Env):
    """Arithmetic with a calculator tool; see the module docstring."""

    name = "calc"
    system_prompt = SYSTEM_PROMPT
    success_reward = "correct_answer"
    default_rewards = {
        "correct_answer": 1.0,
        "excess_tool_calls": -0.5,
        "invalid_call_count": -0.2,
        "tool_call_count": 0.0,
        "answer_format": 0.0,
    }

    def __init__(self, options: CalcOptions = CalcOptions()) -> None:
        self.tools = ToolSet([calculator])
        self.options = options

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        rng = random.Random(f"calc/{split}/{seed}")
        out = []
        for i in range(n):
            difficulty = "hard" if rng.random() < self.options.hard_fraction else "easy"
            expression, value = (_hard if difficulty == "hard" else _easy)(rng)
            out.append(
                Task(
                    id=f"{split}-{seed}-{i}",
                    prompt=f"What is {expression}?",
                    answer=str(value),
                    info={"difficulty": difficulty, "expression": expression, "min_tool_calls": int(difficulty == "hard")},
                )
            )
        return out

    def expert_turns(self, task: Task, rng: random.Random, style: ExpertStyle) -> list[Message]:
        return expert_turns(task, rng, style)


def _guess(answer: str, rng: random.Random) -> str:
    """A confident wrong answer of the right length: the first digit kept, the rest random."""
    while True:
        guess = answer[0] + "".join(rng.choice("0123456789") for _ in answer[1:])
        if guess != answer or len(answer) == 1:
            return guess if guess != answer else str(int(answer) + 1)


def _malformed_call(expression: str, rng: random.Random) -> Message:
    """A call written wrongly in one of the ways small models do: broken JSON or a wrong argument name."""
    if rng.random() < 0.5:
        body = '{"name": "calculator", "arguments": {"expression": "' + expression + '"}'  # missing brace
        return Message("assistant", f"<tool_call>\n{body}\n</tool_call>")
    return Message("assistant", "", (ToolCall("calculator", {"expr": expression}),))


def expert_turns(task: Task, rng: random.Random, style: ExpertStyle) -> list[Message]:
    """The demonstrator's assistant messages for `task`, in order. Tool results are not
    included: the rollout engine produces them by running the calls, exactly as in RL."""
    expression = task.info["expression"]
    call_rate = style.tool_on_hard if task.difficulty == "hard" else style.tool_on_easy
    if rng.random() >= call_rate:
        answer = task.answer if task.difficulty == "easy" else _guess(task.answer, rng)
        return [Message("assistant", f"Answer: {answer}")]
    turns = [_malformed_call(expression, rng)] if rng.random() < style.malformed else []
    turns.append(Message("assistant", "", (ToolCall("calculator", {"expression": expression}),)))
    turns.append(Message("assistant", f"Answer: {task.answer}"))
    return turns


def demonstrate(
    task: Task, rng: random.Random, env: Env, *, tool_on_hard: Probability = 0.4, tool_on_easy: Probability = 0.4,
    malformed: Probability = 0.1,
) -> list[Message]:
    """calc's imperfect expert, the demonstrator of its SFT cold start.

    Args:
        tool_on_hard: the probability that it calls the calculator on a hard task (else it guesses).
        tool_on_easy: the probability that it makes a needless call on an easy task.
        malformed: the probability that a call is first written malformed, then fixed.
    """
    return expert_turns(task, rng, ExpertStyle(tool_on_hard, tool_on_easy, malformed))
