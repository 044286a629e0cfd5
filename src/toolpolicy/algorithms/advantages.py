"""Group-relative advantages: each sample is scored against the other samples of its prompt.

Samples of one prompt are contiguous in the batch: rewards[g * group_size : (g + 1) * group_size]
belong to group g, so B = num_groups * group_size.
"""

from __future__ import annotations

from torch import Tensor


def group_view(rewards: Tensor, group_size: int) -> Tensor:
    """Reshape per-sample rewards [B] into [num_groups, group_size]; ValueError if B % group_size."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with length divisible by group_size={group_size}, got shape {tuple(rewards.shape)}"
        )
    return rewards.reshape(-1, group_size)  # [G, group_size]


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
    rewards = rewards if rewards.is_floating_point() else rewards.float()  # [B]
    grouped = group_view(rewards, group_size)  # [G, group_size]
    centered = grouped - grouped.mean(dim=1, keepdim=True)  # [G, group_size]
    if scale_std:
        if group_size > 1:
            std = grouped.std(dim=1, keepdim=True)  # [G, 1], unbiased
        else:
            std = grouped.new_zeros(grouped.shape[0], 1)  # [G, 1], one sample has no spread
        centered = centered / (std + eps)  # [G, group_size]
    return centered.reshape(-1)  # [B]
