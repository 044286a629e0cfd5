"""RL on a tool environment with the GRPO family, in one loop you can read top to bottom.

Each step: sample `rl.prompts_per_step` tasks (a pure function of the step: the data
cursor), roll out `rl.group_size` episodes per task with the multi-turn engine, score
them with the environment's Rubric into a reward matrix [B, C], turn it into
advantages, keep the groups that carry a signal for the estimator (DAPO dynamic
sampling, refilled up to algorithm.max_refill_rounds) and the episodes the filters keep,
and take policy-gradient steps on the sampled tokens: `algorithm.update_passes` passes
over them, each cut into `algorithm.mini_batches` optimizer steps on runs of whole groups
(one step by default; `train_on_batch`). With `algorithm.branch`, up to
`algorithm.branch_groups` more groups continue the step's episodes from inside them (after an
error, or where the policy is most uncertain after a tool result; `branch_groups`,
trainer/branching.py). A run in which no group carries a signal for
`rl.max_idle_steps` steps in a row has nothing to learn from and stops (TrainingStalled).

The objective (estimator, ratio level, KL estimator, aggregation), the credit
(outcome or turn) and the filters are chosen once, before the loop, from the
config's `algorithm` section (a preset, or each field; see toolpolicy.algorithms). The old
policy is the rollout policy: its log-probabilities are the rollout's own, recorded at
sampling time (with TIS, the trainer's under the sampling weights, taken before the
first step when there are several). With one optimizer step per batch the ratio is 1
on every token and clipping never acts; every later step of the batch trains a policy
that has moved. No value model.
Token ids stay exactly as sampled and tool output is masked out of the loss.

    toolpolicy train CONFIG [--set section.field=value ...]
    toolpolicy train --resume RUN_DIR     # from its last checkpoint, with RUN_DIR/config.yaml
"""

from __future__ import annotations

import copy
import itertools
import random
import sys
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from toolpolicy.algorithms import Algorithm, first_groups
from toolpolicy.algorithms.correction import Correction, mismatch_sums
from toolpolicy.algorithms.distill import DIVERGENCES
from toolpolicy.build import build_rubric, load_policy_model, planned_optimizer_steps, trainable_policy
from toolpolicy.chat import ChatTemplate
from toolpolicy.checks import check_processes, require_init_from
from toolpolicy.config import AlgorithmSection, Config, ConfigError
from toolpolicy.envs.base import Env
from toolpolicy.model.adapters import reference_mode
from toolpolicy.model.placement import device_of, memory_metrics, resolve_device
from toolpolicy.model.vision import VisionInput
from toolpolicy.rewards import RewardFunction, Rubric, Score, policy_violation, reward_function, term_means
from toolpolicy.rollout import Trajectory
from toolpolicy.rollout.branch import Branch
from toolpolicy.rollout.backends import CAPABILITIES, Capabilities
from toolpolicy.rollout.dropped import dropped_line, dropped_metrics
from toolpolicy.rollout.engine import Encode, prompt_ids
from toolpolicy.rollout.store import EpisodeRecord, drop_steps_after, step_table, write_step
from toolpolicy.trainer.batch import (
    FULL_SEQUENCES,
    SHARED_PROMPTS,
    Lockstep,
    Recompute,
    TokenBatch,
    collate,
    micro_batches,
    own_count,
    padding_passes,
    update_order,
)
from toolpolicy.trainer.checkpoint import MetricsLog, Restored, restore_state, resume_from, save_checkpoint, save_final
from toolpolicy.trainer.credit import (
    Credit,
    EpisodeFilter,
    OutcomeCredit,
    TurnCredit,
    no_void_turn,
    not_truncated,
    reward_matrix,
    update_mask,
)
from toolpolicy.trainer.distributed import Replicated, Sharded, World, clip_gradients, sharing_of
from toolpolicy.trainer.branching import PICKERS, Picker, choose
from toolpolicy.trainer.replay import SuccessReplay
from toolpolicy.trainer.rollouts import LocalRollouts, Pending, RayRollouts, Rollouts, open_engine, save_start, saved_start
from toolpolicy.trainer.schedule import rl_schedule
from toolpolicy.trainer.teacher import Distill, DistilledCredit, FullTeacher, Teacher, same_vocabulary
from toolpolicy.trainer.trackers import open_trackers
from toolpolicy.types import Task

REFILL_SEED_STRIDE = 100_000_007  # refill rounds draw tasks far from every step's own seed


class TrainingStalled(Exception):
    """RL that has had nothing to learn from for max_idle_steps steps in a row."""


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


UPDATE_SUMS = (
    "loss", "entropy", "clip_frac", "ratio", "kl", "mismatch/abs", "mismatch/kl", "mismatch/truncated", "mismatch/tokens",
    "tokens/update", "tokens/reference", "trained_tokens", "distill/kl", "tokens/teacher",
)
UPDATE_MAXIMA = ("ratio_max", "mismatch/abs_max")


