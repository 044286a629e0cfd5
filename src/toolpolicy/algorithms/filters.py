"""Sample filters: which groups and trajectories the update trains on.

Keep-masks are bool tensors (True = train on it). Filters run AFTER advantages are
computed, so a dropped sample still counts in its group's baseline.
"""

from __future__ import annotations

import torch
from torch import Tensor


def expand_group_mask(group_mask: Tensor, group_size: int) -> Tensor:
    """Repeat a per-group mask [G] to a per-sample mask [G * group_size] (samples of a group contiguous).

    Companion to the estimators' group signals (`Estimator.signal`; DAPO, arXiv 2503.14476).
    """
    return group_mask.repeat_interleave(group_size)  # [G * group_size]


def first_groups(group_mask: Tensor, limit: int) -> Tensor:
    """Keep at most `limit` of the groups `group_mask` [G] keeps, the first ones in order.   -> [G] bool

    DAPO dynamic sampling with refill (arXiv 2503.14476, its Algorithm 1): the trainer samples
    more prompts until `limit` varied groups are in hand (up to a cap of rounds, logging how
    many it drew), then trains on exactly `limit`; this picks them.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return group_mask.bool() & (group_mask.bool().cumsum(dim=0) <= limit)  # [G] bool


def void_turn_filter(productive: list[list[bool]]) -> Tensor:
    """Keep-mask of trajectories with no void turn.   per trajectory, per turn flags -> [B] bool

    SimpleTIR (Xue et al., arXiv 2509.02479): a "void turn" produces neither a tool call nor
    a final answer. Such turns come with low-probability tokens that blow up the gradient in
    multi-turn training, so trajectories containing one are dropped from the update.
    `productive[b][t]` is True when turn t of trajectory b made a call attempt or gave a final
    answer (the trainer reads this off the Trajectory's episode events per turn).
    """
    return torch.tensor([all(turns) for turns in productive], dtype=torch.bool)  # [B]
