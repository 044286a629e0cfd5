"""From trajectories to padded tensors, and from a model to per-token log-probabilities."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from toolpolicy.algorithms import entropy_from_logits, token_logprobs
from toolpolicy.rollout import Trajectory
from toolpolicy.rollout.kv_cache import cache_argument, left_padded


class TokenBatch(NamedTuple):
    """Right-padded trajectories, already shifted so position t predicts token t+1.

    input_ids:    [B, L]    all tokens
    attention:    [B, L]    1 on real tokens
    targets:      [B, L-1]  input_ids[:, 1:]
    loss_mask:    [B, L-1]  1 where the target token was sampled by the policy
    old_logprobs: [B, L-1]  rollout log-probabilities of the targets (0 where masked)
    prompt_lens:  [B]       tokens of each row's prompt (nothing in it is trained)
    """

    input_ids: torch.Tensor
    attention: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    prompt_lens: torch.Tensor

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
    prompt_lens = torch.tensor([t.prompt_len for t in trajectories])
    return TokenBatch(input_ids, attention, input_ids[:, 1:], mask[:, 1:], logprobs[:, 1:], prompt_lens)


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
            prompt_lens=batch.prompt_lens[rows],
        )))
    return pieces


def update_order(group_order: list[int], trajectories: list[Trajectory], size: int) -> list[int]:
    """The order in which the update runs the episodes `group_order` lists (kept, group by
    group): as given, or sorted by response length, whichever runs fewer positions in
    micro-batches of `size` rows. Group by group, a micro-batch runs few distinct prompts;
    by length, each row is padded less (one long multi-turn episode pads its micro-batch's
    every row to its length). Gradients are the same either way (to float rounding)."""
    by_length = sorted(group_order, key=lambda i: len(trajectories[i].token_ids) - trajectories[i].prompt_len)
    return min((group_order, by_length), key=lambda order: update_positions([trajectories[i] for i in order], size))


def update_positions(rows: list[Trajectory], size: int) -> int:
    """Positions the shared-prompt update runs on `rows` in this order, `size` rows a
    micro-batch: each micro-batch's distinct prompts once, and every row padded to its
    micro-batch's longest response."""
    total = 0
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        prompts = {tuple(t.token_ids[: t.prompt_len]) for t in chunk}
        total += sum(map(len, prompts)) + len(chunk) * max(len(t.token_ids) - t.prompt_len for t in chunk)
    return total


LogProbs = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
"""(model, batch, temperature, with_entropy=False) -> (log-probs [B, L-1], entropy or None)."""


def distinct_prompt_tokens(batch: TokenBatch) -> int:
    """Tokens of the batch's distinct prompts."""
    prompts = {tuple(batch.input_ids[b, : int(n)].tolist()) for b, n in enumerate(batch.prompt_lens)}
    return sum(map(len, prompts))


