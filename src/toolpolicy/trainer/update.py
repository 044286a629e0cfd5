"""The update on one rollout batch: the optimizer steps an RL step takes on its kept episodes.

`train_on_batch` cuts the kept episodes into optimizer steps (`optimizer_runs`: passes over
them, each cut into mini-batches of whole groups); each step accumulates the objective's
gradient over micro-batches (`policy_update`), sums the gradients across ranks, clips and
steps. The objective itself is pure math in toolpolicy.algorithms, chosen once from the
config (`algorithm_of`); this module wires it to a model, a batch and an optimizer.

Every stat the objective returns reaches the step's metrics under its own name
(`update_metrics`): the surrogate's token means (SURROGATE_STATS), its maxima, the KL.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from toolpolicy.algorithms import Algorithm
from toolpolicy.algorithms.correction import Correction, mismatch_sums
from toolpolicy.algorithms.losses import SURROGATE_STATS
from toolpolicy.config import AlgorithmSection, Config
from toolpolicy.model.adapters import reference_mode
from toolpolicy.model.placement import device_of
from toolpolicy.model.vision import VisionInput
from toolpolicy.rollout import Trajectory
from toolpolicy.rollout.backends import Capabilities
from toolpolicy.trainer.batch import Recompute, TokenBatch, collate, micro_batches, padding_passes, update_order
from toolpolicy.trainer.credit import Credit, EpisodeFilter, OutcomeCredit, TurnCredit, no_void_turn, not_truncated
from toolpolicy.trainer.distributed import Replicated, Sharded, World, clip_gradients
from toolpolicy.trainer.teacher import Distill

SURROGATE_MEANS = tuple(name for name in SURROGATE_STATS if not name.endswith("_max"))
"""The surrogate's stats that are means over a micro-batch's trained tokens: summed weighted by
its tokens, divided by the step's in `update_metrics`."""
UPDATE_MAXIMA = (*(name for name in SURROGATE_STATS if name.endswith("_max")), "mismatch/abs_max")
"""Sums that are maxima (the larger wins, across micro-batches, steps and ranks)."""
UPDATE_SUMS = (
    "loss", "entropy", "kl", *SURROGATE_MEANS, "mismatch/abs", "mismatch/kl", "mismatch/truncated", "mismatch/tokens",
    "tokens/update", "tokens/reference", "trained_tokens", "distill/kl", "tokens/teacher",
)
"""Sums `policy_update` adds up (each token sum not yet divided), beside UPDATE_MAXIMA."""
MISMATCH_SUMS = ("abs", "kl", "truncated")
"""`mismatch_sums`' sums, kept as mismatch/NAME."""


def algorithm_of(section: AlgorithmSection) -> tuple[Algorithm, Credit, tuple[EpisodeFilter, ...]]:
    """The objective, the credit and the episode filters the algorithm section names, chosen once
    (each part given the constants it declares among the section's options)."""
    algorithm = Algorithm.named(
        section.advantage, section.ratio_level, section.kl_estimator, section.aggregation, section.beta, **section.options
    )
    credit = TurnCredit(section.turn_rewards, section.turn_gamma) if section.credit == "turn" else OutcomeCredit(algorithm.estimator)
    filters = tuple(keep for keep, on in ((not_truncated, section.mask_truncated), (no_void_turn, section.void_turn_filter)) if on)
    return algorithm, credit, filters


