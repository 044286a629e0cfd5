"""Policy-gradient losses, their token aggregation, KL estimators and per-token helpers.

Every function is pure: tensors in, tensors (plus detached float stats) out. The trainer
recomputes `logprobs` under the current policy with `token_logprobs`, then wires
POLICY_LOSSES[ratio_level] -> (+ beta * KL_ESTIMATORS[kl_estimator]) -> AGGREGATIONS[aggregation].
Tables, picked once when the config is read: POLICY_LOSSES ("token": PPO-clip, "sequence":
GSPO), AGGREGATIONS, KL_ESTIMATORS. A variant with constants the config sets is a frozen
dataclass of them, called as its function (toolpolicy.algorithms.variants): TokenClip and
SequenceClip hold the clip bounds, SeqMeanTokenSumNorm Dr. GRPO's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from toolpolicy.algorithms.variants import AboveOne, Length, NonNegative, configured


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of values [B, T] over positions where mask [B, T] is nonzero; 0 if the mask is empty."""
    mask = mask.to(values.dtype)  # [B, T]
    return (values * mask).sum() / mask.sum().clamp(min=1.0)  # []


def token_log_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """Per-token log importance ratio log(pi / pi_old) = logprobs - old_logprobs.   [B, T]

    PPO (arXiv 1707.06347) and GRPO (arXiv 2402.03300) weigh each token by its own ratio.
    """
    return logprobs - old_logprobs.detach()  # [B, T]


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, loss_mask: Tensor | None = None) -> Tensor:
    """GSPO's sequence-level log ratio, length-normalised, in its GSPO-token form.   [B, T]

    GSPO (Zheng et al., arXiv 2507.18071): s_i = exp( (1/|y_i|) sum_t log(pi/pi_old)(y_it) ),
    the geometric mean of the token ratios over the sequence's masked tokens, so one clip
    decision covers the whole response. Returned broadcast to every token in the paper's
    GSPO-token form: log s_it = sg[log s_i] + logprobs_t - sg[logprobs_t]. Its value is log s_i
    on every token; its gradient is s_i * grad log pi(y_t), which for an advantage that is
    constant over the sequence sums to exactly GSPO's gradient, and which also accepts
    per-token (turn-level) advantages. A sequence with no masked token gets 0.
    """
    mask = torch.ones_like(logprobs) if loss_mask is None else loss_mask.to(logprobs.dtype)  # [B, T]
    log_ratio = logprobs - old_logprobs.detach()  # [B, T]
    per_sequence = (log_ratio * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)  # [B, 1]
    return per_sequence.detach() + (logprobs - logprobs.detach())  # [B, T], value exactly log s_i


SURROGATE_STATS = ("clip_fraction", "clip_low_fraction", "clip_high_fraction", "dual_clip_fraction", "ratio_mean", "ratio_max")
"""The stats `clipped_surrogate` returns (both ratio levels): means over the masked tokens, and
`ratio_max` a maximum. The trainer logs each under its name."""


