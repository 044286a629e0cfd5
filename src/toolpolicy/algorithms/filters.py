"""Sample filters and length shaping: which groups, trajectories and tokens carry a learning signal.

Keep-masks are bool tensors (True = train on it). Filters run AFTER advantages are
computed, so a dropped sample still counts in its group's baseline.
"""

from __future__ import annotations

import torch
from torch import Tensor

from toolpolicy.algorithms.advantages import group_view


def varied_groups(rewards: Tensor, group_size: int) -> Tensor:
    """True for each group whose rewards are not all equal.

    DAPO dynamic sampling (arXiv 2503.14476, section 3.2): a group that is all right or all
    wrong has zero group-relative advantage everywhere and so no gradient; drop it (and
    sample more) to keep the effective batch size steady.
    """
    grouped = group_view(rewards, group_size)  # [G, group_size]
    return (grouped != grouped[:, :1]).any(dim=1)  # [G] bool


def expand_group_mask(group_mask: Tensor, group_size: int) -> Tensor:
    """Repeat a per-group mask [G] to a per-sample mask [G * group_size] (samples of a group contiguous).

    Companion to `varied_groups` (DAPO, arXiv 2503.14476).
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


def overlong_filter(lengths: Tensor, max_length: int) -> Tensor:
    """Keep-mask of responses that ended before the length budget: lengths < max_length.   [B] -> [B] bool

    DAPO overlong filtering (arXiv 2503.14476, section 3.4): a response cut by the budget is
    not wrong, only unfinished, so scoring it as wrong is reward noise; its loss is masked.
    A response of exactly `max_length` tokens counts as cut. When the engine records
    truncation itself (Episode.truncated: out of turns or tokens), `mask_truncated` uses that.
    """
    return lengths < max_length  # [B] bool


def soft_overlong_penalty(lengths: Tensor, max_length: int, buffer: int) -> Tensor:
    """DAPO's soft overlong punishment (arXiv 2503.14476, section 3.4, eq. 13), added to the reward.   [B] -> [B]

        R_length(y) = 0                                   if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                    = -1                                  if |y| > L_max
    with L_max = `max_length` and L_cache = `buffer`: the penalty grows linearly from 0 to -1
    across the last `buffer` tokens of the budget. The paper uses L_max = 20480, L_cache = 4096.
    buffer = 0 gives no penalty up to the budget and -1 past it.
    """
    if buffer < 0 or buffer > max_length:
        raise ValueError(f"buffer must be in [0, max_length={max_length}], got {buffer}")
    lengths = lengths.float()  # [B]
    expected = max_length - buffer
    ramp = (expected - lengths) / buffer if buffer > 0 else torch.zeros_like(lengths)  # [B]
    penalty = torch.where(lengths <= expected, torch.zeros_like(lengths), ramp)  # [B]
    return torch.where(lengths > max_length, torch.full_like(lengths, -1.0), penalty)  # [B]


def mask_truncated(loss_mask: Tensor, truncated: Tensor) -> Tensor:
    """Zero the loss mask of every truncated trajectory.   loss_mask [B, T], truncated [B] bool -> [B, T]

    Truncated-completion masking (TRL `mask_truncated_completions`; the overlong filtering of
    DAPO, arXiv 2503.14476, section 3.4): an episode cut by max turns or max tokens gives no
    gradient, so the model is not taught that being cut off is the same as being wrong.
    """
    keep = (~truncated.bool()).to(loss_mask.dtype).unsqueeze(1)  # [B, 1]
    return loss_mask * keep  # [B, T]


def void_turn_filter(productive: list[list[bool]]) -> Tensor:
    """Keep-mask of trajectories with no void turn.   per trajectory, per turn flags -> [B] bool

    SimpleTIR (Xue et al., arXiv 2509.02479): a "void turn" produces neither a tool call nor
    a final answer. Such turns come with low-probability tokens that blow up the gradient in
    multi-turn training, so trajectories containing one are dropped from the update.
    `productive[b][t]` is True when turn t of trajectory b made a call attempt or gave a final
    answer (the trainer reads this off the Trajectory's episode events per turn).
    """
    return torch.tensor([all(turns) for turns in productive], dtype=torch.bool)  # [B]
