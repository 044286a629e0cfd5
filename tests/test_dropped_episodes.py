"""Nothing is dropped in silence: a tool that raises something other than ToolError ends its
episode as an infrastructure error naming the tool, the exception and the fix; RL and eval
say how many episodes they dropped and why, RL logs the count per tool, and RL stops when a
step drops more than half of its episodes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from toolpolicy.build import prepare_run_dir
from toolpolicy.build import load_config
from toolpolicy.envs.base import opening
from toolpolicy.eval import run as eval_run
from toolpolicy.model import char_codec, make_template
from toolpolicy.rollout import EpisodeLimits, RolloutEngine, ScriptedBackend
from toolpolicy.rollout.dropped import dropped_line, dropped_metrics
from toolpolicy.tools import ToolError, ToolSet, tool
from toolpolicy.trainer import rl
from toolpolicy.trainer.groups import EpisodesDropped, StepRollouts
from toolpolicy.trainer.rl import train_rl
from toolpolicy.types import Message, Task, ToolCall, ToolResult

from conftest import SMOKE

TEMPLATE = make_template(compact=True)
RAISED = "tool 'convert' raised ValueError: unit 'parsec' (raise toolpolicy.tools.ToolError to show the model the message)"


@tool
def convert(metres: float, unit: str) -> float:
    """Convert a length in metres.

    Args:
        metres: The length.
        unit: "km" or "cm"; "mile" is the model's mistake to fix, anything else a bug here.
    """
    if unit == "mile":
        raise ToolError("no miles here: use km or cm")
    if unit not in ("km", "cm"):
        raise ValueError(f"unit {unit!r}")  # a plain exception: the episode is dropped
    return metres * {"km": 0.001, "cm": 100.0}[unit]


class ConvertEnv:
    name = "convert"
    system_prompt = "Convert."
    default_rewards = {"correct_answer": 1.0}
    success_reward = "correct_answer"
    tools = ToolSet([convert])

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        return [Task(f"{split}-{i}", "2 m in cm?", "200") for i in range(n)]

    def initial_messages(self, task: Task) -> list[Message]:
        return opening(self.system_prompt, task)

    def on_answer(self, task: Task, messages: list[Message]) -> None:
        return None


def calls(unit: str) -> Message:
    return Message("assistant", "", (ToolCall("convert", {"metres": 2, "unit": unit}),))


def six_episodes() -> list:
    """Six episodes: one calls convert with a unit that makes it raise ValueError, one with
    a unit it answers with ToolError, four answer right away."""
    encode, decode = char_codec()
    answer = Message("assistant", "Answer: 200")
    scripts = {0: [calls("parsec"), answer], 1: [calls("mile"), answer], **{i: [answer] for i in range(2, 6)}}
    backend = ScriptedBackend(scripts, TEMPLATE.render_assistant, encode)
    env = ConvertEnv()
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, EpisodeLimits(max_tokens=4000, max_turn_tokens=400)) as engine:
        return [t.episode for t in engine.run(env.tasks("eval", 6, 0))]


def test_a_tool_that_raises_drops_its_episode_naming_the_tool_the_exception_and_the_fix():
    raised = ConvertEnv.tools.call(ToolCall("convert", {"metres": 2, "unit": "parsec"}))
    assert raised == ToolResult(RAISED, "exception")
    broken, model_fault, *answered = six_episodes()
    assert broken.infra_error == RAISED
    assert not any(m.role == "tool" for m in broken.messages)  # the model never saw the message
    assert model_fault.infra_error is None and "Error: no miles here: use km or cm" in [m.content for m in model_fault.messages]
    assert all(e.infra_error is None for e in answered)
    line = dropped_line([broken, model_fault, *answered])
    assert line == f"dropped 1 of 6 episodes (infrastructure errors: not scored, not trained on): {broken.infra_error}"
    assert dropped_metrics([broken, model_fault, *answered]) == {"infra_errors/convert": 1}


def test_the_dropped_line_counts_each_cause_and_names_the_first_three():
    episodes = six_episodes()
    failures = [RAISED, RAISED, "audit log: disk full", "session finish: KeyError: 'db'", "tool 'add' failed (infra): gone"]
    for episode, failure in zip(episodes, failures):
        episode.infra_error = failure
    line = dropped_line(episodes)
    assert line == (
        "dropped 5 of 6 episodes (infrastructure errors: not scored, not trained on): "
        f"2x {RAISED}; audit log: disk full; session finish: KeyError: 'db'; and 1 other causes"
    )
    assert dropped_metrics(episodes) == {"infra_errors/add": 1, "infra_errors/convert": 2}
    assert dropped_line(six_episodes()[1:]) is None


def test_eval_reports_its_dropped_episodes_on_stderr_and_in_the_summary(tmp_path, monkeypatch, capsys):
    episodes = six_episodes()
    monkeypatch.setattr(eval_run, "_run_checkpoint", lambda cfg, checkpoint, name, gate: (ConvertEnv(), [(e, 0) for e in episodes]))
    cfg = load_config(SMOKE, [f"run.dir={tmp_path}"])
    summary = eval_run.evaluate(cfg, tmp_path, "broken", tmp_path)
    assert summary["infra_errors"] == 1 and summary["n"] == 5
    assert summary["dropped"] == {episodes[0].infra_error: 1}
    assert json.loads((tmp_path / "eval" / "broken.json").read_text())["dropped"] == summary["dropped"]
    assert f"warning: eval broken: {dropped_line(episodes)}\n" in capsys.readouterr().err


def test_rl_warns_and_logs_each_step_it_drops_episodes_from_and_stops_past_half(untrained, tmp_path, monkeypatch, capsys):
    """Step 1 drops one episode (a warning, and infra_errors/convert in the metrics); step 2
    drops all but one (the run stops with a user error saying why)."""
    sampled = rl.sample_groups

    def tools_fail(pool, rubric, credit, sampling, step: int, first=None, replay=None) -> StepRollouts:
        rollouts = sampled(pool, rubric, credit, sampling, step, first, replay)
        broken = 1 if step == 0 else len(rollouts.trajectories) - 1
        for trajectory in rollouts.trajectories[:broken]:
            trajectory.episode.infra_error = RAISED
        return replace(rollouts, usable=rollouts.usable.clone().index_fill_(0, torch.arange(broken), False))

    monkeypatch.setattr(rl, "sample_groups", tools_fail)
    settings = [f"rl.init_from={untrained}", "rollout.max_tokens=64", "rl.steps=3", f"run.dir={tmp_path / 'run'}"]
    cfg = load_config(SMOKE, settings)
    with pytest.raises(EpisodesDropped) as dropped:
        train_rl(cfg, prepare_run_dir(cfg))
    episodes = cfg.rl.prompts_per_step * cfg.rl.group_size
    assert str(dropped.value).startswith(f"rl step 2 dropped {episodes - 1} of {episodes} episodes")
    assert "fix the tool or service" in str(dropped.value)
    err = capsys.readouterr().err
    assert f"warning: rl step 1: dropped 1 of {episodes} episodes (infrastructure errors: not scored, not trained on): {RAISED}" in err
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["infra_errors"], r["infra_errors/convert"]) for r in rows] == [(1, 1, 1)]
