"""From trajectories to padded tensors, and from a model to per-token log-probabilities."""

from __future__ import annotations

from typing import NamedTuple

import torch

from toolpolicy.algorithms import entropy_from_logits, token_logprobs
from toolpolicy.rollout import Trajectory


class TokenBatch(NamedTuple):
    """Right-padded trajectories, already shifted so position t predicts token t+1.

    input_ids:    [B, L]    all tokens
    attention:    [B, L]    1 on real tokens
    targets:      [B, L-1]  input_ids[:, 1:]
    loss_mask:    [B, L-1]  1 where the target token was sampled by the policy
    old_logprobs: [B, L-1]  rollout log-probabilities of the targets (0 where masked)
    """

    input_ids: torch.Tensor
    attention: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(*(tensor.to(device) for tensor in self))


def collate(trajectories: list[Trajectory], pad_id: int) -> TokenBatch:
    width = max(len(t.token_ids) for t in trajectories)
    batch = len(trajectories)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)  # [B, L]
    attention = torch.zeros((batch, width), dtype=torch.long)  # [B, L]
    mask = torch.zeros((batch, width), dtype=torch.float32)  # [B, L]
    logprobs = torch.zeros((batch, width), dtype=torch.float32)  # [B, L]
    for row, t in enumerate(trajectories):
        n = len(t.token_ids)
        input_ids[row, :n] = torch.tensor(t.token_ids)
        attention[row, :n] = 1
        mask[row, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        logprobs[row, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
    return TokenBatch(input_ids, attention, input_ids[:, 1:], mask[:, 1:], logprobs[:, 1:])


def micro_batches(batch: TokenBatch, size: int) -> list[tuple[slice, TokenBatch]]:
    """Split along the batch dimension, trimming each piece's padding; each piece comes
    with the slice of the batch it covers (to pick its advantages)."""
    pieces = []
    for start in range(0, batch.input_ids.shape[0], size):
        rows = slice(start, start + size)
        width = int(batch.attention[rows].sum(-1).max())
        pieces.append((rows, TokenBatch(
            input_ids=batch.input_ids[rows, :width],
            attention=batch.attention[rows, :width],
            targets=batch.targets[rows, : width - 1],
            loss_mask=batch.loss_mask[rows, : width - 1],
            old_logprobs=batch.old_logprobs[rows, : width - 1],
        )))
    return pieces


def forward_logprobs(
    model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the targets under `model` (at the sampling temperature), and
    optionally the per-token entropy (detached). Shapes [B, L-1], on the model's device."""
    batch = batch.to(next(model.parameters()).device)  # no copy when the caller moved it already
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention).logits[:, :-1].float()  # [B, L-1, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logprobs = token_logprobs(logits, batch.targets)  # [B, L-1]
    entropy = entropy_from_logits(logits.detach()) if with_entropy else None  # [B, L-1]
    return logprobs, entropy
