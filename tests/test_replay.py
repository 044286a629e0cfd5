"""Success replay (trainer/replay.py): an all-failed group gets its task's stored success, the
group then carries a signal, metrics count only sampled episodes, and the store survives a
checkpoint."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from toolpolicy.build import load_config
from toolpolicy.rewards import Rubric, Score
from toolpolicy.rollout import Trajectory
from toolpolicy.trainer.replay import SuccessReplay
from toolpolicy.trainer.groups import Sampling, sample_groups
from toolpolicy.trainer.update import algorithm_of
from toolpolicy.types import Episode, Event, Message, Task

RUBRIC = Rubric.from_weights({"correct_answer": 1.0})


def episode(task: str, answer: str) -> tuple[Trajectory, Score]:
    """An episode of `task` (whose answer is "4") that answers `answer`, scored by RUBRIC."""
    done = Episode(
        Task(task, "2+2?", "4", {"difficulty": "easy"}),
        [Message("user", "2+2?"), Message("assistant", f"Answer: {answer}")],
        [Event("tool_call", 0, "calc")],
    )
    ids = [1, 2, 3, 10 + int(answer)]
    return Trajectory(ids, [0, 0, 1, 1], [0.0, 0.0, -0.5, -0.25 * int(answer)], 2, done, [(2, 4)]), RUBRIC.score(done)


def solved(e: Episode) -> bool:
    return RUBRIC.score(e).total == 1.0


def test_an_all_failed_group_gets_its_tasks_last_success() -> None:
    replay = SuccessReplay(solved)
    first = [episode("a", "4"), episode("a", "5"), episode("b", "5"), episode("b", "6")]
    kept, replaced = replay.fill(first, group_size=2)
    assert kept == first and replaced == [False] * 4 and set(replay.stored) == {"a"}  # a solved once: stored
    second = [episode("a", "5"), episode("a", "6"), episode("b", "5"), episode("b", "4"), episode("c", "1"), episode("c", "2")]
    kept, replaced = replay.fill(second, group_size=2)
    assert replaced == [False, True, False, False, False, False]  # a failed twice: its last member stands in
    assert kept[1] == first[0] and kept[0] == second[0] and kept[2:] == second[2:]  # b solved itself; c never was
    assert set(replay.stored) == {"a", "b"} and replay.stored["b"] == second[3]


def test_the_stored_success_is_the_latest_and_a_machine_failure_is_not_one() -> None:
    replay = SuccessReplay(solved)
    older, newer = episode("a", "4"), episode("a", "4")
    newer[0].token_ids[0] = 99
    cut = episode("a", "4")
    cut[0].episode.infra_error = "the tool server died"
    replay.fill([older, episode("a", "5")], 2)
    replay.fill([newer, cut], 2)
    assert replay.stored["a"] == newer


def test_the_store_survives_a_checkpoint_as_plain_values() -> None:
    replay = SuccessReplay(solved)
    replay.fill([episode("a", "4"), episode("b", "4")], 1)
    buffer = io.BytesIO()
    torch.save({"replay": replay.state()}, buffer)
    buffer.seek(0)
    back = SuccessReplay(solved)
    back.restore(torch.load(buffer, weights_only=True)["replay"])  # what the trainer's checkpoint loader allows
    for task in ("a", "b"):
        (t1, s1), (t2, s2) = replay.stored[task], back.stored[task]
        assert (t1.token_ids, t1.loss_mask, t1.logprobs, t1.prompt_len, t1.turn_spans) == (t2.token_ids, t2.loss_mask, t2.logprobs, t2.prompt_len, t2.turn_spans)
        assert t1.episode.to_dict() == t2.episode.to_dict() and s1 == s2


@dataclass
class ScriptedPool:
    """Rollouts whose episodes answer as `answers` says for each task, round after round."""

    answers: Callable[[str, int], str]
    rounds: int = 0

    @property
    def env(self) -> ScriptedPool:
        return self

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        return [Task("a", "2+2?", "4"), Task("b", "2+2?", "4")][:n]

    def submit(self, tasks: list[Task], seeds: object, group_size: int) -> Callable[[], list[tuple[Trajectory, Score]]]:
        self.rounds += 1
        scored = [episode(task.id, self.answers(task.id, self.rounds)) for task in tasks]
        return lambda: scored


def test_a_replayed_group_carries_a_signal_and_trains() -> None:
    """Step 1: a solved once, b never. Step 2: both groups fail. Without replay neither carries
    a signal (dynamic sampling drops both); with it, a does, with a's stored success in it."""
    answers = {1: {"a": "4", "b": "5"}, 2: {"a": "5", "b": "5"}}
    _, credit, _ = algorithm_of(load_config(None).algorithm)  # GRPO
    sampling = Sampling(prompts=2, group_size=2, dynamic=True, refill_rounds=0, seed=0)
    results = {}
    for name, replay in (("off", None), ("on", SuccessReplay(solved))):
        pool = ScriptedPool(lambda task, round_: answers[round_][task])
        sample_groups(pool, RUBRIC, credit, sampling, 0, replay=replay)
        results[name] = sample_groups(pool, RUBRIC, credit, sampling, 1, replay=replay)
    assert results["off"].signal.tolist() == [False, False] and results["off"].replayed.tolist() == [False] * 4
    on = results["on"]
    assert on.signal.tolist() == [True, False] and on.replayed.tolist() == [False, True, False, False]
    assert on.rewards[:, 0].tolist() == [0.0, 1.0, 0.0, 0.0]
    advantages = credit.advantages(on.trajectories, on.rewards, on.weights, 2, on.groups & on.signal)
    assert advantages[0] < 0 < advantages[1] and advantages[2:].tolist() == [0.0, 0.0]


