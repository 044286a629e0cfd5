"""Episodes run their turn's tool calls at once (threads), and nothing else changes."""

from __future__ import annotations

import threading
import time

from toolpolicy.envs import CalcEnv
from toolpolicy.model import char_codec, make_template
from toolpolicy.rollout import EpisodeLimits, RolloutEngine, ScriptedBackend
from toolpolicy.tools import ToolSet, tool
from toolpolicy.types import Message, ToolCall

TEMPLATE = make_template(compact=True)
CALL = Message("assistant", "", (ToolCall("calculator", {"expression": "12 * 7"}),))
ANSWER = Message("assistant", "Answer: 84")


class SlowCalcEnv(CalcEnv):
    """calc whose calculator waits 0.2 s, as a tool behind a network would, and counts how
    many of its calls were in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = self.most_at_once = 0
        lock = threading.Lock()

        @tool
        def calculator(expression: str) -> str:
            """Evaluate an arithmetic expression.

            Args:
                expression: the arithmetic to evaluate.
            """
            with lock:
                self.in_flight += 1
                self.most_at_once = max(self.most_at_once, self.in_flight)
            time.sleep(0.2)
            with lock:
                self.in_flight -= 1
            return "84"

        self.tools = ToolSet([calculator])


def run(workers: int) -> tuple[list[list[int]], list[list[str]], int]:
    encode, decode = char_codec()
    env = SlowCalcEnv()
    scripts = {i: [CALL, CALL, ANSWER] for i in range(8)}
    backend = ScriptedBackend(scripts, TEMPLATE.render_assistant, encode)
    limits = EpisodeLimits(max_tokens=4000, max_turn_tokens=400)
    engine = RolloutEngine(env, TEMPLATE, encode, decode, backend, limits, tool_workers=workers)
    trajectories = engine.run(env.tasks("train", 8, seed=3))
    events = [[f"{e.kind}:{e.turn}" for e in t.episode.events] for t in trajectories]
    return [t.token_ids for t in trajectories], events, env.most_at_once


def test_tools_of_different_episodes_run_at_once_with_the_same_result() -> None:
    ids_one, events_one, most_one = run(workers=1)
    ids_many, events_many, most_many = run(workers=8)
    assert most_one == 1
    assert most_many >= 2, "with 8 workers, the 8 episodes' calls should overlap"
    assert ids_many == ids_one
    assert events_many == events_one
    assert all(e == ["tool_call:0", "tool_call:1"] for e in events_one)