def clipped_surrogate(
    log_ratio: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    *,
    dual_clip: float | None = None,
    loss_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token negated clipped surrogate objective (to minimise), given any log ratio.

    PPO (arXiv 1707.06347, eq. 7):
        ratio = exp(log_ratio)
        loss  = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
    Separate `clip_low` / `clip_high` is DAPO's clip-higher (arXiv 2503.14476, section 3.1,
    0.2 / 0.28). `dual_clip = c > 1` is dual-clip PPO (Ye et al., arXiv 1912.09729):
    for A < 0 the loss is also capped at -c * A, so a token whose ratio has run far past
    1 + clip_high cannot produce an unbounded loss; its gradient is then 0. (TRL calls the
    same cap `delta`, after INTELLECT-2, arXiv 2505.07291.)

    log_ratio [B, T]; advantages [B] (broadcast over tokens) or [B, T] (turn-level credit).
    `loss_mask` [B, T] is used only for the stats; masking the loss is `aggregate_loss`'s job.

    Stats (detached floats, means over masked tokens): `clip_fraction` where the clipped
    term was the one chosen (its gradient is zero), split into `clip_low_fraction`
    (ratio < 1 - clip_low, A < 0) and `clip_high_fraction` (ratio > 1 + clip_high, A > 0);
    `dual_clip_fraction` (A < 0, ratio > c); `ratio_mean`, `ratio_max`.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (it caps the loss at -dual_clip * A for A < 0), got {dual_clip}")
    advantages = advantages.detach()
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # [B, T]
    per_token = -torch.min(ratio * advantages, clipped_ratio * advantages)  # [B, T]
    if dual_clip is not None:
        capped = torch.minimum(per_token, -dual_clip * advantages)  # [B, T]
        per_token = torch.where(advantages < 0, capped, per_token)  # [B, T]

    with torch.no_grad():
        mask = torch.ones_like(ratio) if loss_mask is None else loss_mask.to(ratio.dtype)  # [B, T]
        clipped_low = (ratio < 1.0 - clip_low) & (advantages < 0)  # [B, T]
        clipped_high = (ratio > 1.0 + clip_high) & (advantages > 0)  # [B, T]
        dual_clipped = (ratio > (dual_clip or float("inf"))) & (advantages < 0)  # [B, T], none when off
        masked_ratio = torch.where(mask > 0, ratio, torch.zeros_like(ratio))  # [B, T]
        stats = {  # SURROGATE_STATS
            "clip_fraction": _masked_mean((clipped_low | clipped_high).to(ratio.dtype), mask).item(),
            "clip_low_fraction": _masked_mean(clipped_low.to(ratio.dtype), mask).item(),
            "clip_high_fraction": _masked_mean(clipped_high.to(ratio.dtype), mask).item(),
            "dual_clip_fraction": _masked_mean(dual_clipped.to(ratio.dtype), mask).item(),
            "ratio_mean": _masked_mean(ratio, mask).item(),
            "ratio_max": masked_ratio.max().item() if mask.any() else 0.0,
        }
    return per_token, stats


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    *,
    loss_mask: Tensor | None = None,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token PPO-clip loss with token-level importance ratios.   logprobs [B, T] -> [B, T]

    PPO (arXiv 1707.06347) as used by GRPO (arXiv 2402.03300), DAPO clip-higher
    (arXiv 2503.14476) and optional dual-clip (arXiv 1912.09729): `clipped_surrogate` on
    `token_log_ratio`. advantages [B] or [B, T]. Stats as `clipped_surrogate`.
    """
    log_ratio = token_log_ratio(logprobs, old_logprobs)  # [B, T]
    return clipped_surrogate(log_ratio, advantages, clip_low, clip_high, dual_clip=dual_clip, loss_mask=loss_mask)


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    *,
    loss_mask: Tensor | None = None,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO loss: the clipped surrogate on the sequence-level ratio.   logprobs [B, T] -> [B, T]

    GSPO (Zheng et al., arXiv 2507.18071): `clipped_surrogate` on
    `sequence_log_ratio`, so each response is clipped as a whole. Because s_i is a
    length-normalised (geometric-mean) ratio it stays near 1, and the paper clips it
    tightly: 3e-4 below, 4e-4 above (the defaults here). Pass `loss_mask` [B, T]: it says
    which tokens the sequence ratio averages over (None averages over every position).
    The paper aggregates per sequence: use "seq_mean_token_mean".
    """
    log_ratio = sequence_log_ratio(logprobs, old_logprobs, loss_mask)  # [B, T]
    return clipped_surrogate(log_ratio, advantages, clip_low, clip_high, dual_clip=dual_clip, loss_mask=loss_mask)


PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, dict[str, float]]]
"""(logprobs [B, T], old_logprobs [B, T], advantages [B] or [B, T], loss_mask [B, T]) -> per-token loss [B, T], stats."""


