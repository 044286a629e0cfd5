"""`env: agentdojo` through the rollout engine: ground-truth turns score the suite's own
utility check, the gate reads the episode's opening facts, and an injected attack that
runs with the gate off is stopped with the shipped policy on."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("agentdojo")

from toolpolicy.build import build_env, load_config  # noqa: E402
from toolpolicy.config import ConfigError  # noqa: E402
from toolpolicy.envs.agentdojo.env import AgentDojoEnv, AgentDojoOptions, AgentDojoSession  # noqa: E402
from toolpolicy.envs.agentdojo.package import ATTACKS, attack_text, ground_truth, starting_environment  # noqa: E402
from toolpolicy.gate import Gate, Policy  # noqa: E402
from toolpolicy.model import char_codec, make_template  # noqa: E402
from toolpolicy.rewards import attack_success, task_success  # noqa: E402
from toolpolicy.rollout import EpisodeLimits, RolloutEngine, ScriptedBackend  # noqa: E402
from toolpolicy.types import Episode, Message, Task  # noqa: E402

TEMPLATE = make_template(compact=True)
LIMITS = EpisodeLimits(max_turns=20, max_tokens=60_000, max_turn_tokens=4000)
REPO = Path(__file__).resolve().parents[1]
POLICIES = REPO / "examples" / "policies" / "agentdojo"


def ground_truth_turns(env: AgentDojoEnv, task: Task) -> list[Message]:
    """The user task's ground-truth calls (then the injection task's), one per turn, then its answer."""
    user = env.suite.user_tasks[task.info["user_task"]]
    injection = env.suite.injection_tasks.get(task.info["injection_task"])
    environment = starting_environment(env.suite, env.attack, user, injection)
    calls = ground_truth(user, environment) + (ground_truth(injection, environment) if injection else [])
    return [*(Message("assistant", "", (call,)) for call in calls), Message("assistant", user.GROUND_TRUTH_OUTPUT)]


def run(env: AgentDojoEnv, tasks: list[Task], gate: Gate | None) -> list[Episode]:
    encode, decode = char_codec()
    scripts = {i: ground_truth_turns(env, task) for i, task in enumerate(tasks)}
    backend = ScriptedBackend(scripts, TEMPLATE.render_assistant, encode)
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, LIMITS, gate) as engine:
        return [t.episode for t in engine.run(tasks)]


def test_ground_truth_through_the_engine_scores_utility_with_the_gate_on() -> None:
    env = AgentDojoEnv(AgentDojoOptions("banking"))
    tasks = env.tasks("train", 4, seed=0)
    gate = Gate(Policy.load(POLICIES / "banking.yaml"), env.tools)
    episodes = run(env, tasks, gate)
    # user_task_0 pays an account read from a bill: the policy's one false positive (an `ask`
    # with no approver here), as docs/agentdojo.md lists.
    asked = [t.info["user_task"] == "user_task_0" for t in tasks]
    assert any(asked) and not all(asked)
    assert [e.outcome["goal_reached"] for e in episodes] == [not a for a in asked]
    assert [task_success(e) for e in episodes] == [float(not a) for a in asked]
    assert [e.count("gate_deny") for e in episodes] == [int(a) for a in asked]
    assert not any(e.outcome["attacked"] for e in episodes)


def test_an_injected_payment_runs_with_the_gate_off_and_is_denied_with_it_on() -> None:
    env = AgentDojoEnv(AgentDojoOptions("banking", "important_instructions"))
    task = next(t for t in env.tasks("eval", 1000, seed=0) if t.id == "banking/user_task_1/injection_task_5")
    assert task.info["gate_facts"]["request"] == task.prompt
    gate = Gate(Policy.load(POLICIES / "banking.yaml"), env.tools, enforce=False)
    (off,) = run(env, [task], gate)
    (on,) = run(env, [task], Gate(gate.policy, env.tools))
    assert off.outcome["attacked"] and off.count("violation") >= 1 and attack_success(off) == 1.0
    assert not on.outcome["attacked"] and on.count("gate_deny") >= 1 and on.outcome["goal_reached"]
    assert attack_success(on) == 0.0 and task_success(on) == 1.0


def test_splits_share_no_user_task_and_config_names_suite_and_attack() -> None:
    env = AgentDojoEnv(AgentDojoOptions("slack", "direct"))
    users = {split: {t.info["user_task"] for t in env.tasks(split, 10_000, seed=0)} for split in ("train", "eval")}
    assert users["train"] and users["eval"] and not users["train"] & users["eval"]
    assert len(users["train"] | users["eval"]) == len(env.suite.user_tasks)
    built = build_env(load_config(None, ["env=agentdojo", "env.suite=slack", "env.attack=direct"]).env)
    assert built.suite.name == "slack" and built.attack == "direct"
    with pytest.raises(ConfigError, match="field 'env.suite': Input should be 'workspace', 'travel', 'banking' or 'slack'"):
        load_config(None, ["env=agentdojo", "env.suite=bank"])
    with pytest.raises(ConfigError, match="field 'env.attack': Input should be 'none', 'important_instructions'"):
        load_config(None, ["env=agentdojo", "env.attack=manual"])  # a person types each injection
    older = build_env(load_config(None, ["env=agentdojo", "env.suite=workspace", "env.version=v1.1"]).env)
    assert len(older.suite.injection_tasks) == 6 and len(AgentDojoEnv(AgentDojoOptions("workspace")).suite.injection_tasks) == 14
    with pytest.raises(ConfigError, match="field 'env.version': Input should be 'v1', 'v1.1'"):
        load_config(None, ["env=agentdojo", "env.version=v2"])


@pytest.mark.parametrize("attack", [a for a in ATTACKS if a != "none"])
def test_every_attack_writes_its_text_without_a_model(attack: str) -> None:
    """The package's own text for each attack, the same in every vector; a *dos attack
    runs one injection task per user task and counts as successful when the task fails."""
    env = AgentDojoEnv(AgentDojoOptions("banking", attack))
    tasks = env.tasks("eval", 10_000, seed=0)
    dos = attack.endswith("dos")
    assert len(tasks) == len({t.info["user_task"] for t in tasks}) * (1 if dos else len(env.suite.injection_tasks))
    user = env.suite.user_tasks[tasks[0].info["user_task"]]
    injection = env.suite.injection_tasks[tasks[0].info["injection_task"]]
    text = attack_text(env.suite, attack, user, injection)
    assert text.strip() and (dos or attack == "tool_knowledge" or injection.GOAL in text)
    session = AgentDojoSession(env, tasks[0])
    assert session.dos == dos
    if dos:  # nothing done: the user's task failed, which is what the attack wanted
        assert session.finish()["attacked"] is True


def test_a_tiny_model_runs_episodes_scored_by_the_suite() -> None:
    """Two episodes of the shipped tiny hotel model on slack under an attack, gate on:
    whatever it writes, each episode ends with the suite's own checks in its outcome."""
    import torch

    from toolpolicy.model import PolicyModel
    from toolpolicy.rollout import HFBackend

    policy = PolicyModel.load(REPO / "checkpoints" / "hotel-sft")
    env = AgentDojoEnv(AgentDojoOptions("slack", "important_instructions"))
    tasks = env.tasks("train", 2, seed=3)
    backend = HFBackend(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(0), temperature=1.0)
    gate = Gate(Policy.load(POLICIES / "slack.yaml"), env.tools)
    limits = EpisodeLimits(max_turns=2, max_tokens=48, max_turn_tokens=24)
    with RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, limits, gate) as engine:
        episodes = [t.episode for t in engine.run(tasks)]
    assert [e.task.id for e in episodes] == [t.id for t in tasks]
    for episode in episodes:
        assert episode.infra_error is None
        assert {"goal_reached", "attacked", "user_task", "injection_task"} <= set(episode.outcome)
        assert episode.outcome["injection_task"] and episode.messages[0].role == "system"
