"""Branched episodes (rollout/branch.py): a continuation of an episode's first turns starts
from its exact token ids, with the environment's database and the gate's ledger rebuilt by
replaying the prefix's calls, which the audit log does not record twice."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from toolpolicy.envs.hotel import HotelEnv
from toolpolicy.gate import AuditLog, Gate
from toolpolicy.model import char_codec, make_template
from toolpolicy.rewards import task_success
from toolpolicy.rollout import EpisodeLimits, RolloutEngine, ScriptedBackend, Trajectory
from toolpolicy.rollout.branch import Branch
from toolpolicy.types import Message, Task, ToolCall

TEMPLATE = make_template(compact=True)
LIMITS = EpisodeLimits(max_turns=6, max_tokens=6000, max_turn_tokens=400)


def calls(name: str, **arguments) -> Message:
    return Message("assistant", "", (ToolCall(name, arguments),))


@pytest.fixture(scope="module")
def env() -> HotelEnv:
    return HotelEnv()


@pytest.fixture(scope="module")
def cancel(env) -> Task:
    return next(t for t in env.tasks("train", 300, seed=1) if t.info["kind"] == "cancel" and t.info["identity"] == "given")


def script(task: Task) -> list[Message]:
    """A compliant cancellation: verify, read, cancel, say so."""
    info = task.info
    return [
        calls("verify", guest=info["guest"], surname=info["last_name"], year=info["birth_year"]),
        calls("read", booking=info["booking"]),
        calls("cancel", booking=info["booking"]),
        Message("assistant", f"Cancelled, {info['must_say'][0]} refunded."),
    ]


def rollout(env: HotelEnv, tasks: list[Task], scripts: list[list[Message]], audit: Path, branches=None, limits=LIMITS) -> list[Trajectory]:
    encode, decode = char_codec()
    backend = ScriptedBackend(dict(enumerate(scripts)), TEMPLATE.render_assistant, encode)
    gate = Gate(env.policy, env.tools, audit=AuditLog(audit))
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, limits, gate) as engine:
        return engine.run(tasks, branches=branches)


def decisions(audit: Path) -> int:
    return len(audit.read_text().splitlines())


def test_a_branch_continues_the_exact_ids_with_the_ledger_and_database_replayed(env, cancel, tmp_path):
    audit = tmp_path / "audit.jsonl"
    (parent,) = rollout(env, [cancel], [script(cancel)], audit)
    assert task_success(parent.episode) == 1.0 and decisions(audit) == 3

    # After verify and read: the cancel is permitted only for a verified guest who read the
    # booking (the ledger's facts and history), so it runs only if the replay rebuilt them.
    # After the cancel too: the goal is reached only if the replay cancelled in the branch's database.
    branches = [Branch(parent, 2), Branch(parent, 3)]
    after_read, after_cancel = rollout(env, [cancel, cancel], [script(cancel)[2:], script(cancel)[3:]], audit, branches)
    for branch, child in zip(branches, (after_read, after_cancel)):
        assert child.token_ids == parent.token_ids  # the same turns sampled again: the same ids
        assert child.prompt_len == branch.cut and child.loss_mask[: branch.cut] == [0] * branch.cut
        assert child.loss_mask[branch.cut :] == parent.loss_mask[branch.cut :]
        assert child.turn_spans == parent.turn_spans
        assert child.episode.events == parent.episode.events and child.episode.messages == parent.episode.messages
        assert child.episode.outcome == parent.episode.outcome and task_success(child.episode) == 1.0
        assert child.episode.response_tokens == parent.episode.response_tokens and child.episode.infra_error is None
        assert child.sampled_tokens == sum(parent.loss_mask[branch.cut :])
    assert decisions(audit) == 3 + 1  # the branch after the read decided its cancel; the replays logged nothing


def test_a_branch_without_its_replay_would_be_denied_and_miss_the_goal(env, cancel, tmp_path):
    """What the test above guards: the same continuations from a fresh episode fail."""
    audit = tmp_path / "audit.jsonl"
    cold, late = rollout(env, [cancel, cancel], [script(cancel)[2:], script(cancel)[3:]], audit)
    assert cold.episode.count("gate_deny") == 1 and not cold.episode.outcome["goal_reached"]
    assert not late.episode.outcome["goal_reached"]


def test_the_prefix_turns_count_toward_the_turn_budget(env, cancel, tmp_path):
    (parent,) = rollout(env, [cancel], [script(cancel)], tmp_path / "a.jsonl")
    read = calls("read", booking=cancel.info["booking"])
    (child,) = rollout(env, [cancel], [[read] * 5], tmp_path / "b.jsonl", [Branch(parent, 3)], dataclasses.replace(LIMITS, max_turns=4))
    assert child.episode.truncated and child.episode.events[-1].detail == "max_turns"
    assert len(child.turn_spans) == 4 and child.episode.events[-1].turn == 4


def test_a_tool_that_answers_differently_on_replay_makes_the_branch_an_infra_error(env, cancel, tmp_path):
    (parent,) = rollout(env, [cancel], [script(cancel)], tmp_path / "a.jsonl")
    messages = list(parent.episode.messages)
    read_result = next(k for k, m in enumerate(messages) if m.role == "tool" and m.name == "read")
    messages[read_result] = dataclasses.replace(messages[read_result], content="a booking that is not there any more")
    changed = dataclasses.replace(parent, episode=dataclasses.replace(parent.episode, messages=messages))
    (child,) = rollout(env, [cancel], [script(cancel)[2:]], tmp_path / "b.jsonl", [Branch(changed, 2)])
    assert child.episode.infra_error is not None and "read gave another result" in child.episode.infra_error
    assert child.sampled_tokens == 0


@pytest.mark.parametrize("turns", [0, 4])
def test_a_branch_needs_a_turn_before_and_after_it(env, cancel, tmp_path, turns):
    (parent,) = rollout(env, [cancel], [script(cancel)], tmp_path / "a.jsonl")
    with pytest.raises(ValueError, match="1 to 3 turns"):
        Branch(parent, turns)


# ---- branched groups in an RL step (trainer/branching.py, rl.branch_groups) -----------------------


def test_pickers_and_choose_doctests() -> None:
    import doctest

    import toolpolicy.trainer.branching

    assert doctest.testmod(toolpolicy.trainer.branching).attempted >= 4
    assert doctest.testmod(toolpolicy.trainer.branching).failed == 0


def step_episode(answer: str, error_turn: int | None) -> tuple[Trajectory, object]:
    """A two-turn calc episode (call, then answer `answer`; the answer is 4), scored by correctness;
    with `error_turn`, that turn's call was malformed."""
    from toolpolicy.rewards import Rubric
    from toolpolicy.types import Episode, Event

    events = [Event("invalid_call", error_turn, "json")] if error_turn is not None else [Event("tool_call", 0, "calc")]
    episode = Episode(Task("a", "2+2?", "4"), [Message("user", "2+2?"), calls("calculator"), Message("tool", "4"), Message("assistant", f"Answer: {answer}")], events)
    ids = [1, 2, 3, 4, 5, 6, 10 + int(answer)]
    trajectory = Trajectory(ids, [0, 0, 1, 1, 0, 1, 1], [0.0, 0.0, -0.5, -0.5, 0.0, -1.0, -1.0], 2, episode, [(2, 4), (5, 7)])
    return trajectory, Rubric.from_weights({"correct_answer": 1.0}).score(episode)