@dataclass(frozen=True)
class TokenClip:
    """The ratio level "token": PPO-clip on each token's own ratio (`ppo_clip_loss`), with the
    clipped surrogate's constants, which the level "sequence" shares."""

    clip_low: NonNegative = 0.2
    """PPO clip below 1 (ratio >= 1 - clip_low)."""
    clip_high: NonNegative = 0.28
    """PPO clip above 1 (ratio <= 1 + clip_high); above clip_low is DAPO's clip-higher."""
    dual_clip: AboveOne | None = None
    """Dual-clip constant c > 1: for negative advantages the loss is capped at -c * A; None is off."""
    loss: ClassVar[Callable[..., tuple[Tensor, dict[str, float]]]] = staticmethod(ppo_clip_loss)
    """The loss this level computes at these constants."""

    def __call__(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        return self.loss(
            logprobs, old_logprobs, advantages, self.clip_low, self.clip_high, loss_mask=loss_mask, dual_clip=self.dual_clip
        )  # [B, T], stats


@dataclass(frozen=True)
class SequenceClip(TokenClip):
    """The ratio level "sequence": GSPO's length-normalised sequence ratio (`gspo_loss`), with
    the constants of "token" (GSPO's own 3e-4 / 4e-4 come with the gspo preset)."""

    loss: ClassVar[Callable[..., tuple[Tensor, dict[str, float]]]] = staticmethod(gspo_loss)


POLICY_LOSSES: dict[str, type[TokenClip]] = {
    "token": TokenClip,
    "sequence": SequenceClip,
}
"""Importance-ratio level by config name (`ratio_level`): token-level PPO-clip or GSPO's sequence
level, each a dataclass of its constants called as a PolicyLoss."""


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


def seq_mean_token_sum_norm(
    per_token: Tensor, loss_mask: Tensor, total_tokens: float, total_sequences: float, norm_length: float | None = None
) -> Tensor:
    """Sum of masked token losses / (total sequences * a CONSTANT length), the Dr. GRPO aggregation.

    Dr. GRPO (arXiv 2503.20783): dividing each sequence by its own length
    |o_i| makes short right answers and long wrong answers weigh more per token, so it
    divides by a constant instead, the generation budget (TRL: max_completion_length; verl:
    "seq-mean-token-sum-norm"). Pass `norm_length` = that budget (the trainer's max_tokens).
    With None it falls back to the width of `loss_mask`, which is verl's behaviour and is a
    constant only when every micro-batch is padded to the same width.
    """
    mask = loss_mask.to(per_token.dtype)  # [B, T]
    length = float(loss_mask.shape[1]) if norm_length is None else float(norm_length)
    if length <= 0:
        raise ValueError(f"norm_length must be > 0, got {norm_length}")
    return (per_token * mask).sum() / (total_sequences * length)  # []


Aggregation = Callable[[Tensor, Tensor, float, float], Tensor]
"""(per_token [B, T], loss_mask [B, T], total_tokens, total_sequences) -> []"""


@dataclass(frozen=True)
class SeqMeanTokenSumNorm:
    """The aggregation "seq_mean_token_sum_norm": Dr. GRPO's (`seq_mean_token_sum_norm`) over its constant length."""

    loss_norm_length: Length | None = None
    """The constant length of Dr.GRPO's aggregation (seq_mean_token_sum_norm); None:
    rollout.max_tokens, written into the resolved config."""

    def __call__(self, per_token: Tensor, loss_mask: Tensor, total_tokens: float, total_sequences: float) -> Tensor:
        return seq_mean_token_sum_norm(per_token, loss_mask, total_tokens, total_sequences, self.loss_norm_length)


AGGREGATIONS: dict[str, Aggregation | type[SeqMeanTokenSumNorm]] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum_norm": SeqMeanTokenSumNorm,
}
"""Token aggregation by config name (`aggregation`): an Aggregation, or a dataclass of its constants called as one."""


