"""Named algorithm presets: `algorithm.preset: NAME` in the config sets these knobs of the
`algorithm` section (and the overlong penalty and weights of `rewards`); any knob set
explicitly in the config (or with --set) wins over the preset.

Each preset is only config values, no code: the knobs name functions in the tables
(ESTIMATORS, POLICY_LOSSES, AGGREGATIONS, KL_ESTIMATORS) and
filters in filters.py. Values marked "paper" are the paper's; "ours" marks a choice the
paper does not fix or that our setting (one optimizer step per rollout batch, tiny
budgets) changes. The knobs:

    advantage         key of ESTIMATORS: grpo | dr_grpo | rloo |
                      reinforce_pp | reinforce_pp_baseline | gdpo
    credit            outcome (one advantage per trajectory) | turn (GTPO turn-level credit)
    turn_gamma        discount over turns for credit=turn
    ratio_level       token (PPO-clip) | sequence (GSPO), key of POLICY_LOSSES
    clip_low, clip_high, dual_clip (None = off, else c > 1)
    aggregation       key of AGGREGATIONS
    beta, kl_estimator (k1 | k2 | k3)
    dynamic_sampling  drop groups whose rewards are all equal (DAPO), refilling up to max_refill_rounds
    overlong_buffer   fraction of overlong_length in DAPO's soft overlong penalty zone (0 = off)
    overlong_penalty  weight of that penalty, the Rubric term `overlong` (0 = off)
    mask_truncated    leave truncated episodes out of the update (overlong filtering)
    void_turn_filter  drop trajectories with a void turn (SimpleTIR)
    weights           (otc only; section rewards) the reward functions and weights
"""

from __future__ import annotations

from typing import Any, Mapping

_GRPO_BASE: dict[str, Any] = {
    "advantage": "grpo",
    "credit": "outcome",
    "turn_gamma": 1.0,
    "ratio_level": "token",
    "clip_low": 0.2,
    "clip_high": 0.2,
    "dual_clip": None,
    "aggregation": "seq_mean_token_mean",
    "beta": 0.0,
    "kl_estimator": "k3",
    "dynamic_sampling": False,
    "max_refill_rounds": 0,
    "mask_truncated": False,
    "void_turn_filter": False,
}

PRESETS: dict[str, dict[str, Any]] = {
    # GRPO, DeepSeekMath (arXiv 2402.03300): group mean/std advantage, per-sequence mean of
    # token losses (eq. 3), k3 KL to the reference with beta = 0.04 (paper). clip 0.2 (ours:
    # PPO's common value; TRL's default).
    "grpo": {**_GRPO_BASE, "beta": 0.04},
    # Dr. GRPO (arXiv 2503.20783): no std division and a constant length normaliser
    # (seq_mean_token_sum_norm over max_tokens) - the two biases the paper removes (paper);
    # beta 0 and clip 0.2 (ours).
    "dr_grpo": {**_GRPO_BASE, "advantage": "dr_grpo", "aggregation": "seq_mean_token_sum_norm", "beta": 0.0},
    # DAPO (arXiv 2503.14476): clip-higher 0.2 / 0.28, token-mean loss, dynamic sampling,
    # soft overlong punishment with L_cache / L_max = 4096 / 20480 = 0.2 and factor 1.0,
    # no KL (all paper). Refill rounds cap: ours (the paper samples until the batch is full).
    "dapo": {
        **_GRPO_BASE,
        "clip_low": 0.2,
        "clip_high": 0.28,
        "aggregation": "token_mean",
        "dynamic_sampling": True,
        "max_refill_rounds": 3,
    },
    # GSPO (arXiv 2507.18071): sequence-level, length-normalised ratio clipped at
    # 3e-4 below / 4e-4 above, per-sequence aggregation, group-normalised advantage (paper);
    # beta 0 (ours).
    "gspo": {**_GRPO_BASE, "ratio_level": "sequence", "clip_low": 3e-4, "clip_high": 4e-4},
    # RLOO (Ahmadian et al., arXiv 2402.14740): leave-one-out baseline, REINFORCE on the
    # whole sequence's log-probability (sum over tokens; seq_mean_token_sum_norm is that sum
    # up to the constant 1 / max_tokens, which the learning rate absorbs). The paper has no
    # clipping; with one optimizer step per batch the ratio is 1 and the clip never binds
    # (ours). Its KL sits in the reward; here beta 0 (ours).
    "rloo": {**_GRPO_BASE, "advantage": "rloo", "aggregation": "seq_mean_token_sum_norm"},
    # REINFORCE++ (Hu et al., arXiv 2501.03262): batch-normalised reward, no per-prompt
    # baseline (paper); token-mean loss and clip 0.2 (ours). The paper puts a k1 KL in the
    # reward; we use a k2 KL loss (its gradient is the true KL gradient on-policy), beta 0.01 (ours).
    "reinforce_pp": {
        **_GRPO_BASE,
        "advantage": "reinforce_pp",
        "aggregation": "token_mean",
        "beta": 0.01,
        "kl_estimator": "k2",
    },
    # GDPO (Liu et al., arXiv 2601.05242): each reward component normalised within its group,
    # weighted sum, batch normalisation (paper); everything else as GRPO without KL (ours:
    # the paper changes only the advantage).
    "gdpo": {**_GRPO_BASE, "advantage": "gdpo"},
    # GTPO (Ding et al., arXiv 2511.14846): turn-level rewards, discounted returns per turn
    # normalised within the group, broadcast to each turn's tokens (paper). gamma 0.9 and
    # the SimpleTIR void-turn filter (arXiv 2509.02479) for multi-turn stability: ours.
    # credit=turn has its own estimator: the preset leaves `advantage` unset.
    "gtpo": {**{k: v for k, v in _GRPO_BASE.items() if k != "advantage"}, "credit": "turn", "turn_gamma": 0.9, "void_turn_filter": True},
    # OTC-GRPO (Wang et al., arXiv 2504.14870): GRPO on the OTC reward, correctness scaled by
    # how close the call count is to the fewest needed (paper). Needs the rewards/ function
    # `otc_reward` (algorithms.tool_efficiency.otc_reward on the episode); tool counts stay metrics.
    "otc": {**_GRPO_BASE},
}

REWARDS: dict[str, dict[str, Any]] = {
    name: {"overlong_buffer": 0.0, "overlong_penalty": 0.0} for name in PRESETS
}
"""Each preset's fields of the `rewards` section."""
# DAPO's soft overlong punishment: L_cache / L_max = 4096 / 20480 = 0.2, factor 1.0 (paper).
REWARDS["dapo"] = {"overlong_buffer": 0.2, "overlong_penalty": 1.0}
REWARDS["otc"] = {**REWARDS["otc"], "weights": {"otc_reward": 1.0, "correct_answer": 0.0, "tool_call_count": 0.0}}


def apply_preset(name: str, sections: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The explicitly set fields of the `algorithm` and `rewards` sections over the preset's:
    {"algorithm": {**PRESETS[name], **explicit}, "rewards": {**REWARDS[name], **explicit}}.

    ValueError names the valid presets.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown algorithm preset {name!r}; valid names: {sorted(PRESETS)}")
    return {
        "algorithm": {**PRESETS[name], **sections.get("algorithm", {})},
        "rewards": {**REWARDS[name], **sections.get("rewards", {})},
    }
