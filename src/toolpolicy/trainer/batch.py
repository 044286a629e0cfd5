"""From trajectories to padded tensors, and from a model to per-token log-probabilities."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from toolpolicy.algorithms import chunked_token_logprobs
from toolpolicy.model.adapters import reference_mode
from toolpolicy.model.placement import device_of
from toolpolicy.model.vision import VisionInput, WithoutIds, pixels_for, unsampled_ids, without_ids
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
    pixels:       [N, 3, S, S] the pictures the rows show, row by row in order of position
                            (a vision-language model's pixel_values), or None
    pixel_at:     [N, 3]    each picture's row, the position of its first placeholder, and
                            a key equal for equal pictures (prompts are shared by ids and pictures)
    """

    input_ids: torch.Tensor
    attention: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    prompt_lens: torch.Tensor
    pixels: torch.Tensor | None = None
    pixel_at: torch.Tensor | None = None

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(*(tensor.to(device) if tensor is not None else None for tensor in self))

    def rows(self, start: int, end: int, width: int) -> TokenBatch:
        """Rows [start, end) cut to `width` positions, with their pictures."""
        pixels, pixel_at = self.pixels, self.pixel_at
        if pixel_at is not None:
            mine = (pixel_at[:, 0] >= start) & (pixel_at[:, 0] < end)  # [N]
            pixels, pixel_at = pixels[mine], pixel_at[mine] - torch.tensor([start, 0, 0], device=pixel_at.device)
        return TokenBatch(
            self.input_ids[start:end, :width], self.attention[start:end, :width], self.targets[start:end, : width - 1],
            self.loss_mask[start:end, : width - 1], self.old_logprobs[start:end, : width - 1], self.prompt_lens[start:end],
            pixels, pixel_at,
        )

    def pixel_values(self, where: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The forward's keyword for the pictures (those `where` [N] selects, in order): empty
        for a batch without any, so a text-only model is called as it always was."""
        if self.pixels is None:
            return {}
        pixels = self.pixels if where is None else self.pixels[where]
        return {"pixel_values": pixels} if pixels.shape[0] else {}


def collate(trajectories: list[Trajectory], pad_id: int, vision: VisionInput | None = None) -> TokenBatch:
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
    pixels, pixel_at = pictures(trajectories, vision)
    return TokenBatch(input_ids, attention, input_ids[:, 1:], mask[:, 1:], logprobs[:, 1:], prompt_lens, pixels, pixel_at)


def pictures(trajectories: list[Trajectory], vision: VisionInput | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The rows' pictures as `TokenBatch.pixels` and `pixel_at` (None, None when there are none)."""
    placed = [(row, position, image) for row, t in enumerate(trajectories) for position, image in t.images]
    if not placed:
        return None, None
    keys: dict[bytes, int] = {}
    at = torch.tensor([[row, position, keys.setdefault(image.png, len(keys))] for row, position, image in placed])  # [N, 3]
    return pixels_for(vision, [image for _, _, image in placed]), at


def micro_batches(batch: TokenBatch, size: int, max_tokens: int | None = None) -> list[tuple[slice, TokenBatch]]:
    """Split along the batch dimension into pieces of at most `size` rows and at most
    `max_tokens` positions (rows x the piece's longest row; a row longer than that alone),
    trimming each piece's padding; each piece comes with the slice of the batch it covers
    (to pick its advantages)."""
    lengths = batch.attention.sum(-1).tolist()  # [B]
    bounds = [0]
    widest = 0
    for row, length in enumerate(lengths):
        wider = max(widest, length)
        rows = row - bounds[-1]
        if rows and (rows == size or (max_tokens is not None and (rows + 1) * wider > max_tokens)):
            bounds.append(row)
            wider = length
        widest = wider
    pieces = []
    for start, end in zip(bounds, bounds[1:] + [len(lengths)]):
        rows = slice(start, end)
        pieces.append((rows, batch.rows(start, end, int(max(lengths[rows])))))
    return pieces


Lockstep = Callable[[int], int]
"""This rank's micro-batches of an optimizer step -> the forward and backward passes it runs:
as many (`own_count`), or under sharding as many as the rank with the most, since each pass
of a sharded model is a collective (the extra ones are `padding_passes`)."""


def own_count(count: int) -> int:
    return count


def padding_piece(pad_id: int) -> TokenBatch:
    """One row of two pad tokens, the second trained on: the micro-batch of `padding_passes`."""
    ids = torch.tensor([[pad_id, pad_id]])  # [1, 2]
    return TokenBatch(ids, torch.ones_like(ids), ids[:, 1:], torch.ones(1, 1), torch.zeros(1, 1), torch.tensor([1]))


def padding_passes(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    count: int,
    lockstep: Lockstep,
    pad_id: int,
    recompute: Recompute,
    temperature: float = 1.0,
    backward: bool = True,
) -> None:
    """The passes that bring this rank's `count` micro-batches up to `lockstep(count)`: each the
    forward passes of a `padding_piece` (policy and reference) and, with `backward`, a backward
    pass whose loss is multiplied by 0: a sharded model's collectives, and no change to any gradient."""
    extra = lockstep(count) - count
    if extra <= 0:
        return
    piece = padding_piece(pad_id).to(device_of(model))
    for _ in range(extra):
        logprobs, _ = recompute.logprobs(model, piece, temperature)  # [1, 1]
        if reference is not None:
            with torch.no_grad(), reference_mode(reference):
                recompute.logprobs(reference, piece, temperature)
        if backward:
            (logprobs.sum() * 0.0).backward()


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
    """Tokens of the batch's distinct prompts (distinct as `shared_prompt_logprobs` runs them:
    by their ids and the pictures in them)."""
    return sum(len(ids) for ids, _ in set(_prompt_keys(batch, _in_prompt(batch))))


LOGIT_CHUNK_BYTES = 2**25
"""Logits the trainer holds at once, at most (float32 [positions, V]; the backward pass holds a
few such tensors): 32 MiB is 170 positions of a 49,152-token vocabulary, 8,192 of the embedded
model's 1,024."""
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "lm_head_multiplier")
"""Config fields of models whose logits are not the head's output alone (Gemma 2's soft-capping,
Cohere's and Granite's scaling, Falcon-H1's multiplier): their log-probs come from their own forward."""