class Update(NamedTuple):
    """What `policy_update` gives back: detached sums and maxima, and the trainer's
    recomputed log-prob of every sampled token, one 1-D tensor per batch row."""

    sums: dict[str, float]
    logprobs: list[Tensor]


class Totals(NamedTuple):
    """What the loss is normalised by: the whole step's trained tokens and sequences (all ranks')."""

    tokens: float
    sequences: float


def policy_update(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    batch: TokenBatch | None,
    advantages: Tensor,
    algorithm: Algorithm,
    correction: Correction,
    recompute: Recompute,
    temperature: float,
    micro_batch_size: int,
    totals: Totals | None = None,
    micro_batch_tokens: int | None = None,
    before: Tensor | None = None,
    measure_mismatch: bool = True,
    lockstep: Lockstep = own_count,
    pad_id: int = 0,
    distill: Distill | None = None,
) -> Update:
    """Accumulate the objective's gradient over micro-batches. Returns detached sums (UPDATE_SUMS,
    each token sum not yet divided) and maxima (UPDATE_MAXIMA), which `update_metrics` finishes,
    and the recomputed log-probs of the sampled tokens (for the rollout store).

    advantages: [B] per episode, or [B, L-1] per token (turn credit), cut to each piece's width.
    totals: the whole step's, when `batch` is this rank's share of it (default: the batch's own).
    Micro-batches hold at most micro_batch_size rows and micro_batch_tokens positions.
    batch None: this rank has no episode to train this step (zero sums, no gradient).
    Log-probabilities are recomputed as `recompute` says (each distinct prompt once, unless
    gradient checkpointing is on) at the rollout's sampling `temperature`; their gap to
    the sampler's is measured (`mismatch/*`, unless `measure_mismatch` is off) and, with
    TIS, corrected. `before` [B, L-1]: the trainer's log-probs under the weights that
    sampled, when earlier optimizer steps on this batch have moved the model since (TIS
    takes pi_old from them); None: the ones computed here are those.
    lockstep: the forward and backward passes to run in all, from the number of micro-batches:
    under sharding as many as the rank with the most, the extra ones `padding_passes` of `pad_id`.
    distill: the policy's forward also gives the divergence to a teacher at each trained
    position, and the loss gains distill.coef x its sum over the step's trained tokens
    (algorithm.teacher_loss full or forward; the sums gain `distill/kl` and `tokens/teacher`)."""
    sums = dict.fromkeys(UPDATE_SUMS + UPDATE_MAXIMA, 0.0)
    recomputed: list[Tensor] = []
    pieces = micro_batches(batch, micro_batch_size, micro_batch_tokens) if batch is not None else []
    device = device_of(model)
    padding_passes(model, reference, len(pieces), lockstep, pad_id, recompute, temperature)
    if batch is None:
        return Update(sums, recomputed)
    total_tokens, total_sequences = totals or Totals(float(batch.loss_mask.sum()), float(batch.input_ids.shape[0]))
    for rows, piece in pieces:
        piece = piece.to(device)
        if distill is None:
            logprobs, entropy = recompute.logprobs(model, piece, temperature, with_entropy=True)  # [b, l]
        else:
            logprobs, entropy, teacher_kl = distill.logprobs(model, piece, temperature, with_entropy=True)  # [b, l] each
        piece_advantages = advantages[rows] if advantages.dim() == 1 else advantages[rows, : logprobs.shape[1]]
        piece_advantages = piece_advantages.to(device)
        ref_logprobs = None
        if reference is not None:
            with torch.no_grad(), reference_mode(reference):
                ref_logprobs, _ = recompute.logprobs(reference, piece, temperature)  # [b, l]
        sampler_trainer = logprobs if before is None else before[rows, : logprobs.shape[1]].to(device)  # [b, l]
        old_logprobs, weights = correction.old_policy(sampler_trainer, piece.old_logprobs)  # [b, l], [b, l] or None
        loss, stats = algorithm.objective(
            logprobs, old_logprobs, piece_advantages, piece.loss_mask, ref_logprobs, total_tokens, total_sequences, weights
        )
        if distill is not None:
            kl_sum = (teacher_kl * piece.loss_mask).sum()
            loss = loss + distill.coef * kl_sum / total_tokens
            sums["distill/kl"] += float(kl_sum.detach())
            sums["tokens/teacher"] += float(piece.attention.sum())  # its forward runs on every position
        loss.backward()
        recomputed += [row[mask.bool()].float().cpu() for row, mask in zip(logprobs.detach(), piece.loss_mask)]
        weight = float(piece.loss_mask.sum())
        sums["loss"] += float(loss.detach())
        sums["entropy"] += float((entropy * piece.loss_mask).sum())
        sums["clip_frac"] += stats["clip_fraction"] * weight
        sums["ratio"] += stats["ratio_mean"] * weight
        sums["kl"] += stats.get("kl_sum", 0.0)
        sums["trained_tokens"] += weight
        if measure_mismatch:
            mismatch = mismatch_sums(sampler_trainer, piece.old_logprobs, piece.loss_mask, correction.cap)
            for key in ("abs", "kl", "truncated"):
                sums[f"mismatch/{key}"] += mismatch[key]
            sums["mismatch/tokens"] += weight
            sums["mismatch/abs_max"] = max(sums["mismatch/abs_max"], mismatch["abs_max"])
        tokens = recompute.tokens(piece)
        sums["tokens/update"] += tokens  # forward and backward of the policy
        sums["tokens/reference"] += tokens if reference is not None else 0
        sums["ratio_max"] = max(sums["ratio_max"], stats["ratio_max"])
    return Update(sums, recomputed)


