"""Advantage estimators: each sample is scored against a baseline built from the other samples.

Samples of one prompt are contiguous in the batch: rewards[g * group_size : (g + 1) * group_size]
belong to group g, so B = num_groups * group_size.

Every scalar estimator has one signature, `(rewards [B], group_size) -> advantages [B]`.
GDPO needs the reward components, not their sum, so it takes `(components [B, C],
weights [C], group_size)`. ESTIMATORS lists each by config name in that one signature
(scalar ones applied to the weighted sum, `on_total`), with the groups that carry a
learning signal for it; the trainer picks one when it reads the config.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

Advantage = Callable[[Tensor, int], Tensor]
ComponentAdvantage = Callable[[Tensor, Tensor, int], Tensor]


def group_view(rewards: Tensor, group_size: int) -> Tensor:
    """Reshape per-sample rewards [B] into [num_groups, group_size]; ValueError if B % group_size."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with length divisible by group_size={group_size}, got shape {tuple(rewards.shape)}"
        )
    return rewards.reshape(-1, group_size)  # [G, group_size]


def _float(rewards: Tensor) -> Tensor:
    return rewards if rewards.is_floating_point() else rewards.float()


def _std(values: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Unbiased std (divides by n - 1, as torch and TRL's `nanstd`); 0 where there is one value."""
    n = values.numel() if dim is None else values.shape[dim]
    if n < 2:
        return values.new_zeros(()) if dim is None else values.new_zeros(values.mean(dim, keepdim=keepdim).shape)
    return values.std() if dim is None else values.std(dim=dim, keepdim=keepdim)


def group_advantages(rewards: Tensor, group_size: int, scale_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Advantage of each sample relative to its group: (r - group mean) / (group std + eps).

    GRPO, DeepSeekMath (arXiv 2402.03300), section 4.1.2 "outcome supervision". The std is
    torch's default *unbiased* one (divides by group_size - 1), as TRL's GRPOTrainer does
    (`rewards.view(-1, G).std(dim=1)`); the paper does not say which. A group of one has
    no spread and gets advantage 0.

    scale_std=False is Dr. GRPO (arXiv 2503.20783, "Understanding R1-Zero-Like Training"):
    dividing by the std up-weights groups that are nearly all right or all wrong, so it
    drops the division and returns r - mean.

    A group whose rewards are all equal gets advantage exactly 0 (never NaN): the numerator
    is 0 and the denominator is eps.
    """
    grouped = group_view(_float(rewards), group_size)  # [G, group_size]
    centered = grouped - grouped.mean(dim=1, keepdim=True)  # [G, group_size]
    if scale_std:
        centered = centered / (_std(grouped, dim=1, keepdim=True) + eps)  # [G, group_size]
    return centered.reshape(-1)  # [B]


def grpo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """GRPO (DeepSeekMath, arXiv 2402.03300, section 4.1.2): (r - group mean) / (group std + 1e-6).

    rewards [B] -> [B]. The std is unbiased (see `group_advantages`).
    """
    return group_advantages(rewards, group_size, scale_std=True)  # [B]


def dr_grpo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Dr. GRPO (arXiv 2503.20783): r - group mean, no division by the group std.

    rewards [B] -> [B]. Its other half, the constant length normaliser, is the aggregation
    `seq_mean_token_sum_norm` in losses.py.
    """
    return group_advantages(rewards, group_size, scale_std=False)  # [B]


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """RLOO: r_i minus the mean of the OTHER samples of its group (leave-one-out baseline).

    Kool et al. 2019 ("Buy 4 REINFORCE samples, get a baseline for free") as used for LLMs
    by Ahmadian et al. (arXiv 2402.14740, "Back to Basics"):
        A_i = r_i - 1/(k-1) sum_{j != i} r_j  =  k/(k-1) * (r_i - mean)
    The baseline does not depend on r_i, so the estimate stays unbiased. rewards [B] -> [B];
    a group of one has no other sample and gets 0.
    """
    grouped = group_view(_float(rewards), group_size)  # [G, k]
    if group_size < 2:
        return torch.zeros_like(grouped).reshape(-1)  # [B]
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # [G, k]
    return (grouped - others_mean).reshape(-1)  # [B]


def reinforce_pp_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """REINFORCE++ (Hu et al., arXiv 2501.03262): no per-prompt baseline; the reward
    is normalised over the whole batch, (r - batch mean) / (batch std + eps).

    rewards [B] -> [B]; `group_size` is only checked (the batch must be whole groups). The
    paper whitens over tokens (each token carries its sequence's return), which weighs long
    responses more; this normalises over samples. Its KL-in-reward term is not here: use
    the KL loss (`kl_estimator`, `beta`) instead.
    """
    flat = group_view(_float(rewards), group_size).reshape(-1)  # [B]
    return (flat - flat.mean()) / (_std(flat) + eps)  # [B]


def reinforce_pp_baseline_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline (arXiv 2501.03262, the group variant for k samples per prompt):
    subtract the group mean, then divide by the std of those centred values over the batch.

    rewards [B] -> [B]. Unlike GRPO the scale is one number for the batch, so a group that
    is nearly all right is not blown up by its tiny std.
    """
    centered = dr_grpo_advantages(rewards, group_size)  # [B]
    return centered / (_std(centered) + eps)  # [B]


def gdpo_advantages(
    components: Tensor, weights: Tensor, group_size: int, batch_norm: bool = True, eps: float = 1e-6
) -> Tensor:
    """GDPO (Liu et al., arXiv 2601.05242): normalise each reward component within its group
    separately, sum them with their weights, then normalise the sum over the batch.

        A_i = BN( sum_c w_c * (r_ic - mean_group(r_c)) / (std_group(r_c) + eps) )

    components [B, C] (one column per reward function), weights [C] -> [B].
    Why: with plain GRPO the group normalises the weighted SUM, so rewards (0, 1) and (0, 2)
    in a group of two both become (-0.71, +0.71); normalised per component, a rollout that
    got both rewards gets twice the advantage of one that got one. A component that is
    constant in a group contributes 0 there; a weight-0 component (a metric) contributes 0.
    `batch_norm` is the paper's last step (TRL: multi_objective_aggregation="normalize_then_sum");
    it keeps the scale from growing with the number of components. Stds are unbiased.
    """
    components = _float(components)  # [B, C]
    if components.dim() != 2 or weights.shape != (components.shape[1],):
        shapes = f"{tuple(components.shape)} and {tuple(weights.shape)}"
        raise ValueError(f"components must be [B, C] and weights [C], got {shapes}")
    if group_size < 1 or components.shape[0] % group_size:
        raise ValueError(f"batch of {components.shape[0]} is not divisible by group_size={group_size}")
    grouped = components.reshape(-1, group_size, components.shape[1])  # [G, k, C]
    centered = grouped - grouped.mean(dim=1, keepdim=True)  # [G, k, C]
    normalised = centered / (_std(grouped, dim=1, keepdim=True) + eps)  # [G, k, C]
    combined = (normalised.reshape(-1, components.shape[1]) * weights.to(components.dtype)).sum(dim=1)  # [B]
    if not batch_norm:
        return combined  # [B]
    return (combined - combined.mean()) / (_std(combined) + eps)  # [B]


def varied_groups(rewards: Tensor, group_size: int) -> Tensor:
    """True for each group whose rewards are not all equal.   rewards [B] -> [G] bool

    The groups that carry a signal for a per-group baseline (GRPO, Dr.GRPO, RLOO,
    REINFORCE++-baseline): a group that is all right or all wrong has advantage 0 on every
    sample and so no gradient. DAPO's dynamic sampling (arXiv 2503.14476, section 3.2)
    drops such groups and samples more to keep the effective batch size steady.
    """
    grouped = group_view(rewards, group_size)  # [G, group_size]
    return (grouped != grouped[:, :1]).any(dim=1)  # [G] bool


def varied_batch(rewards: Tensor, group_size: int) -> Tensor:
    """Every group, if the batch's rewards are not all equal; else none.   rewards [B] -> [G] bool

    The groups that carry a signal for REINFORCE++ (arXiv 2501.03262): its baseline is the
    batch mean, so a group that is all right still gets a positive advantage when other
    groups did worse. Only a batch with one reward value everywhere teaches nothing.
    """
    grouped = group_view(rewards, group_size)  # [G, group_size]
    varied = bool((grouped != grouped.reshape(-1)[0]).any())
    return torch.full((grouped.shape[0],), varied, dtype=torch.bool)  # [G] bool


def varied_components(components: Tensor, weights: Tensor, group_size: int) -> Tensor:
    """True for each group where some weighted reward component varies.   [B, C], [C] -> [G] bool

    The groups that carry a signal for GDPO (arXiv 2601.05242), which normalises each
    component within its group: samples whose weighted totals tie (one right with a
    needless call, one wrong without) still differ in their components and still learn.
    A weight-0 component (a metric) contributes nothing, so it does not count.
    """
    grouped = components.reshape(-1, group_size, components.shape[1])  # [G, k, C]
    differs = (grouped != grouped[:, :1]).any(dim=1)  # [G, C]
    return (differs & (weights != 0)).any(dim=1)  # [G] bool


ComponentSignal = Callable[[Tensor, Tensor, int], Tensor]


class Estimator(NamedTuple):
    """An advantage estimator and the groups that carry a learning signal for it, both on
    the reward matrix: (components [B, C], weights [C], group_size) -> [B], and -> [G] bool.
    Each Rubric term is a column; the scalar reward is components @ weights."""

    advantages: ComponentAdvantage
    signal: ComponentSignal


def on_total(scalar: Callable[[Tensor, int], Tensor]) -> Callable[[Tensor, Tensor, int], Tensor]:
    """A function of the scalar rewards [B] applied to the weighted sum of the components,
    which is exactly the Rubric's total."""

    def of_total(components: Tensor, weights: Tensor, group_size: int) -> Tensor:
        values = _float(components)  # [B, C]
        return scalar(values @ weights.to(values.dtype), group_size)

    of_total.__doc__ = f"{scalar.__name__} on the weighted sum of the reward components."
    return of_total


ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator(on_total(grpo_advantages), on_total(varied_groups)),
    "dr_grpo": Estimator(on_total(dr_grpo_advantages), on_total(varied_groups)),
    "rloo": Estimator(on_total(rloo_advantages), on_total(varied_groups)),
    "reinforce_pp": Estimator(on_total(reinforce_pp_advantages), on_total(varied_batch)),
    "reinforce_pp_baseline": Estimator(on_total(reinforce_pp_baseline_advantages), on_total(varied_groups)),
    "gdpo": Estimator(gdpo_advantages, varied_components),
}
"""Advantage estimators by config name (`advantage`), each with the groups it learns from."""