def correction_of(algorithm: AlgorithmSection, backend: Capabilities) -> Correction:
    """algorithm.correction, with auto resolved by what the backend declares: none when its
    log-probs are the trainer's own numbers, else TIS."""
    name = algorithm.correction if algorithm.correction != "auto" else ("none" if backend.exact_logprobs else "tis")
    return Correction.named(name, **algorithm.options)


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
    sums = zero_sums()
    if before is not None:
        sums = add_sums(sums, before.mismatch)
    recomputed: dict[int, list[float]] = {}
    grad_norms = []
    learner.model.train()
    for number, run in enumerate(runs):
        learner.optimizer.zero_grad(set_to_none=True)
        mine = update_order(rank_share(run, s.group_size, world), trajectories, s.micro_batch_size)
        batch = collate([trajectories[i] for i in mine], learner.pad_id, learner.vision) if mine else None
        part, logprobs = policy_update(
            learner, batch, advantages[mine], totals, None if before is None or not mine else rows_of(before, mine),
            measure_mismatch=before is None and number == 0,  # the weights that sampled, still
        )
        sums = add_sums(sums, part)
        if number < per_pass:  # the first pass sees every episode once
            recomputed.update(zip(mine, (lp.tolist() for lp in logprobs)))
        learner.sharing.reduce_gradients(learner.trainable, world)
        grad_norms.append(clip_gradients(learner.trainable, s.grad_clip))
        learner.optimizer.step()
        learner.scheduler.step()  # the LR schedule counts optimizer steps
    return BatchUpdate(sums, recomputed, grad_norms)


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