def optimizer_runs(order: list[int], group_size: int, mini_batches: int, passes: int) -> list[list[int]]:
    """The episodes of each optimizer step on one rollout batch: `passes` times over the kept
    episodes `order` (listed group by group), each pass cut into `mini_batches` runs of whole
    groups, as equal in groups as they can be (fewer runs when fewer groups were kept), in
    the same order every pass.

    >>> optimizer_runs([0, 1, 2, 3, 6, 7], group_size=2, mini_batches=2, passes=2)
    [[0, 1, 2, 3], [6, 7], [0, 1, 2, 3], [6, 7]]
    >>> optimizer_runs([4, 5], group_size=2, mini_batches=4, passes=1)
    [[4, 5]]
    """
    groups = [list(members) for _, members in itertools.groupby(order, key=lambda i: i // group_size)]
    count = min(mini_batches, len(groups))
    if not count:
        return []
    bounds = [round(k * len(groups) / count) for k in range(count + 1)]
    return [[i for group in groups[a:b] for i in group] for a, b in zip(bounds, bounds[1:])] * passes


class Before(NamedTuple):
    """The trainer's log-probs of a batch's kept episodes under the weights that sampled them,
    taken before the first of several optimizer steps moves them (what TIS needs as pi_old),
    and their mismatch to the sampler's (`mismatch_sums` summed, with `mismatch/tokens`)."""

    logprobs: dict[int, Tensor]
    """episode -> [len(token_ids) - 1], the batch layout's row (0 where nothing was sampled)."""
    mismatch: dict[str, float]


def trainer_before(learner: Learner, trajectories: list[Trajectory], episodes: list[int], steps: int) -> Before | None:
    """`Before` of `episodes` (this rank's share of the kept ones), when the update takes more than
    one optimizer step and the correction takes pi_old from the trainer; else None (pi_old is
    the sampler's own, or the first forward of the only step is it)."""
    if steps <= 1 or not learner.correction.uses_trainer or not learner.world.most(len(episodes)):
        return None
    s = learner.settings
    logprobs: dict[int, Tensor] = {}
    mismatch = dict.fromkeys(("mismatch/abs", "mismatch/kl", "mismatch/truncated", "mismatch/tokens", "mismatch/abs_max"), 0.0)
    batch = collate([trajectories[i] for i in episodes], learner.pad_id, learner.vision) if episodes else None
    pieces = micro_batches(batch, s.micro_batch_size, s.micro_batch_tokens) if batch is not None else []
    device = device_of(learner.model)
    learner.model.eval()
    with torch.no_grad():
        lockstep = learner.sharing.lockstep(learner.world)
        padding_passes(learner.model, None, len(pieces), lockstep, learner.pad_id, learner.recompute, s.temperature, backward=False)
        for rows, piece in pieces:
            piece = piece.to(device)
            values, _ = learner.recompute.logprobs(learner.model, piece, s.temperature)  # [b, l]
            found = mismatch_sums(values, piece.old_logprobs, piece.loss_mask, learner.correction.cap)
            for key in ("abs", "kl", "truncated"):
                mismatch[f"mismatch/{key}"] += found[key]
            mismatch["mismatch/tokens"] += float(piece.loss_mask.sum())
            mismatch["mismatch/abs_max"] = max(mismatch["mismatch/abs_max"], found["abs_max"])
            for episode, row in zip(episodes[rows], values.cpu()):
                logprobs[episode] = row
    return Before(logprobs, mismatch)


def rows_of(before: Before, episodes: list[int]) -> Tensor:
    """`before`'s log-probs of `episodes` in the layout `collate` gives them.   [b, L-1]"""
    width = max(len(before.logprobs[i]) for i in episodes)
    out = torch.zeros(len(episodes), width)
    for row, i in enumerate(episodes):
        values = before.logprobs[i][:width]
        out[row, : len(values)] = values
    return out


def add_sums(sums: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """`policy_update` sums added up over optimizer steps (maxima: the larger)."""
    return {key: max(value, more.get(key, value)) if key in UPDATE_MAXIMA else value + more.get(key, 0.0) for key, value in sums.items()}


@dataclass(frozen=True)
class UpdateSettings:
    """The config's fields the update on one rollout batch reads."""

    group_size: int
    mini_batches: int
    passes: int
    micro_batch_size: int
    micro_batch_tokens: int | None
    temperature: float
    grad_clip: float

    @staticmethod
    def of(cfg: Config) -> UpdateSettings:
        return UpdateSettings(
            cfg.rl.group_size, cfg.algorithm.mini_batches, cfg.algorithm.update_passes, cfg.optim.micro_batch_size,
            cfg.optim.micro_batch_tokens, cfg.rl.temperature, cfg.optim.grad_clip,
        )


@dataclass(frozen=True)
class Learner:
    """What the update on a rollout batch steps, and how it computes the loss."""

    model: torch.nn.Module
    reference: torch.nn.Module | None
    trainable: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    algorithm: Algorithm
    correction: Correction
    recompute: Recompute
    world: World
    pad_id: int
    settings: UpdateSettings
    sharing: Replicated | Sharded = Replicated()
    """How the ranks hold `model` (and a sharded `reference`); its `recompute` runs through it."""
    vision: VisionInput | None = None
    """How the model reads the episodes' pictures (a vision-language policy's)."""
    distill: Distill | None = None
    """algorithm.teacher_loss full or forward: the divergence to the teacher, in every micro-batch's loss."""


class BatchUpdate(NamedTuple):
    """What `train_on_batch` did: this rank's `policy_update` sums over every optimizer step,
    the trainer's log-probs of each episode it trained (from the first pass), and the
    gradient norm of each optimizer step (before clipping)."""

    sums: dict[str, float]
    recomputed: dict[int, list[float]]
    grad_norms: list[float]


def train_on_batch(learner: Learner, trajectories: list[Trajectory], order: list[int], advantages: Tensor) -> BatchUpdate:
    """The optimizer steps on one rollout batch's kept episodes `order` (group by group; `optimizer_runs`).

    Each step's loss is normalised by the whole batch's trained tokens and sequences divided
    by the steps of a pass, so the steps of a pass sum to that many times the batch's loss
    and each step's gradient estimates the whole batch's (TRL normalises the same way when
    steps_per_generation exceeds gradient_accumulation_steps)."""
    s = learner.settings
    world = learner.world
    runs = optimizer_runs(order, s.group_size, s.mini_batches, s.passes)
    per_pass = len(runs) // s.passes
    totals = Totals(sum(trajectories[i].sampled_tokens for i in order) / per_pass, len(order) / per_pass)
    first_pass = [i for run in runs[:per_pass] for i in rank_share(run, s.group_size, world)]
    before = trainer_before(learner, trajectories, first_pass, len(runs))
    sums = dict.fromkeys(UPDATE_SUMS + UPDATE_MAXIMA, 0.0)
    if before is not None:
        sums = add_sums(sums, before.mismatch)
    recomputed: dict[int, list[float]] = {}
    grad_norms = []
    learner.model.train()
    for number, run in enumerate(runs):
        learner.optimizer.zero_grad(set_to_none=True)
        mine = update_order(rank_share(run, s.group_size, world), trajectories, s.micro_batch_size)
        part, logprobs = policy_update(
            learner.model, learner.reference, collate([trajectories[i] for i in mine], learner.pad_id, learner.vision) if mine else None,
            advantages[mine], learner.algorithm, learner.correction, learner.recompute, s.temperature, s.micro_batch_size,
            totals, s.micro_batch_tokens, None if before is None or not mine else rows_of(before, mine),
            measure_mismatch=before is None and number == 0,  # the weights that sampled, still
            lockstep=learner.sharing.lockstep(world), pad_id=learner.pad_id, distill=learner.distill,
        )
        sums = add_sums(sums, part)
        if number < per_pass:  # the first pass sees every episode once
            recomputed.update(zip(mine, (lp.tolist() for lp in logprobs)))
        learner.sharing.reduce_gradients(learner.trainable, world)
        grad_norms.append(clip_gradients(learner.trainable, s.grad_clip))
        learner.optimizer.step()
        learner.scheduler.step()  # the LR schedule counts optimizer steps
    return BatchUpdate(sums, recomputed, grad_norms)


def update_metrics(sums: dict[str, float], optimizer_steps: int, with_reference: bool, distill: Distill | None = None) -> dict[str, float]:
    """The step's update metrics from `policy_update`'s sums over its `optimizer_steps`: the
    loss per optimizer step, token counts as they are, maxima, and per-token means over
    every token trained (kl only when a reference model ran; with a teacher in the loss its
    exact divergence under `distill.metric`) or, for the sampler/trainer mismatch, over the
    tokens it was measured on."""
    out = {key: sums[key] for key in ("tokens/update", "tokens/reference") + UPDATE_MAXIMA}
    out["loss"] = sums["loss"] / max(optimizer_steps, 1)
    for key in ("entropy", "clip_frac", "ratio") + (("kl",) if with_reference else ()):
        out[key] = sums[key] / max(sums["trained_tokens"], 1.0)
    if distill is not None:
        out[distill.metric] = sums["distill/kl"] / max(sums["trained_tokens"], 1.0)
        out["tokens/teacher"] = sums["tokens/teacher"]
    for key in ("mismatch/abs", "mismatch/kl", "mismatch/truncated"):
        out[key] = sums[key] / max(sums["mismatch/tokens"], 1.0)
    return out


def rollout_metrics(trajectories: list[Trajectory], scores: list[Score], success: RewardFunction) -> dict[str, float]:
    """Per-step means of reward (and of each Rubric term, as rewards/<name>), accuracy (the share with `success` 1, as in evaluation),
    tool use and policy violations, overall and per difficulty. Episodes with an
    infrastructure error are left out of every mean and only counted (docs/architecture.md, contract 4),
    in all and per failed tool (infra_errors/<tool>)."""
    counted = [(t, s) for t, s in zip(trajectories, scores) if t.episode.infra_error is None]
    out: dict[str, float] = {"infra_errors": len(trajectories) - len(counted), **dropped_metrics([t.episode for t in trajectories])}
    if not counted:
        return out
    n = len(counted)
    episodes = [t.episode for t, _ in counted]
    solved = [success(e) == 1.0 for e in episodes]
    calls = sum(e.count("tool_call") for e in episodes)
    invalid = sum(e.count("invalid_call") for e in episodes)
    out["reward"] = sum(s.total for _, s in counted) / n
    out.update({f"rewards/{name}": mean for name, mean in term_means([s for _, s in counted]).items()})
    out["accuracy"] = sum(solved) / n
    out["tool_calls"] = calls / n
    out["invalid_call_rate"] = invalid / max(1, calls + invalid)
    out["truncated_rate"] = sum(e.truncated for e in episodes) / n
    out["response_tokens"] = sum(e.response_tokens for e in episodes) / n
    out["denials"] = sum(e.count("gate_deny") for e in episodes) / n
    out["violations"] = sum(policy_violation(e) for e in episodes) / n
    by_rule: Counter[str] = Counter()
    by_difficulty: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(episodes):
        by_rule.update(e.denials_by_rule())
        by_difficulty[e.task.difficulty].append(i)
    for rule, count in sorted(by_rule.items()):
        out[f"denials/{rule}"] = count / n
    for difficulty, rows in sorted(by_difficulty.items()):
        out[f"accuracy/{difficulty}"] = sum(solved[i] for i in rows) / len(rows)
        out[f"tool_calls/{difficulty}"] = sum(episodes[i].count("tool_call") for i in rows) / len(rows)
    return out


def correction_of(algorithm: AlgorithmSection, backend: Capabilities) -> Correction:
    """algorithm.correction, with auto resolved by what the backend declares: none when its
    log-probs are the trainer's own numbers, else TIS."""
    name = algorithm.correction if algorithm.correction != "auto" else ("none" if backend.exact_logprobs else "tis")
    return Correction.named(name, algorithm.tis_cap)


def algorithm_of(section: AlgorithmSection) -> tuple[Algorithm, Credit, tuple[EpisodeFilter, ...]]:
    """The objective, the credit and the episode filters the algorithm section names, chosen once."""
    assert section.loss_norm_length is not None, "checks.checked writes loss_norm_length"
    algorithm = Algorithm.named(
        section.advantage, section.ratio_level, section.kl_estimator, section.aggregation, clip_low=section.clip_low,
        clip_high=section.clip_high, dual_clip=section.dual_clip, beta=section.beta, norm_length=section.loss_norm_length,
    )
    credit = TurnCredit(section.turn_rewards, section.turn_gamma) if section.credit == "turn" else OutcomeCredit(algorithm.estimator)
    filters = tuple(keep for keep, on in ((not_truncated, section.mask_truncated), (no_void_turn, section.void_turn_filter)) if on)
    return algorithm, credit, filters


def train_rl(cfg: Config, run_dir: Path, resume: bool = False) -> Path:
    """Run RL from `rl.init_from` and return the folder of the final model (RUN_DIR/rl/final)."""
    rl = require_init_from(cfg).rl
    algorithm, credit, filters = algorithm_of(cfg.algorithm)
    check_processes(cfg, World.requested())
    correction = correction_of(cfg.algorithm, CAPABILITIES[cfg.backend.name])
    # Each distinct prompt once, unless gradient checkpointing (no KV cache to share then) or a
    # teacher in the loss (its KL comes with a forward over whole sequences) says otherwise.
    teacher_in_loss = bool(cfg.algorithm.teacher) and cfg.algorithm.teacher_loss in DIVERGENCES
    full = cfg.model.gradient_checkpointing or teacher_in_loss
    recompute = FULL_SEQUENCES if full else SHARED_PROMPTS
    sampling = Sampling(
        rl.prompts_per_step, rl.group_size, cfg.algorithm.dynamic_sampling, cfg.algorithm.max_refill_rounds, cfg.run.seed,
        episode_streams=rl.sampling_streams == "episode",
    )
    phase_dir = run_dir / "rl"
    checkpoint = resume_from(phase_dir) if resume else None
    world = World.from_environment(resolve_device(cfg.model.device))
    policy = trainable_policy(cfg.model, checkpoint or rl.init_from, phase_dir, checkpoint is not None, cfg.run.seed, world.main, world.barrier)
    model = policy.model
    sharing = sharing_of(cfg.model, world)
    whole = sharing.place(model, world)  # the weights that sample and are saved: `model`, or its shards gathered
    reference = None
    if cfg.algorithm.beta > 0 or cfg.algorithm.log_kl:  # LoRA: the model itself with its adapter off; else a second copy of init_from
        reference = model if cfg.model.lora_rank else load_policy_model(cfg.model, rl.init_from).model.eval()
        if reference is not model:
            sharing.place_frozen(reference, world)
    teacher, distill = None, None
    if cfg.algorithm.teacher:  # on-policy distillation: the teacher scores every sampled token, or its whole distribution joins the loss
        teacher_policy = load_policy_model(cfg.model, cfg.algorithm.teacher)
        same_vocabulary(policy, teacher_policy, cfg.algorithm.teacher)
        teacher_model = teacher_policy.model.eval().requires_grad_(False)
        if cfg.algorithm.teacher_loss in DIVERGENCES:
            divergence, metric = DIVERGENCES[cfg.algorithm.teacher_loss]
            full_teacher = FullTeacher(teacher_model, divergence)
            distill = Distill(sharing.logprobs(full_teacher.logprobs_and_kl), cfg.algorithm.teacher_coef, metric)
        else:
            teacher = Teacher(
                teacher_model, recompute, policy.pad_id, rl.temperature, cfg.optim.micro_batch_size, cfg.optim.micro_batch_tokens,
                teacher_policy.vision,
            )
        credit = DistilledCredit(credit, teacher, cfg.algorithm.teacher_coef, cfg.algorithm.teacher_alone)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=rl.lr, betas=(0.9, 0.99), weight_decay=cfg.optim.weight_decay)
    planned = planned_optimizer_steps(cfg)  # if every step keeps episodes
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rl_schedule(rl.lr_schedule, rl.warmup_steps, planned))
    learner = Learner(
        model, reference, trainable, optimizer, scheduler, algorithm, correction,
        replace(recompute, logprobs=sharing.logprobs(recompute.logprobs)), world, policy.pad_id, UpdateSettings.of(cfg), sharing,
        policy.vision, distill,
    )
    generator = torch.Generator().manual_seed(cfg.run.seed)
    restored = (
        restore_state(checkpoint, optimizer, scheduler, generator, sharing.shards(model, optimizer))
        if checkpoint else Restored(0, saved_start(phase_dir) if resume else {})
    )
    start = restored.step
    sharing.refresh(model, whole)  # the sampler's weights, after the optimizer took its parameters and a resume its state
    log = MetricsLog(run_dir / "metrics.jsonl", open_trackers(cfg, run_dir, "rl", start) if world.main else ())
    store = phase_dir / "rollouts" if rl.store_rollouts and world.main else None
    if world.main:
        log.drop_after("rl", start)
        drop_steps_after(phase_dir / "rollouts", start)
    pool: Rollouts  # where the episodes are sampled
    if rl.ray_workers:
        pool = RayRollouts(cfg, str(checkpoint or rl.init_from), run_dir, restored.rollouts)
        rubric = build_rubric(cfg.rewards, pool.env.default_rewards)  # each worker builds its own for scoring
    else:
        name = "" if world.main else f"rank{world.rank}"
        # Async: the rollouts sample from a copy of the policy, in a thread, while the trainer updates its own.
        sampling_policy = replace(policy, model=copy.deepcopy(model).eval() if rl.max_staleness else whole)
        engine = open_engine(cfg, sampling_policy, generator, run_dir, name, restored.rollouts)
        sampler_model = sampling_policy.model if rl.max_staleness else None
        rubric = build_rubric(cfg.rewards, engine.env.default_rewards)
        pool = LocalRollouts(engine, rubric, world, sampler_model)
    if not resume:  # where a run killed before its first checkpoint takes its audit logs back to
        start_state = pool.state()
        if world.main:
            save_start(phase_dir, start_state)
    if cfg.env.max_prompt_tokens is not None:
        sampling = replace(sampling, fits=prompt_fits(pool.env, policy.chat, policy.encode, cfg.env.max_prompt_tokens))
    if rl.task_pool:
        sampling = replace(sampling, pool=task_pool(pool.env, rl.task_pool, sampling))
    success = reward_function(pool.env.success_reward)
    replay = SuccessReplay(lambda episode: success(episode) == 1.0) if cfg.algorithm.replay else None
    if replay is not None:
        replay.restore(restored.replay)
    idle_steps = 0  # steps in a row whose kept groups carried no signal
    pick = PICKERS.get(cfg.algorithm.branch)  # where episodes branch (algorithm.branch), or None

    ahead: deque[tuple[int, Pending]] = deque()  # submitted first rounds of the next steps, with their weights' version
    updates = start  # rollout batches the trainer's weights have been updated on (a resumed run's samplers load them)
    try:
        steps = tqdm(range(start, rl.steps), desc="rl", initial=start, total=rl.steps, disable=not world.main)
        counted = pool.counts()  # token positions the samplers ran before this step (one gather per step)
        for step in steps:
            began = time.perf_counter()
            # 1. Rollout: group_size episodes per task, contiguous, scored; refilled if too few groups carry a signal.
            # Async (max_staleness k): the first rounds of steps up to step + k are already being sampled.
            while len(ahead) <= rl.max_staleness and step + len(ahead) < rl.steps:
                ahead.append((updates, submit_round(pool, sampling, step + len(ahead), 0)))
            version, first = ahead.popleft()
            staleness = updates - version  # batches' updates the first round's sampler had not seen
            sampled = sample_groups(pool, rubric, credit, sampling, step, first, replay)
            if pick is not None:
                sampled = branch_groups(pool, rubric, credit, sampling, step, sampled, pick, cfg.algorithm.branch_groups)
            trajectories = sampled.trajectories
            rollout_time = time.perf_counter() - began
            check_dropped(trajectories, step, world.main)

            # 2. Rewards -> advantages (per episode, or per token with turn credit); the filters.
            advantages = credit.advantages(trajectories, sampled.rewards, sampled.weights, rl.group_size, sampled.groups)  # [B] or [B, L-1]
            keep = update_mask(trajectories, sampled.groups, sampled.usable, rl.group_size, filters)  # [B]

            # 3. Policy-gradient steps on the kept episodes' sampled tokens: update_passes passes over
            # them, each cut into mini_batches optimizer steps on runs of whole groups.
            # Kept episodes group by group, by length within a group (this rank's share is whole groups;
            # update_order then picks the micro-batch layout that runs the fewest positions).
            order = sorted(torch.nonzero(keep).flatten().tolist(), key=lambda i: (i // rl.group_size, len(trajectories[i].token_ids)))
            update: dict[str, float] = {}
            recomputed: dict[int, list[float]] = {}  # episode -> the trainer's log-probs of its sampled tokens
            grad_norms: list[float] = []
            lr = scheduler.get_last_lr()[0]  # the LR of the step's first optimizer step
            if order:
                done = train_on_batch(learner, trajectories, order, advantages)
                grad_norms, recomputed = done.grad_norms, done.recomputed
                if rl.store_rollouts:
                    recomputed = dict(world.gather(list(recomputed.items())))
                update = update_metrics(world.reduce_stats(done.sums, UPDATE_MAXIMA), len(grad_norms), reference is not None, distill)
                updates += 1
                sharing.refresh(model, whole)
                pool.sync(whole)  # a sampler with its own copy of the weights gets the new ones

            # 4. Log and checkpoint.
            elsewhere = (sampled.replayed | sampled.branched).tolist()
            fresh = [i for i, other in enumerate(elsewhere) if not other]  # sampled this step from the task's start
            fresh_metrics = rollout_metrics([trajectories[i] for i in fresh], [sampled.scores[i] for i in fresh], success)
            record = {"phase": "rl", "step": step + 1, **fresh_metrics, **update}
            record["sampled_tokens"] = sum(t.sampled_tokens for t, stand_in in zip(trajectories, sampled.replayed.tolist()) if not stand_in)
            if pick is not None:
                record.update(branch_metrics(sampled, rl.group_size, success))
            signal_groups = int((sampled.groups & sampled.signal).sum())
            record.update({"kept_groups": int(sampled.groups.sum()), "signal_groups": signal_groups})
            record["trained_episodes"] = len(order)
            if replay is not None:
                record["replayed_episodes"] = int(sampled.replayed.sum())
            record.update({"refill_rounds": sampled.refill_rounds, "lr": lr, "optimizer_steps": len(grad_norms)})
            record["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else 0.0
            record["staleness"] = staleness
            if teacher is not None:
                record.update({"distill/reverse_kl": teacher.reverse_kl, "tokens/teacher": teacher.tokens})
            if store is not None:
                stored = time.perf_counter()
                records = step_records(sampled, advantages, keep, recomputed, success)
                write_step(store, step + 1, step_table(step + 1, rl.group_size, staleness, records))
                record["time/store"] = time.perf_counter() - stored
            record.update({"time/rollout": rollout_time, "time/step": time.perf_counter() - began})
            now = pool.counts()
            record.update({f"tokens/{kind}": n for kind, n in (now - counted).items()})
            counted = now
            record.update(memory_metrics(model, optimizer))
            if world.main:
                log.write(record)
                steps.set_postfix(progress_line(record), refresh=False)
            if (step + 1) % cfg.run.checkpoint_every == 0 or step + 1 == rl.steps:
                save_checkpoint(
                    phase_dir, step + 1, whole, policy.tokenizer, optimizer, scheduler, generator, cfg.run.keep_checkpoints,
                    rollouts=pool.state(), world=world, shards=sharing.shards(model, optimizer),
                    replay=replay.state() if replay is not None else None,
                )
                world.barrier()  # no rank runs ahead of a checkpoint it may resume from

            # 5. Stop a run that has nothing to learn from: every group's episodes scored alike, step after step.
            idle_steps = 0 if signal_groups else idle_steps + 1
            if rl.max_idle_steps and idle_steps >= rl.max_idle_steps:
                raise TrainingStalled(
                    f"{idle_steps} steps in a row had no group with a reward signal (each group's episodes all scored "
                    f"the same): the starting model {rl.init_from} never produces a scorable, varied answer; start from "
                    "an SFT checkpoint (`toolpolicy sft`, then set rl.init_from to RUN_DIR/sft/final) or raise "
                    f"rl.temperature (now {rl.temperature}); rl.max_idle_steps=0 turns this stop off"
                )
    finally:
        pool.close()  # the audit logs, and Ray's workers
        log.close()

    sharing.refresh(model, whole)  # gathered already, unless the run was resumed at its end
    final = save_final(phase_dir, whole, policy.tokenizer) if world.main else phase_dir / "final"
    world.barrier()
    world.close()
    return final


def branch_metrics(sampled: StepRollouts, group_size: int, success: RewardFunction) -> dict[str, float]:
    """The branched groups' figures: how many, how many carried a signal, and the share of their
    usable episodes that succeeded (after an error prefix: the recovery rate)."""
    rows = torch.nonzero(sampled.branched).flatten().tolist()
    groups = sorted({i // group_size for i in rows})
    solved = [success(sampled.trajectories[i].episode) == 1.0 for i in rows if sampled.usable[i]]
    return {
        "branch/groups": len(groups),
        "branch/signal_groups": int(sampled.signal[groups].sum()) if groups else 0,
        "branch/accuracy": sum(solved) / len(solved) if solved else 0.0,
    }


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


def step_records(
    sampled: StepRollouts, advantages: Tensor, keep: Tensor, recomputed: dict[int, list[float]], success: RewardFunction
) -> list[EpisodeRecord]:
    """What the rollout store keeps of each of the step's episodes."""
    return [
        EpisodeRecord(
            t, score.total, success(t.episode) == 1.0, score.components, sampled_advantages(advantages, i, t),
            recomputed.get(i), bool(keep[i]),
        )
        for i, (t, score) in enumerate(zip(sampled.trajectories, sampled.scores))
    ]


def sampled_advantages(advantages: Tensor, row: int, trajectory: Trajectory) -> list[float]:
    """The advantage of each token episode `row` sampled: its scalar repeated, or its per-token values
    (advantages [B] or [B, L-1], where position t is the advantage of token t + 1)."""
    if advantages.dim() == 1:
        return [float(advantages[row])] * trajectory.sampled_tokens
    mask = torch.tensor(trajectory.loss_mask[1:], dtype=torch.bool)  # [L-1]
    return advantages[row, : mask.shape[0]][mask].tolist()


def progress_line(record: dict[str, float]) -> dict[str, str]:
    """The RL bar's figures: reward, accuracy, kept groups, sampled tokens a second."""
    sampled = record["sampled_tokens"]
    return {
        "reward": f"{record.get('reward', 0.0):.3f}",
        "acc": f"{record.get('accuracy', 0.0):.2f}",
        "kept": str(record["kept_groups"]),
        "tok/s": f"{sampled / max(record['time/step'], 1e-9):.0f}",
    }


def rank_share(order: list[int], group_size: int, world: World) -> list[int]:
    """The episodes of `order` (kept, group by group) that this rank trains: its contiguous
    share of the kept groups, so a micro-batch still runs each prompt once."""
    groups = list(dict.fromkeys(i // group_size for i in order))
    mine = set(groups[i] for i in world.share(len(groups)))
    return [i for i in order if i // group_size in mine]
