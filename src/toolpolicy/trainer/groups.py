"""One RL step's groups of episodes: which tasks a step draws (a pure function of its seed,
the data cursor), their rollout in groups of `rl.group_size`, scored by the Rubric into a
reward matrix, DAPO's refill while too few groups carry a signal, and the groups branched
from inside the step's own episodes (`algorithm.branch`, trainer/branching.py).

Every seed here is a function of (run seed, step, refill round, episode), so a resumed run
and a run in several processes draw and sample the same episodes.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from tqdm.auto import tqdm

from toolpolicy.algorithms import first_groups
from toolpolicy.chat import ChatTemplate
from toolpolicy.config import ConfigError
from toolpolicy.envs.base import Env
from toolpolicy.rewards import Rubric, Score
from toolpolicy.rollout import Trajectory
from toolpolicy.rollout.branch import Branch
from toolpolicy.rollout.dropped import dropped_line
from toolpolicy.rollout.engine import Encode, prompt_ids
from toolpolicy.trainer.branching import Picker, choose
from toolpolicy.trainer.credit import Credit, reward_matrix
from toolpolicy.trainer.replay import SuccessReplay
from toolpolicy.trainer.rollouts import Pending, Rollouts
from toolpolicy.types import Task

REFILL_SEED_STRIDE = 100_000_007  # refill rounds draw tasks far from every step's own seed


class EpisodesDropped(Exception):
    """RL whose step dropped more than MAX_DROPPED_SHARE of its episodes for infrastructure errors."""


MAX_DROPPED_SHARE = 0.5
"""A step may drop at most this share of its episodes (infra_error: a tool that raised
something other than ToolError, a failed service); beyond it the run stops, since the
update would learn from the few episodes the failure happened to spare."""


def train_seed(seed: int, step: int, refill: int = 0) -> int:
    """Seed of the training tasks of `step` (and of its refill round); evaluation uses its own split and seed."""
    return seed * 1_000_003 + step + refill * REFILL_SEED_STRIDE


def episode_seed(seed: int, step: int, refill: int, episode: int) -> int:
    """Seed of one episode's sampling stream (`sampling_streams: episode`): episode i of the
    step's refill round, counted over the whole step, whichever process runs it."""
    return (train_seed(seed, step, refill) * 1_000_003 + episode) % 2**63


@dataclass(frozen=True)
class Sampling:
    """How one step's episodes are drawn."""

    prompts: int
    """Groups the update uses (prompts_per_step)."""
    group_size: int
    dynamic: bool
    """Keep only groups that carry a signal, drawing more tasks while too few do."""
    refill_rounds: int
    seed: int
    episode_streams: bool = False
    """Each episode samples from its own stream (episode_seed), not the batch's generator."""
    fits: Callable[[Task], bool] | None = None
    """Whether a task's prompt is within max_prompt_tokens (None: every task is drawn)."""
    pool: tuple[Task, ...] = ()
    """The fixed set each step's tasks are drawn from (`task_pool`, rl.task_pool); empty: fresh ones."""


@dataclass(frozen=True)
class StepRollouts:
    """One step's episodes (groups contiguous), scored, and the groups the update keeps."""

    trajectories: list[Trajectory]
    scores: list[Score]
    rewards: Tensor
    """[B, C] every Rubric term's value, infra-failed episodes filled from their group."""
    weights: Tensor
    """[C] the terms' weights: rewards @ weights is each episode's Rubric total."""
    usable: Tensor
    """[B] bool: the episode had no infrastructure error."""
    signal: Tensor
    """[G] bool: groups whose advantages are not all zero for the credit."""
    groups: Tensor
    """[G] bool: groups kept for the update (with dynamic sampling, the first with a signal)."""
    refill_rounds: int
    replayed: Tensor
    """[B] bool: episodes a stored success stands in for (success replay); not sampled this step."""
    branched: Tensor
    """[B] bool: episodes of branched groups (algorithm.branch), sampled from inside another episode."""


def draw_tasks(env: Env, n: int, seed: int, fits: Callable[[Task], bool] | None) -> list[Task]:
    """`n` train tasks of `seed`: the environment's own draw, or with `fits` the first `n`
    that fit among draws of 4, 16 and 64 times as many (the same tasks on every process)."""
    if fits is None:
        return env.tasks("train", n, seed=seed)
    for factor in (4, 16, 64):
        kept = [task for task in env.tasks("train", n * factor, seed=seed) if fits(task)]
        if len(kept) >= n:
            return kept[:n]
    raise ConfigError(
        f"field 'max_prompt_tokens': only {len(kept)} of {n * 64} train tasks drawn have a prompt that short, {n} needed a step; raise it"
    )


def prompt_fits(env: Env, template: ChatTemplate, encode: Encode, most: int) -> Callable[[Task], bool]:
    """Whether a task's prompt (`prompt_ids`) is at most `most` tokens."""
    return lambda task: len(prompt_ids(env, template, encode, task)) <= most


def task_pool(env: Env, size: int, sampling: Sampling) -> tuple[Task, ...]:
    """The run's fixed set of `size` train tasks (rl.task_pool), drawn once from its seed."""
    return tuple(draw_tasks(env, size, train_seed(sampling.seed, -1, 0), sampling.fits))


def pooled_tasks(env: Env, sampling: Sampling, seed: int) -> list[Task]:
    """`sampling.prompts` tasks of round `seed`: drawn fresh, or sampled without replacement
    from `sampling.pool`."""
    if not sampling.pool:
        return draw_tasks(env, sampling.prompts, seed, sampling.fits)
    return random.Random(seed).sample(sampling.pool, min(sampling.prompts, len(sampling.pool)))


