"""Pure tensor math for RL on tool-using agents: advantages, losses, KL, sample filters.

Imports torch only. Nothing here knows about tokenizers, files or logging.
"""

from toolpolicy.algorithms.advantages import group_advantages, group_view
from toolpolicy.algorithms.filters import expand_group_mask, varied_groups
from toolpolicy.algorithms.losses import (
    AGGREGATIONS,
    aggregate_loss,
    entropy_from_logits,
    kl_k3,
    ppo_clip_loss,
    seq_mean_token_mean,
    token_logprobs,
    token_mean,
)

__all__ = [
    "AGGREGATIONS",
    "aggregate_loss",
    "entropy_from_logits",
    "expand_group_mask",
    "group_advantages",
    "group_view",
    "kl_k3",
    "ppo_clip_loss",
    "seq_mean_token_mean",
    "token_logprobs",
    "token_mean",
    "varied_groups",
]