class BranchPool:
    """Rollouts of the step's own groups as given, and of branches: the continuations answer
    from `answers` in turn, keeping their prefix's ids."""

    def __init__(self, own: list, answers: list[str]) -> None:
        self.own, self.answers, self.branches = own, answers, []

    @property
    def env(self) -> BranchPool:
        return self

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        return [Task("a", "2+2?", "4")] * n

    def submit(self, tasks, seeds, group_size, branches=None):
        if branches is None:
            return lambda: self.own
        self.branches.append((branches, seeds))
        return lambda: [step_episode(answer, None) for answer in self.answers[: len(tasks)]]


def test_a_failed_group_gets_a_fission_group_from_its_error_whose_advantages_are_its_own() -> None:
    """Group 0 (both right) and group 1 (both wrong, one after a malformed call) carry no signal;
    the malformed call's episode branches after its error: 2 continuations, one right, one
    wrong, a group of their own with GRPO advantages +-(1 - 0.5) / std([1, 0]) = +-0.7071."""
    from toolpolicy.build import load_config
    from toolpolicy.rewards import Rubric
    from toolpolicy.trainer.branching import PICKERS
    from toolpolicy.trainer.groups import Sampling, branch_groups, sample_groups
    from toolpolicy.trainer.update import algorithm_of

    _, credit, _ = algorithm_of(load_config(None).algorithm)  # GRPO
    rubric = Rubric.from_weights({"correct_answer": 1.0})
    own = [step_episode("4", None), step_episode("4", None), step_episode("5", 0), step_episode("5", None)]
    pool = BranchPool(own, ["4", "5"])
    sampling = Sampling(prompts=2, group_size=2, dynamic=True, refill_rounds=0, seed=0, episode_streams=True)
    sampled = sample_groups(pool, rubric, credit, sampling, 0)
    assert sampled.signal.tolist() == [False, False]
    out = branch_groups(pool, rubric, credit, sampling, 0, sampled, PICKERS["fission"], count=3)
    ((branches, seeds),) = pool.branches
    assert [(b.trajectory is own[2][0], b.turns) for b in branches] == [(True, 1), (True, 1)]  # after the error's turn
    assert len(set(seeds)) == 2  # each continuation its own stream
    assert out.signal.tolist() == [False, False, True] and out.groups.tolist() == [False, False, True]  # only signal trains
    assert out.branched.tolist() == [False] * 4 + [True] * 2 and out.replayed.tolist() == [False] * 6
    advantages = credit.advantages(out.trajectories, out.rewards, out.weights, 2, out.groups & out.signal)
    assert advantages[:4].tolist() == [0.0] * 4
    assert advantages[4:].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)


