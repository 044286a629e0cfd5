"""The sampler is not the trainer: measuring and correcting their log-prob mismatch.

A rollout engine other than the trainer's own forward (vLLM, a served endpoint, another
precision or kernel) samples from a slightly different distribution pi_sampler than the
one the trainer computes, pi_trainer, even at equal weights. Using the sampler's log-probs
as pi_old then biases the update. Truncated importance sampling (TIS; Yao et al. 2025,
"Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", as in verl and
slime) takes pi_old from the trainer and weighs each token's policy-gradient term by
min(pi_trainer / pi_sampler, cap). When both agree the weights are 1 and it is a no-op.

`Correction.named` picks, from the config's `correction` name, the row of CORRECTIONS that
gives, from the trainer's and the sampler's log-probs of the sampled tokens, pi_old and the
per-token weights (None: unweighted); `Tis` is a dataclass of its cap, called as the function
(toolpolicy.algorithms.variants). All functions are pure: tensors in, tensors out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from toolpolicy.algorithms.variants import AboveOne, configured

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
class Tis:
    """The correction "tis": `tis_old_policy` at its cap."""

    tis_cap: AboveOne = 2.0
    """correction=tis: the largest importance weight a token gets (whatever the correction,
    the tokens past it are counted as mismatch/truncated)."""

    def __call__(self, trainer_logprobs: Tensor, sampler_logprobs: Tensor) -> tuple[Tensor, Tensor]:
        return tis_old_policy(trainer_logprobs, sampler_logprobs, self.tis_cap)


CORRECTIONS: dict[str, OldPolicy | type[Tis]] = {"none": sampler_old_policy, "tis": Tis}
"""Rollout corrections by config name (`correction`; the config's `auto` is resolved first, from
what the backend declares): an OldPolicy, or a dataclass of its constants called as one."""


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
    def named(name: str, **constants: Any) -> Correction:
        """A row of CORRECTIONS (ValueError names the valid ones), built from the `constants`
        it declares as `Algorithm.named` builds its parts; every one but "none" takes pi_old
        from the trainer. The cap is TIS's whatever the correction."""
        if name not in CORRECTIONS:
            raise ValueError(f"unknown rollout correction {name!r}; valid names: {sorted(CORRECTIONS)}")
        return Correction(configured(CORRECTIONS[name], constants), configured(Tis, constants).tis_cap, name != "none")


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
