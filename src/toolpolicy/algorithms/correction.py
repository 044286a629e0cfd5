"""The sampler is not the trainer: measuring and correcting their log-prob mismatch.

A rollout engine other than the trainer's own forward (vLLM, a served endpoint, another
precision or kernel) samples from a slightly different distribution pi_sampler than the
one the trainer computes, pi_trainer, even at equal weights. Using the sampler's log-probs
as pi_old then biases the update. Truncated importance sampling (TIS; Yao et al. 2025,
"Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", as in verl and
slime) takes pi_old from the trainer and weighs each token's policy-gradient term by
min(pi_trainer / pi_sampler, cap). When both agree the weights are 1 and it is a no-op.

`Correction.named` picks, from the `rollout_correction` name, the function that gives,
from the trainer's and the sampler's log-probs of the sampled tokens, pi_old and the
per-token weights (None: unweighted). All functions are pure: tensors in, tensors out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

OldPolicy = Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]]
"""(trainer log-probs [b, T], sampler log-probs [b, T]) -> (pi_old log-probs, weights or None)."""


def sampler_old_policy(trainer_logprobs: Tensor, sampler_logprobs: Tensor) -> tuple[Tensor, None]:
    """pi_old is the sampler's own log-probs (right when the sampler is the trainer's model)."""
    return sampler_logprobs, None


def truncated_importance_weights(trainer_logprobs: Tensor, sampler_logprobs: Tensor, cap: float) -> Tensor:
    """min(pi_trainer / pi_sampler, cap) per token, detached.   [b, T]"""
    return torch.exp(trainer_logprobs.detach() - sampler_logprobs).clamp(max=cap)


def tis_old_policy(trainer_logprobs: Tensor, sampler_logprobs: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """TIS: pi_old from the trainer (detached), each token weighed by the truncated ratio."""
    return trainer_logprobs.detach(), truncated_importance_weights(trainer_logprobs, sampler_logprobs, cap)


@dataclass(frozen=True)
class Correction:
    """A rollout correction, chosen once from the config's name."""

    old_policy: OldPolicy
    cap: float
    """The TIS cap; tokens past it are counted by `mismatch_sums` whatever the correction."""
    uses_trainer: bool
    """Whether pi_old is the trainer's log-probs under the sampling weights (so an update of
    several optimizer steps must take them before the first one moves the weights)."""

    @staticmethod
    def named(name: str, cap: float) -> Correction:
        """"none" or "tis" (ValueError names the valid ones)."""
        table: dict[str, tuple[OldPolicy, bool]] = {"none": (sampler_old_policy, False), "tis": (partial(tis_old_policy, cap=cap), True)}
        if name not in table:
            raise ValueError(f"unknown rollout correction {name!r}; valid names: {sorted(table)}")
        policy, uses_trainer = table[name]
        return Correction(policy, cap, uses_trainer)


def mismatch_sums(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, cap: float) -> dict[str, float]:
    """Masked sums over tokens of the mismatch (to be divided by the token count), and its max.

    abs:       |log pi_trainer - log pi_sampler|
    kl:        k3 estimate of KL(pi_sampler || pi_trainer) from the sampled tokens: r - 1 - log r,
               r = pi_trainer / pi_sampler (Schulman's k3; >= 0, unbiased)
    truncated: tokens whose ratio exceeds the TIS cap
    abs_max:   the largest |difference| (not a sum)
    """
    delta = (trainer_logprobs.detach() - sampler_logprobs).float()  # [b, T]
    mask = mask.to(delta.dtype)
    ratio = torch.exp(delta)
    masked_abs = delta.abs() * mask
    return {
        "abs": float(masked_abs.sum()),
        "kl": float(((ratio - 1 - delta) * mask).sum()),
        "truncated": float(((ratio > cap).to(delta.dtype) * mask).sum()),
        "abs_max": float(masked_abs.max()) if mask.any() else 0.0,
    }