def forward_logprobs(
    model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the targets under `model` (at the sampling temperature), and
    optionally the per-token entropy (detached). Shapes [B, L-1], on the model's device.

    Only trained positions (loss_mask 1) get logits: the decoder runs once over the batch and
    its final hidden states at those positions go through the output head a chunk at a time
    (`chunked_token_logprobs`), so [B, L, V] never exists; every other position holds 0 in
    both outputs. Models with a logit transform after the head (LOGIT_TRANSFORMS) get their
    logits at the trained positions from their own forward instead."""
    batch = batch.to(next(model.parameters()).device)  # no copy when the caller moved it already
    trained = batch.loss_mask.bool()  # [B, L-1]
    states, head = trained_states(model, batch)
    values = chunked_token_logprobs(states, head, batch.targets[trained], logit_chunk(model), temperature, with_entropy)
    return placed_logprobs(values, trained)


def trained_states(model: torch.nn.Module, batch: TokenBatch) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The decoder's final hidden states at the trained positions of `batch` (loss_mask 1,
    row-major), [N, H], and the head that turns them into logits; for a model with a logit
    transform after its head (LOGIT_TRANSFORMS), its own logits there, [N, V], and the identity."""
    trained = batch.loss_mask.bool()  # [B, L-1]
    parts = decoder_and_head(model)
    if parts is None:
        keep = torch.nn.functional.pad(trained, (0, 1))  # [B, L]: the logits at t predict token t+1
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention, logits_to_keep=keep, **batch.pixel_values()).logits  # [N, V]
        return without_ids(logits, unsampled_ids(model)), torch.nn.Identity()
    decoder, head = parts
    return decoder(input_ids=batch.input_ids, attention_mask=batch.attention, **batch.pixel_values()).last_hidden_state[:, :-1][trained], head  # [N, H]


def placed_logprobs(values: tuple[torch.Tensor, torch.Tensor | None], trained: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position values [N] (and [N]) of the trained positions, put back in their [B, L-1] layout (0 elsewhere)."""
    logprobs, entropy = values
    return placed(logprobs, trained), None if entropy is None else placed(entropy, trained)


def placed(values: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """Values [N] of the trained positions (row-major), put in their [B, L-1] layout, 0 elsewhere."""
    return values.new_zeros(trained.shape).masked_scatter(trained, values)  # [B, L-1]


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """The model's decoder stack and its output head, when its logits are exactly
    head(decoder(...).last_hidden_state) (a peft model's base; `place` runs both in the
    compute dtype), else None."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = core.config.get_text_config() if hasattr(core.config, "get_text_config") else core.config
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in LOGIT_TRANSFORMS):
        return None
    head = core.get_output_embeddings() if hasattr(core, "get_output_embeddings") else None
    decoder = getattr(core, "base_model", None)
    if head is None or decoder is None or decoder is core:
        return None
    never = unsampled_ids(core)
    return decoder, WithoutIds(head, never) if never else head