def rank_share(order: list[int], group_size: int, world: World) -> list[int]:
    """The episodes of `order` (kept, group by group) that this rank trains: its contiguous
    share of the kept groups, so a micro-batch still runs each prompt once."""
    groups = list(dict.fromkeys(i // group_size for i in order))
    mine = set(groups[i] for i in world.share(len(groups)))
    return [i for i in order if i // group_size in mine]


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
    learner: Learner,
    batch: TokenBatch | None,
    advantages: Tensor,
    totals: Totals | None = None,
    before: Tensor | None = None,
    measure_mismatch: bool = True,
) -> Update:
    """Accumulate the objective's gradient on `learner.model` over micro-batches. Returns
    detached sums (UPDATE_SUMS, each token sum not yet divided) and maxima (UPDATE_MAXIMA),
    which `update_metrics` finishes, and the recomputed log-probs of the sampled tokens (for
    the rollout store).

    advantages: [B] per episode, or [B, L-1] per token (turn credit), cut to each piece's width.
    totals: the whole step's, when `batch` is this rank's share of it (default: the batch's own).
    Micro-batches hold at most settings.micro_batch_size rows and micro_batch_tokens positions;
    under sharding every rank runs as many forward and backward passes as the rank with the
    most (`padding_passes`). batch None: this rank has no episode to train this step (zero
    sums, no gradient). Log-probabilities are recomputed as `learner.recompute` says (each
    distinct prompt once, unless gradient checkpointing is on) at the rollout's sampling
    temperature; their gap to the sampler's is measured (`mismatch/*`, unless
    `measure_mismatch` is off) and, with TIS, corrected. `before` [B, L-1]: the trainer's
    log-probs under the weights that sampled, when earlier optimizer steps on this batch have
    moved the model since (TIS takes pi_old from them); None: the ones computed here are those.
    With `learner.distill`, the policy's forward also gives the divergence to a teacher at
    each trained position, and the loss gains distill.coef x its sum over the step's trained
    tokens (the sums gain `distill/kl` and `tokens/teacher`)."""
    model, reference, recompute, distill = learner.model, learner.reference, learner.recompute, learner.distill
    s = learner.settings
    sums = zero_sums()
    recomputed: list[Tensor] = []
    pieces = micro_batches(batch, s.micro_batch_size, s.micro_batch_tokens) if batch is not None else []
    device = device_of(model)
    lockstep = learner.sharing.lockstep(learner.world)
    padding_passes(model, reference, len(pieces), lockstep, learner.pad_id, recompute, s.temperature)
    if batch is None:
        return Update(sums, recomputed)
    total_tokens, total_sequences = totals or Totals(float(batch.loss_mask.sum()), float(batch.input_ids.shape[0]))
    for rows, piece in pieces:
        piece = piece.to(device)
        if distill is None:
            logprobs, entropy = recompute.logprobs(model, piece, s.temperature, with_entropy=True)  # [b, l]
        else:
            logprobs, entropy, teacher_kl = distill.logprobs(model, piece, s.temperature, with_entropy=True)  # [b, l] each
        piece_advantages = advantages[rows] if advantages.dim() == 1 else advantages[rows, : logprobs.shape[1]]
        piece_advantages = piece_advantages.to(device)
        ref_logprobs = None
        if reference is not None:
            with torch.no_grad(), reference_mode(reference):
                ref_logprobs, _ = recompute.logprobs(reference, piece, s.temperature)  # [b, l]
        sampler_trainer = logprobs if before is None else before[rows, : logprobs.shape[1]].to(device)  # [b, l]
        old_logprobs, weights = learner.correction.old_policy(sampler_trainer, piece.old_logprobs)  # [b, l], [b, l] or None
        loss, stats = learner.algorithm.objective(
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
        sums["trained_tokens"] += weight
        sums = add_stats(sums, stats, weight)
        if measure_mismatch:
            found = mismatch_sums(sampler_trainer, piece.old_logprobs, piece.loss_mask, learner.correction.cap)
            sums = add_mismatch(sums, found, weight)
        tokens = recompute.tokens(piece)
        sums["tokens/update"] += tokens  # forward and backward of the policy
        sums["tokens/reference"] += tokens if reference is not None else 0
    return Update(sums, recomputed)


def zero_sums() -> dict[str, float]:
    return dict.fromkeys(UPDATE_SUMS + UPDATE_MAXIMA, 0.0)


def add_stats(sums: dict[str, float], stats: dict[str, float], tokens: float) -> dict[str, float]:
    """`sums` with one micro-batch's objective stats added: maxima (UPDATE_MAXIMA) as the larger,
    `kl_sum` as kl, every other stat a mean over the micro-batch's `tokens`, summed weighted by
    them. A stat the objective returns that UPDATE_SUMS does not name is a KeyError, not a figure lost."""
    out = dict(sums)
    for name, value in stats.items():
        if name in UPDATE_MAXIMA:
            out[name] = max(out[name], value)
        elif name == "kl_sum":
            out["kl"] += value
        elif name in SURROGATE_MEANS:
            out[name] += value * tokens
        else:
            raise KeyError(f"the objective returned stat {name!r}, which UPDATE_SUMS does not know how to add up")
    return out


def add_mismatch(sums: dict[str, float], found: dict[str, float], tokens: float) -> dict[str, float]:
    """`sums` with one micro-batch's `mismatch_sums` over its `tokens` added."""
    out = dict(sums)
    for key in MISMATCH_SUMS:
        out[f"mismatch/{key}"] += found[key]
    out["mismatch/tokens"] += tokens
    out["mismatch/abs_max"] = max(out["mismatch/abs_max"], found["abs_max"])
    return out


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
    mismatch = {key: value for key, value in zero_sums().items() if key.startswith("mismatch/")}
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
            mismatch = add_mismatch(mismatch, found, float(piece.loss_mask.sum()))
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


def update_metrics(sums: dict[str, float], optimizer_steps: int, with_reference: bool, distill: Distill | None = None) -> dict[str, float]:
    """The step's update metrics from `policy_update`'s sums over its `optimizer_steps`: the
    loss per optimizer step, token counts as they are, maxima, and per-token means over
    every token trained (the entropy, every mean stat of the surrogate under its own name,
    kl only when a reference model ran; with a teacher in the loss its exact divergence under
    `distill.metric`) or, for the sampler/trainer mismatch, over the tokens it was measured on."""
    out = {key: sums[key] for key in ("tokens/update", "tokens/reference") + UPDATE_MAXIMA}
    out["loss"] = sums["loss"] / max(optimizer_steps, 1)
    for key in ("entropy", *SURROGATE_MEANS) + (("kl",) if with_reference else ()):
        out[key] = sums[key] / max(sums["trained_tokens"], 1.0)
    if distill is not None:
        out[distill.metric] = sums["distill/kl"] / max(sums["trained_tokens"], 1.0)
        out["tokens/teacher"] = sums["tokens/teacher"]
    for key in MISMATCH_SUMS:
        out[f"mismatch/{key}"] = sums[f"mismatch/{key}"] / max(sums["mismatch/tokens"], 1.0)
    return out
