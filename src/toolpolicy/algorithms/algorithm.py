"""The RL objective, chosen once: which estimator, ratio level, KL estimator and aggregation.

`Algorithm.named(...)` looks each name up in its table when the config is read and builds
each part from the constants it declares (toolpolicy.algorithms.variants); the trainer then
calls `objective` on every micro-batch and `estimator` on every step, with no branch on a
name in the hot path. Nothing here knows about configs or files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from toolpolicy.algorithms.advantages import ESTIMATORS, Estimator
from toolpolicy.algorithms.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, Aggregation, KLEstimator, PolicyLoss
from toolpolicy.algorithms.variants import configured


def _pick(table: dict, name: str, what: str):
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; valid names: {sorted(table)}")
    return table[name]


@dataclass(frozen=True)
class Algorithm:
    """Every choice of the policy-gradient objective: pure functions and their constants."""

    estimator: Estimator  # advantages from the reward matrix, and the groups with a signal
    policy_loss: PolicyLoss  # per-token clipped surrogate, token or sequence level, its clip bounds inside
    kl: KLEstimator  # per-token KL(pi || ref)
    aggregation: Aggregation  # per-token losses -> one number, its constants (Dr. GRPO's length) inside
    beta: float  # weight of the KL term in the loss; 0 leaves it out (it may still be logged)

    @staticmethod
    def named(advantage: str, ratio_level: str, kl_estimator: str, aggregation: str, beta: float = 0.0, **constants: Any) -> Algorithm:
        """Look each name up once (ValueError names the valid ones) and build each part from
        the `constants` it declares (clip_low, loss_norm_length, ...; one not given keeps its
        default, and those no part declares are other components')."""
        return Algorithm(
            _pick(ESTIMATORS, advantage, "advantage estimator"),
            configured(_pick(POLICY_LOSSES, ratio_level, "ratio level"), constants),
            configured(_pick(KL_ESTIMATORS, kl_estimator, "KL estimator"), constants),
            configured(_pick(AGGREGATIONS, aggregation, "loss aggregation"), constants),
            beta,
        )

    def objective(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor,
        ref_logprobs: Tensor | None, total_tokens: float, total_sequences: float, weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """One micro-batch's share of the whole batch's loss, and detached stats.

        logprobs, old_logprobs, loss_mask, ref_logprobs [b, T]; advantages [b] or [b, T].
        total_tokens / total_sequences count the whole batch, so micro-batch losses add up.
        weights [b, T] scale each token's policy-gradient term (truncated importance
        sampling of a sampler that is not the trainer, toolpolicy.algorithms.correction).
        Stats: the policy loss's, and with a reference `kl_sum`, the masked sum of the KL.
        """
        per_token, stats = self.policy_loss(logprobs, old_logprobs, advantages, loss_mask)  # [b, T]
        if weights is not None:
            per_token = per_token * weights
        if ref_logprobs is not None:
            kl = self.kl(logprobs, ref_logprobs)  # [b, T]
            if self.beta > 0:
                per_token = per_token + self.beta * kl
            stats["kl_sum"] = float((kl.detach() * loss_mask).sum())
        return self.aggregation(per_token, loss_mask, total_tokens, total_sequences), stats