def aggregate_loss(
    per_token: Tensor,
    loss_mask: Tensor,
    mode: str,
    total_tokens: float,
    total_sequences: float,
    *,
    norm_length: float | None = None,
) -> Tensor:
    """Reduce a per-token loss [B, T] to a scalar with the aggregation named `mode` (see AGGREGATIONS).

    `total_tokens` (masked tokens) and `total_sequences` count the WHOLE batch, not this
    micro-batch, so summing the values of micro-batches gives the full-batch value and
    gradient accumulation needs no rescaling. Modes: "token_mean" (DAPO, arXiv 2503.14476),
    "seq_mean_token_mean" (GRPO, arXiv 2402.03300), "seq_mean_token_sum_norm" (Dr. GRPO,
    arXiv 2503.20783; pass `norm_length`, the generation budget).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid modes: {sorted(AGGREGATIONS)}")
    aggregation = configured(AGGREGATIONS[mode], {"loss_norm_length": norm_length})
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


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k1 estimate of KL(pi || ref): log pi - log ref = lp - ref.   [B, T]

    Schulman, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html): unbiased
    but high-variance and negative on some samples. As a LOSS its gradient, grad log pi, has
    expectation 0 under pi: on-policy it does not pull toward ref (Tang & Munos,
    arXiv 2506.09477); it is the estimator PPO-RLHF and REINFORCE++ put in the reward.
    """
    return logprobs - ref_logprobs  # [B, T]


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k2 estimate of KL(pi || ref): 0.5 * (lp - ref)^2, always >= 0.   [B, T]

    Schulman, "Approximating KL Divergence": biased but low-variance. As a loss its gradient
    (lp - ref) * grad log pi is, on-policy, the exact gradient of KL(pi || ref) (arXiv
    2506.09477), which is why REINFORCE++ recommends it as its KL loss.
    """
    return 0.5 * (logprobs - ref_logprobs).square()  # [B, T]


KLEstimator = Callable[[Tensor, Tensor], Tensor]

KL_ESTIMATORS: dict[str, KLEstimator] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}
"""KL(pi || ref) per token by config name (`kl_estimator`): (logprobs [B, T], ref_logprobs [B, T]) -> [B, T]."""


def widened(logits: Tensor) -> Tensor:
    """Logits in float32, or as they are when wider (a float64 model keeps its precision):
    the precision every log-softmax of the objective is taken in."""
    return logits if logits.dtype == torch.float64 else logits.float()


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last dim, per token: H = -sum_v p_v log p_v.

    Computed in float32 (`widened`) from log_softmax (logsumexp-stable); tokens with logit -inf
    (p = 0) contribute 0, not NaN. Entropy as a training signal: DAPO (arXiv 2503.14476).
    """
    logp = torch.log_softmax(widened(logits), dim=-1)  # [B, T, V]
    p_logp = torch.where(logp.isneginf(), torch.zeros_like(logp), logp.exp() * logp)  # [B, T, V]
    return -p_logp.sum(dim=-1)  # [B, T]


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """Log-probability of each target token: log_softmax(logits)[b, t, targets[b, t]], in float32 (`widened`).

    Gathers the target logit and subtracts the logsumexp, so no [B, T, V] log-softmax is
    kept. Used for the policy-ratio terms of PPO / GRPO (arXiv 1707.06347, 2402.03300).
    `logits[:, t]` must already be the prediction for `targets[:, t]` (shift beforehand).
    """
    logits = widened(logits)  # [B, T, V]
    target_logits = logits.gather(dim=-1, index=targets.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return target_logits - torch.logsumexp(logits, dim=-1)  # [B, T]


def at_temperature(logits: Tensor, temperature: float) -> Tensor:
    """Logits divided by the sampling temperature; temperature <= 0 (greedy) leaves them as at 1."""
    return logits / temperature if temperature > 0 and temperature != 1.0 else logits


def chunked_token_logprobs(
    hidden: Tensor, head: Callable[[Tensor], Tensor], targets: Tensor, chunk: int, temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """`token_logprobs(head(hidden) / temperature, targets)` (and the detached entropy), `chunk`
    positions at a time, so no more than `chunk` positions of logits ([chunk, V], the largest
    tensor of an update for a real vocabulary) exist at once, in the forward or the backward.

    hidden: [N, H] the final hidden state at each position; targets: [N]. Returns [N] (and [N]).
    With gradients on, each chunk is recomputed in the backward pass (activation checkpointing)
    instead of keeping its logits: the same gradients, one more pass of `head` per position.
    temperature <= 0 means greedy sampling, whose log-probs are reported at temperature 1.
    """

    def piece(h: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        logits = at_temperature(widened(head(h)), temperature)  # [c, V]
        entropy = entropy_from_logits(logits.detach()) if with_entropy else logits.new_zeros(0)  # [c] or []
        return token_logprobs(logits, t), entropy  # [c], [c]

    pieces = checkpointed_chunks(piece, chunk, hidden, targets)
    if not pieces:  # no position at all
        empty = widened(hidden.new_zeros(0))
        return empty, empty if with_entropy else None
    return torch.cat([lp for lp, _ in pieces]), torch.cat([ent for _, ent in pieces]) if with_entropy else None


def checkpointed_chunks(piece: Callable[..., Any], chunk: int, *inputs: Tensor) -> list[Any]:
    """piece(*rows) on `chunk` rows of every input at a time, in order: the list of its outputs.
    When the first input needs a gradient, each chunk is recomputed in the backward pass
    (activation checkpointing) instead of keeping what `piece` made inside it."""
    from torch.utils.checkpoint import checkpoint

    out = []
    for start in range(0, inputs[0].shape[0], chunk):
        rows = [x[start : start + chunk] for x in inputs]
        out.append(checkpoint(piece, *rows, use_reentrant=False) if torch.is_grad_enabled() and rows[0].requires_grad else piece(*rows))
    return out