def submit_round(rollouts: Rollouts, sampling: Sampling, step: int, refill: int) -> Pending:
    """Start the episodes of one round of `step`: group_size per task, groups contiguous."""
    tasks = pooled_tasks(rollouts.env, sampling, train_seed(sampling.seed, step, refill))
    episodes = [task for task in tasks for _ in range(sampling.group_size)]
    seeds = [episode_seed(sampling.seed, step, refill, i) for i in range(len(episodes))] if sampling.episode_streams else None
    return rollouts.submit(episodes, seeds, sampling.group_size)


def sample_groups(
    rollouts: Rollouts,
    rubric: Rubric,
    credit: Credit,
    sampling: Sampling,
    step: int,
    first: Pending | None = None,
    replay: SuccessReplay | None = None,
) -> StepRollouts:
    """Roll out group_size episodes per task and score them. With dynamic sampling, draw
    more tasks while fewer than `sampling.prompts` groups carry a signal for the credit
    (DAPO's refill, at most `refill_rounds` rounds), then keep the first of those.
    `first`: the step's first round, already submitted (async RL). `replay`: each round's
    all-failed groups get a stored success of their task (trainer/replay.py)."""
    size = sampling.group_size
    trajectories: list[Trajectory] = []
    scores: list[Score] = []
    replayed: list[bool] = []
    for refill in range(sampling.refill_rounds + 1):
        pending = first if refill == 0 and first is not None else submit_round(rollouts, sampling, step, refill)
        scored = pending()
        scored, stand_ins = replay.fill(scored, size) if replay is not None else (scored, [False] * len(scored))
        trajectories += [t for t, _ in scored]
        scores += [score for _, score in scored]
        replayed += stand_ins
        usable, rewards, weights, signal = judged(rubric, credit, trajectories, scores, size)
        if not sampling.dynamic or int(signal.sum()) >= sampling.prompts:
            break
    groups = first_groups(signal, sampling.prompts) if sampling.dynamic else torch.ones_like(signal)  # [G]
    return StepRollouts(
        trajectories, scores, rewards, weights, usable, signal, groups, refill, torch.tensor(replayed, dtype=torch.bool),
        torch.zeros(len(trajectories), dtype=torch.bool),
    )


def judged(
    rubric: Rubric, credit: Credit, trajectories: list[Trajectory], scores: list[Score], size: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The episodes free of infrastructure errors [B], the reward matrix [B, C] (infra-failed
    episodes filled from their group) with its weights [C], and the groups with a signal [G]."""
    usable = torch.tensor([t.episode.infra_error is None for t in trajectories])  # [B]
    rewards, weights = reward_matrix(rubric, scores, usable, size)  # [B, C], [C]
    return usable, rewards, weights, credit.signal(trajectories, rewards, weights, size)


BRANCH_ROUND = 1_000
"""The refill index of a step's branched episodes' seeds: beyond any refill round."""


def branch_groups(
    rollouts: Rollouts, rubric: Rubric, credit: Credit, sampling: Sampling, step: int, sampled: StepRollouts, pick: Picker,
    count: int,
) -> StepRollouts:
    """`sampled` with up to `count` branched groups after its own (trainer/branching.py): `pick`
    scores the places where its freshly sampled, usable episodes may branch, the best `count`
    each get group_size continuations, kept (with dynamic sampling) if they carry a signal."""
    size = sampling.group_size
    eligible = (sampled.usable & ~sampled.replayed).tolist()  # [B]
    rng = random.Random(train_seed(sampling.seed, step, BRANCH_ROUND))
    points = choose(pick(sampled.trajectories, eligible), count, rng)
    if not points:
        return sampled
    branches = [Branch(sampled.trajectories[i], turns) for i, turns in points for _ in range(size)]
    tasks = [b.trajectory.episode.task for b in branches]
    seeds = [episode_seed(sampling.seed, step, BRANCH_ROUND, j) for j in range(len(tasks))] if sampling.episode_streams else None
    scored = rollouts.submit(tasks, seeds, size, branches)()
    trajectories = sampled.trajectories + [t for t, _ in scored]
    scores = sampled.scores + [score for _, score in scored]
    usable, rewards, weights, signal = judged(rubric, credit, trajectories, scores, size)
    own = signal[len(sampled.signal) :]  # [points]
    groups = torch.cat([sampled.groups, own if sampling.dynamic else torch.ones_like(own)])  # [G]
    added = torch.ones(len(scored), dtype=torch.bool)
    return replace(
        sampled, trajectories=trajectories, scores=scores, rewards=rewards, weights=weights, usable=usable, signal=signal,
        groups=groups, replayed=torch.cat([sampled.replayed, ~added]), branched=torch.cat([sampled.branched, added]),
    )


def check_dropped(trajectories: list[Trajectory], step: int, say: bool) -> None:
    """Say how many of the step's episodes were dropped and why (when `say`); raise
    EpisodesDropped when more than MAX_DROPPED_SHARE of them were."""
    episodes = [t.episode for t in trajectories]
    line = dropped_line(episodes)
    if line is None:
        return
    if say:
        tqdm.write(f"warning: rl step {step + 1}: {line}", file=sys.stderr)
    if sum(e.infra_error is not None for e in episodes) > MAX_DROPPED_SHARE * len(episodes):
        raise EpisodesDropped(
            f"rl step {step + 1} {line}. More than half of a step's episodes dropped leaves too little to learn from: "
            "fix the tool or service (a tool turns a bad argument into toolpolicy.tools.ToolError, which the model sees)"
        )
