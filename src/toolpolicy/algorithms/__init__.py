"""Pure tensor math for RL on tool-using agents: advantages, losses, KL, sample filters, presets.

Imports torch only (and annotated_types for the bounds of constants). Nothing here knows about
tokenizers, files or logging. Each variant is a small function listed in a name -> function
table (ESTIMATORS, POLICY_LOSSES, AGGREGATIONS, KL_ESTIMATORS, correction.CORRECTIONS), or,
when it has constants the config sets, a frozen dataclass of them called as the function
(variants.py); `Algorithm.named` picks one of each once, when the config is read, and gives
it its constants. PRESETS maps `algorithm:` names to knob values.
"""

from toolpolicy.algorithms.advantages import (
    ESTIMATORS, Estimator, dr_grpo_advantages, gdpo_advantages, group_advantages, group_view, grpo_advantages,
    on_total, reinforce_pp_advantages, reinforce_pp_baseline_advantages, rloo_advantages, varied_batch,
    varied_components, varied_groups,
)
from toolpolicy.algorithms.algorithm import Algorithm
from toolpolicy.algorithms.filters import expand_group_mask, first_groups, void_turn_filter
from toolpolicy.algorithms.losses import (
    AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, SeqMeanTokenSumNorm, SequenceClip, TokenClip, aggregate_loss, chunked_token_logprobs,
    clipped_surrogate, entropy_from_logits, gspo_loss, kl_k1, kl_k2, kl_k3, ppo_clip_loss, seq_mean_token_mean, seq_mean_token_sum_norm,
    sequence_log_ratio, token_log_ratio, token_logprobs, token_mean,
)
from toolpolicy.algorithms.presets import PRESETS, apply_preset
from toolpolicy.algorithms.turns import broadcast_turns, discounted_returns, turn_advantages, turn_rewards, varied_returns

__all__ = [
    "AGGREGATIONS", "Algorithm", "ESTIMATORS", "Estimator", "KL_ESTIMATORS", "POLICY_LOSSES", "PRESETS", "SeqMeanTokenSumNorm",
    "SequenceClip", "TokenClip",
    "aggregate_loss", "apply_preset", "broadcast_turns", "chunked_token_logprobs", "clipped_surrogate", "discounted_returns",
    "dr_grpo_advantages", "entropy_from_logits", "expand_group_mask", "first_groups", "gdpo_advantages",
    "group_advantages", "group_view", "grpo_advantages", "gspo_loss", "kl_k1", "kl_k2", "kl_k3", "on_total",
    "ppo_clip_loss", "reinforce_pp_advantages", "reinforce_pp_baseline_advantages", "rloo_advantages",
    "seq_mean_token_mean", "seq_mean_token_sum_norm", "sequence_log_ratio", "token_log_ratio", "token_logprobs",
    "token_mean", "turn_advantages", "turn_rewards", "varied_batch", "varied_components", "varied_groups",
    "varied_returns", "void_turn_filter",
]