def test_a_task_pool_brings_tasks_back() -> None:
    from toolpolicy.build import build_env
    from toolpolicy.trainer.groups import pooled_tasks, task_pool

    env = build_env(load_config(None, ["env=calc"]).env)
    fresh = Sampling(prompts=4, group_size=2, dynamic=False, refill_rounds=0, seed=3)
    pooled = replace(fresh, pool=task_pool(env, 6, fresh))
    steps = [[t.id for t in pooled_tasks(env, pooled, seed)] for seed in range(10)]
    assert all(len(set(ids)) == 4 for ids in steps) and len({i for ids in steps for i in ids}) == 6
    assert len({t.id for seed in range(10) for t in pooled_tasks(env, fresh, seed)}) == 40


def test_replay_in_training_resumes_exactly(tmp_path) -> None:
    """calc from the shipped SFT model on a pool of 3 tasks: some groups fail after their task
    was solved and get the stored success; a run killed right after its step-2 checkpoint and
    resumed logs the same steps as one that was not (the store comes back from the checkpoint)."""
    from pathlib import Path

    from toolpolicy.cli import main

    from conftest import SMOKE
    from test_resume import CALC_SFT, _kill_then_resume, _metrics

    # One thread in this process and in the killed one, whatever earlier tests set: the same sums.
    settings = [f"rl.init_from={CALC_SFT}", "rl.steps=6", "run.checkpoint_every=2", "algorithm.replay=true",
                "rl.task_pool=3", "rl.prompts_per_step=3", "algorithm.dynamic_sampling=false", "rl.temperature=1.5",
                "run.threads=1"]  # fmt: skip
    command = ["train", str(SMOKE), *[a for s in settings for a in ("--set", s)]]
    assert main([*command, "--set", f"run.dir={tmp_path / 'straight'}"]) == 0
    straight = _metrics(tmp_path / "straight", "rl")
    assert sum(r["replayed_episodes"] for r in straight) > 0, [r["replayed_episodes"] for r in straight]
    _kill_then_resume("rl-after-checkpoint", command, tmp_path / "killed")
    assert _metrics(tmp_path / "killed", "rl") == straight
    assert Path(tmp_path / "killed" / "rl" / "checkpoints").exists()
