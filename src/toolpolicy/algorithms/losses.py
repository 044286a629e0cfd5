"""Policy-gradient losses, their token aggregation, the KL estimator and per-token helpers.

Every function is pure: tensors in, tensors (plus detached float stats) out. The trainer
recomputes `logprobs` under the current policy with `token_logprobs`, then wires
`ppo_clip_loss` -> `aggregate_loss` (+ beta * `kl_k3` aggregated the same way).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of values [B, T] over positions where mask [B, T] is nonzero; 0 if the mask is empty."""
    mask = mask.to(values.dtype)  # [B, T]
    return (values * mask).sum() / mask.sum().clamp(min=1.0)  # []


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    *,
    loss_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token PPO-clip loss, the negated clipped surrogate objective (to minimise).

    PPO (arXiv 1707.06347) as used by GRPO (arXiv 2402.03300):
        ratio = exp(logprobs - old_logprobs)
        loss  = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
    Separate `clip_low` / `clip_high` is DAPO's clip-higher (arXiv 2503.14476, e.g. 0.2 / 0.28):
    a larger upper bound lets low-probability tokens with positive advantage grow, which
    keeps entropy from collapsing.

    `advantages` is one value per sequence, broadcast over its tokens. `loss_mask` is used
    only for the stats; masking the loss itself is `aggregate_loss`'s job.

    Stats (detached floats, means over masked tokens): `clip_fraction` where the clipped
    term was the one chosen (its gradient is zero), split into `clip_low_fraction`
    (ratio < 1 - clip_low, A < 0) and `clip_high_fraction` (ratio > 1 + clip_high, A > 0);
    `ratio_mean`, `ratio_max`.
    """
    advantages = advantages.detach().unsqueeze(1)  # [B, 1]
    ratio = torch.exp(logprobs - old_logprobs.detach())  # [B, T]
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # [B, T]
    per_token = -torch.min(ratio * advantages, clipped_ratio * advantages)  # [B, T]

    with torch.no_grad():
        mask = torch.ones_like(ratio) if loss_mask is None else loss_mask.to(ratio.dtype)  # [B, T]
        clipped_low = (ratio < 1.0 - clip_low) & (advantages < 0)  # [B, T]
        clipped_high = (ratio > 1.0 + clip_high) & (advantages > 0)  # [B, T]
        masked_ratio = torch.where(mask > 0, ratio, torch.zeros_like(ratio))  # [B, T]
        stats = {
            "clip_fraction": _masked_mean((clipped_low | clipped_high).to(ratio.dtype), mask).item(),
            "clip_low_fraction": _masked_mean(clipped_low.to(ratio.dtype), mask).item(),
            "clip_high_fraction": _masked_mean(clipped_high.to(ratio.dtype), mask).item(),
            "ratio_mean": _masked_mean(ratio, mask).item(),
            "ratio_max": masked_ratio.max().item() if mask.any() else 0.0,
        }
    return per_token, stats


def token_mean(per_token: Tensor, loss_mask: Tensor, total_tokens: float, total_sequences: float) -> Tensor:
    """Sum of masked token losses / total masked tokens in the whole batch.

    DAPO's token-level policy gradient loss (arXiv 2503.14476, section 3.3): every token
    weighs the same, so long responses are not diluted.
    """
    mask = loss_mask.to(per_token.dtype)  # [B, T]
    return (per_token * mask).sum() / total_tokens  # []


def seq_mean_token_mean(per_token: Tensor, loss_mask: Tensor, total_tokens: float, total_sequences: float) -> Tensor:
    """Mean over each sequence's masked tokens, summed over sequences / total sequences in the batch.

    The original GRPO objective (arXiv 2402.03300, eq. 3): (1/G) sum_i (1/|o_i|) sum_t.
    A sequence with no masked token contributes 0.
    """
    mask = loss_mask.to(per_token.dtype)  # [B, T]
    per_sequence = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # [B]
    return per_sequence.sum() / total_sequences  # []


Aggregation = Callable[[Tensor, Tensor, float, float], Tensor]

AGGREGATIONS: dict[str, Aggregation] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
}


def aggregate_loss(
    per_token: Tensor, loss_mask: Tensor, mode: str, total_tokens: float, total_sequences: float
) -> Tensor:
    """Reduce a per-token loss [B, T] to a scalar with the aggregation named `mode` (see AGGREGATIONS).

    `total_tokens` (masked tokens) and `total_sequences` count the WHOLE batch, not this
    micro-batch, so summing the values of micro-batches gives the full-batch value and
    gradient accumulation needs no rescaling. Modes: "token_mean" (DAPO, arXiv 2503.14476),
    "seq_mean_token_mean" (GRPO, arXiv 2402.03300).
    """
    aggregation = AGGREGATIONS.get(mode)
    if aggregation is None:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid modes: {sorted(AGGREGATIONS)}")
    return aggregation(per_token, loss_mask, total_tokens, total_sequences)  # []


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(ref - lp) - (ref - lp) - 1, always >= 0.

    Schulman, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html): unbiased
    for samples drawn from pi, non-negative, and lower variance than -log ratio. GRPO uses it
    as its KL penalty (arXiv 2402.03300, eq. 4). Written with expm1 so the result stays
    >= 0 in floating point when lp and ref are close.
    """
    log_ratio = ref_logprobs - logprobs  # [B, T]
    return (torch.expm1(log_ratio) - log_ratio).clamp(min=0.0)  # [B, T]


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last dim, per token: H = -sum_v p_v log p_v.

    Computed in float32 from log_softmax (logsumexp-stable); tokens with logit -inf
    (p = 0) contribute 0, not NaN. Entropy as a training signal: DAPO (arXiv 2503.14476).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    p_logp = torch.where(logp.isneginf(), torch.zeros_like(logp), logp.exp() * logp)  # [B, T, V]
    return -p_logp.sum(dim=-1)  # [B, T]


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """Log-probability of each target token: log_softmax(logits)[b, t, targets[b, t]], in float32.

    Gathers the target logit and subtracts the logsumexp, so no [B, T, V] log-softmax is
    kept. Used for the policy-ratio terms of PPO / GRPO (arXiv 1707.06347, 2402.03300).
    `logits[:, t]` must already be the prediction for `targets[:, t]` (shift beforehand).
    """
    logits = logits.float()  # [B, T, V]
    target_logits = logits.gather(dim=-1, index=targets.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return target_logits - torch.logsumexp(logits, dim=-1)  # [B, T]