def forward_logprobs(
    model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the targets under `model` (at the sampling temperature), and
    optionally the per-token entropy (detached). Shapes [B, L-1], on the model's device.

    The logits (B x positions x vocabulary: the largest tensor of the update for a real
    vocabulary) are computed from the first position any row trains on (the model's own
    `logits_to_keep`, so its own head and any logit scaling apply); the positions before it,
    a prompt no row trains on, hold 0 in both outputs."""
    batch = batch.to(next(model.parameters()).device)  # no copy when the caller moved it already
    skip = untrained_head(batch.loss_mask) if keeps_logits(model) else 0
    tail = {"logits_to_keep": batch.input_ids.shape[1] - skip} if skip else {}
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention, **tail).logits[:, :-1].float()  # [B, L-1-skip, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logprobs = torch.nn.functional.pad(token_logprobs(logits, batch.targets[:, skip:]), (skip, 0))  # [B, L-1]
    entropy = torch.nn.functional.pad(entropy_from_logits(logits.detach()), (skip, 0)) if with_entropy else None  # [B, L-1]
    return logprobs, entropy


def untrained_head(loss_mask: torch.Tensor) -> int:
    """How many leading target positions no row of the batch trains on (all of them when none does)."""
    trained = loss_mask.bool().any(0)  # [L-1]
    return int(trained.int().argmax()) if bool(trained.any()) else trained.shape[0]


def keeps_logits(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs; a peft model's base)."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(core.forward).parameters


def shared_prompt_logprobs(
    model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`forward_logprobs`, with each distinct prompt run once.

    A group's episodes share their prompt: it is run once (left-padded with the other
    distinct prompts), its KV cache, with its gradient, handed to every row of the prompt,
    and only the responses run per row, attending to it. The log-probability of a row's
    first response token comes from its prompt's last position. Same layout and values as
    `forward_logprobs` (to float rounding); positions inside the prompt, which are never
    trained, are 0. Needs a model that returns its KV cache (not with gradient checkpointing).
    """
    batch = batch.to(next(model.parameters()).device)
    device = batch.input_ids.device
    rows = batch.input_ids.shape[0]
    lengths = batch.attention.sum(-1)  # [B]
    prompt_lens = batch.prompt_lens  # [B]
    distinct: dict[tuple[int, ...], int] = {}
    source = torch.tensor(
        [distinct.setdefault(tuple(batch.input_ids[b, : int(prompt_lens[b])].tolist()), len(distinct)) for b in range(rows)],
        device=device,
    )  # [B] -> distinct prompt
    prompt_ids, prompt_attention, positions = left_padded([list(p) for p in distinct], 0, device)  # [U, P] each
    cache_name = cache_argument(model)
    shared = model(input_ids=prompt_ids, attention_mask=prompt_attention, position_ids=positions, use_cache=True)
    cache = getattr(shared, cache_name)
    cache.batch_select_indices(source)  # every row gets its prompt's keys and values, gradients kept

    # Responses, right-padded: row b's tokens from its prompt's end.   [B, R]
    span = int((lengths - prompt_lens).max())
    offsets = torch.arange(span, device=device)  # [R]
    inside = offsets[None, :] < (lengths - prompt_lens)[:, None]  # [B, R]
    columns = (prompt_lens[:, None] + offsets[None, :]).clamp(max=batch.input_ids.shape[1] - 1)  # [B, R]
    response_ids = torch.where(inside, batch.input_ids.gather(1, columns), 0)  # [B, R]
    attention = torch.cat([prompt_attention[source], inside.long()], dim=-1)  # [B, P + R]
    out = model(
        input_ids=response_ids, attention_mask=attention, position_ids=prompt_lens[:, None] + offsets[None, :],
        use_cache=True, **{cache_name: cache},
    )
    # logits[b, j] predicts response token j of row b: j = 0 from the prompt's last position.
    logits = torch.cat([shared.logits[source, -1:], out.logits[:, :-1]], dim=1).float()  # [B, R, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    targets = torch.where(inside, response_ids, 0)  # [B, R]
    response_logprobs = token_logprobs(logits, targets)  # [B, R]
    # Back to the batch's layout: response token j of row b is target index prompt_lens[b] - 1 + j.
    b_index, j_index = torch.nonzero(inside, as_tuple=True)
    t_index = prompt_lens[b_index] - 1 + j_index
    shape = batch.targets.shape  # [B, L-1]
    logprobs = torch.zeros(shape, device=device).index_put((b_index, t_index), response_logprobs[b_index, j_index])
    entropy = None
    if with_entropy:
        response_entropy = entropy_from_logits(logits.detach())  # [B, R]
        entropy = torch.zeros(shape, device=device).index_put((b_index, t_index), response_entropy[b_index, j_index])
    return logprobs, entropy


@dataclass(frozen=True)
class Recompute:
    """How the trainer recomputes log-probabilities, and the token positions that runs on a batch."""

    logprobs: LogProbs
    tokens: Callable[[TokenBatch], int]


FULL_SEQUENCES = Recompute(forward_logprobs, lambda batch: int(batch.attention.sum()))
SHARED_PROMPTS = Recompute(
    shared_prompt_logprobs,
    lambda batch: int(batch.attention.sum() - batch.prompt_lens.sum()) + distinct_prompt_tokens(batch),
)
