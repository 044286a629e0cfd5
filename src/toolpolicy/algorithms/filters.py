"""Sample filters: which groups carry a learning signal."""

from __future__ import annotations

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