def logit_chunk(model: torch.nn.Module) -> int:
    """Positions whose float32 logits fit in LOGIT_CHUNK_BYTES for this model's vocabulary."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return max(1, LOGIT_CHUNK_BYTES // (4 * config.vocab_size))


def shared_prompt_logprobs(
    model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`forward_logprobs`, with each distinct prompt run once.

    A group's episodes share their prompt: it is run once (left-padded with the other
    distinct prompts), its KV cache, with its gradient, handed to every row of the prompt,
    and only the responses run per row, attending to it. The log-probability of a row's
    first response token comes from its prompt's last position. Same layout and values as
    `forward_logprobs` (to float rounding): only trained positions get logits, the rest
    are 0. Needs a model that returns its KV cache (not with gradient checkpointing).
    """
    parts = decoder_and_head(model)
    if parts is None:
        return forward_logprobs(model, batch, temperature, with_entropy)
    decoder, head = parts
    batch = batch.to(next(model.parameters()).device)
    device = batch.input_ids.device
    lengths = batch.attention.sum(-1)  # [B]
    prompt_lens = batch.prompt_lens  # [B]
    in_prompt = _in_prompt(batch)  # [N] or None
    distinct: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}  # (prompt ids, its pictures' keys) -> index
    first: dict[int, int] = {}  # distinct prompt -> the first row that has it
    keys = _prompt_keys(batch, in_prompt)
    for b, key in enumerate(keys):
        first.setdefault(distinct.setdefault(key, len(distinct)), b)
    source = torch.tensor([distinct[key] for key in keys], device=device)  # [B] -> distinct prompt
    prompt_ids, prompt_attention, positions = left_padded([list(ids) for ids, _ in distinct], 0, device)  # [U, P] each
    cache_name = cache_argument(model)
    prompt_pictures = None if in_prompt is None else _rows_pictures(batch.pixel_at, in_prompt, list(first.values()))
    shared = decoder(
        input_ids=prompt_ids, attention_mask=prompt_attention, position_ids=positions, use_cache=True,
        **batch.pixel_values(prompt_pictures),
    )
    cache = getattr(shared, cache_name)
    cache.batch_select_indices(source)  # every row gets its prompt's keys and values, gradients kept

    # Responses, right-padded: row b's tokens from its prompt's end.   [B, R]
    span = int((lengths - prompt_lens).max())
    offsets = torch.arange(span, device=device)  # [R]
    inside = offsets[None, :] < (lengths - prompt_lens)[:, None]  # [B, R]
    columns = (prompt_lens[:, None] + offsets[None, :]).clamp(max=batch.input_ids.shape[1] - 1)  # [B, R]
    response_ids = torch.where(inside, batch.input_ids.gather(1, columns), 0)  # [B, R]
    attention = torch.cat([prompt_attention[source], inside.long()], dim=-1)  # [B, P + R]
    out = decoder(
        input_ids=response_ids, attention_mask=attention, position_ids=prompt_lens[:, None] + offsets[None, :],
        use_cache=True, **{cache_name: cache}, **batch.pixel_values(None if in_prompt is None else ~in_prompt),
    )
    # hidden[b, j] predicts response token j of row b: j = 0 from the prompt's last position.
    hidden = torch.cat([shared.last_hidden_state[source, -1:], out.last_hidden_state[:, :-1]], dim=1)  # [B, R, H]
    # Response token j of row b is target index prompt_lens[b] - 1 + j of the batch's layout.
    targets_at = (prompt_lens[:, None] - 1 + offsets[None, :]).clamp(max=batch.targets.shape[1] - 1)  # [B, R]
    trained = inside & batch.loss_mask.gather(1, targets_at).bool()  # [B, R]
    logprobs, entropy = chunked_token_logprobs(
        hidden[trained], head, response_ids[trained], logit_chunk(model), temperature, with_entropy
    )  # [N] each
    b_index, j_index = torch.nonzero(trained, as_tuple=True)  # row-major, as the [N] values
    t_index = prompt_lens[b_index] - 1 + j_index
    shape = batch.targets.shape  # [B, L-1]
    out_logprobs = logprobs.new_zeros(shape).index_put((b_index, t_index), logprobs)
    out_entropy = None if entropy is None else entropy.new_zeros(shape).index_put((b_index, t_index), entropy)
    return out_logprobs, out_entropy


def _in_prompt(batch: TokenBatch) -> torch.Tensor | None:
    """[N] bool: which of the batch's pictures are in their row's prompt (None: no pictures)."""
    return None if batch.pixel_at is None else batch.pixel_at[:, 1] < batch.prompt_lens[batch.pixel_at[:, 0]]


def _prompt_keys(batch: TokenBatch, in_prompt: torch.Tensor | None) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each row's prompt: its ids and the keys of the pictures in it."""
    keys = []
    for b in range(batch.input_ids.shape[0]):
        shown = () if in_prompt is None else tuple(batch.pixel_at[in_prompt & (batch.pixel_at[:, 0] == b), 2].tolist())
        keys.append((tuple(batch.input_ids[b, : int(batch.prompt_lens[b])].tolist()), shown))
    return keys


def _rows_pictures(pixel_at: torch.Tensor, among: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Indices of the pictures `among` selects that belong to `rows`, row by row in that order.   -> [n]"""
    return torch.cat([torch.nonzero(among & (pixel_at[:, 0] == row)).flatten() for row in rows])


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