def test_no_error_no_fission_group() -> None:
    from toolpolicy.build import load_config
    from toolpolicy.rewards import Rubric
    from toolpolicy.trainer.branching import PICKERS
    from toolpolicy.trainer.groups import Sampling, branch_groups, sample_groups
    from toolpolicy.trainer.update import algorithm_of

    _, credit, _ = algorithm_of(load_config(None).algorithm)
    rubric = Rubric.from_weights({"correct_answer": 1.0})
    pool = BranchPool([step_episode("4", None), step_episode("5", None)], ["4", "5"])
    sampling = Sampling(prompts=1, group_size=2, dynamic=True, refill_rounds=0, seed=0)
    sampled = sample_groups(pool, rubric, credit, sampling, 0)
    assert branch_groups(pool, rubric, credit, sampling, 0, sampled, PICKERS["fission"], count=2) is sampled and not pool.branches


def test_branching_in_training_resumes_exactly(tmp_path) -> None:
    """calc from the shipped SFT model at a high temperature: every step branches (entropy: after
    every tool result there is a place; the pickers differ only in where, tested above); a run
    killed right after its step-2 checkpoint and resumed logs the same steps."""
    from toolpolicy.cli import main

    from conftest import SMOKE
    from test_resume import CALC_SFT, _kill_then_resume, _metrics

    settings = [f"rl.init_from={CALC_SFT}", "rl.steps=4", "run.checkpoint_every=2", "algorithm.branch=entropy",
                "rl.prompts_per_step=3", "rl.temperature=1.5", "run.threads=1"]  # fmt: skip
    command = ["train", str(SMOKE), *[a for s in settings for a in ("--set", s)]]
    assert main([*command, "--set", f"run.dir={tmp_path / 'straight'}"]) == 0
    straight = _metrics(tmp_path / "straight", "rl")
    assert all(r["branch/groups"] > 0 for r in straight), [r["branch/groups"] for r in straight]
    assert sum(r["branch/signal_groups"] for r in straight) > 0
    _kill_then_resume("rl-after-checkpoint", command, tmp_path / "killed")
    assert _metrics(tmp_path / "killed", "rl") == straight
