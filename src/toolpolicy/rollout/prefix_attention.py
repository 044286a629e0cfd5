"""Attention over a prompt that several rows share, read once for all of them.

The episodes of a group start from one prompt, and in a long prompt (BFCL's tool lists:
about 1,100 positions) a decode step's attention is mostly the prompt's keys and values read
again for every row: at batch 32 on SmolLM2-135M, 130 ms of a 240 ms step on an AMD EPYC.
Here a row's cache is its group's prompt, stored once (`SharedPrefix`), and its own
columns after it. The queries of a group's rows attend to their prompt in one product (a
group's rows share a key row, so the kernel reads it once for all of their queries), each
row attends to its own columns, and the two softmaxes are merged by their log-sum-exps:

    out = (e^(l_p - m) o_p + e^(l_s - m) o_s) / (e^(l_p - m) + e^(l_s - m)),  m = max(l_p, l_s)

which is the softmax over the prompt's and the row's columns together (the split of
FlashAttention's online softmax, Dao et al. 2022, used across rows by Hydragen, Juravsky et
al. 2024, arXiv 2402.05099). Both parts run in PyTorch's CPU flash kernel, which returns
the log-sum-exp with the output. The sums are taken in another order than one softmax over
all columns: the numbers agree to rounding, not bit for bit.

`register` adds the attention to transformers under ATTENTION; a forward without a
`shared_prefix` argument is plain SDPA, so the model computes as before everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

ATTENTION = "toolpolicy_shared_prefix"
"""The attention implementation's name in transformers' registry."""


@dataclass(frozen=True)
class SharedPrefix:
    """The prompts a batch's rows share, each stored once.

    keys, values: per layer [G, kv heads, P, head dim], prompt g left-padded to P columns
    attention:    [G, P] 1 where the column holds a real token of prompt g
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    attention: torch.Tensor

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @staticmethod
    def joined(prefixes: list[SharedPrefix]) -> SharedPrefix:
        """One prefix holding the prompts of `prefixes` in order, left-padded to the widest."""
        if len(prefixes) == 1:
            return prefixes[0]
        width = max(p.attention.shape[1] for p in prefixes)
        layers = len(prefixes[0].keys)
        keys, values, attention = [[] for _ in range(layers)], [[] for _ in range(layers)], []
        for p in prefixes:
            missing = width - p.attention.shape[1]
            for layer in range(layers):
                keys[layer].append(torch.nn.functional.pad(p.keys[layer], (0, 0, missing, 0)))  # [G, KV, width, D]
                values[layer].append(torch.nn.functional.pad(p.values[layer], (0, 0, missing, 0)))
            attention.append(torch.nn.functional.pad(p.attention, (missing, 0)))  # [G, width]
        return SharedPrefix(tuple(map(torch.cat, keys)), tuple(map(torch.cat, values)), torch.cat(attention))


@dataclass(frozen=True)
class PrefixRows:
    """What the attention needs to know of a batch's rows: their prompts, and which is whose.

    group: [B] the prompt of each row; slot: [B] its place among the rows of that prompt
    mask:  [G, 1, 1, P] the prompts' padding as the 0 / -inf added to the scores (every layer's)
    """

    prefix: SharedPrefix
    group: torch.Tensor
    slot: torch.Tensor
    slots: int
    """The most rows any prompt has."""
    mask: torch.Tensor

    @staticmethod
    def of(prefix: SharedPrefix, group: torch.Tensor) -> PrefixRows:
        order = torch.argsort(group, stable=True)
        starts = torch.searchsorted(group[order], group[order], right=False)  # [B] first sorted row of each row's prompt
        slot = torch.empty_like(group)
        slot[order] = torch.arange(len(group), device=group.device) - starts
        mask = _additive(prefix.attention.bool()[:, None, None, :], prefix.keys[0].dtype)
        return PrefixRows(prefix, group, slot, int(slot.max()) + 1 if len(group) else 0, mask)


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: attend) as the 0 / -inf the flash kernel adds to the scores."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def causal(steps: int, columns: int, device: torch.device) -> torch.Tensor:
    """[S, L] True where query s (the last S of L columns) may see column l: up to its own."""
    return torch.arange(columns, device=device)[None, :] <= torch.arange(columns - steps, columns, device=device)[:, None]


def merged_softmax(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """The attention over two sets of columns from each set's output [..., D] and log-sum-exp
    [...] (-inf: a set with no column for that query), in float32."""
    top = torch.maximum(lse_a, lse_b)  # [...]
    weight_a, weight_b = torch.exp(lse_a - top), torch.exp(lse_b - top)  # [...]
    return (out_a.float() * weight_a[..., None] + out_b.float() * weight_b[..., None]) / (weight_a + weight_b)[..., None]


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    shared_prefix: PrefixRows | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [B, H, S, D]; key, value [B, KV, L, D], the
    rows' own columns; attention_mask the boolean [B, 1, S, L] of those columns (None: all).
    With `shared_prefix` each row also attends to every column of its prompt, which precedes
    its own. Returns [B, S, H, D]."""
    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    rows, (batch, heads, steps, dim), kv_heads = shared_prefix, query.shape, key.shape[1]
    repeat = heads // kv_heads
    grouped = query.reshape(batch, kv_heads, repeat * steps, dim)  # a key head's queries, (repeat, step) in order
    layer = module.layer_idx
    prompts = rows.prefix.keys[layer].shape[0]
    # The prompt part: each prompt's rows in one block of queries against its keys.
    stacked = grouped.new_zeros(prompts, rows.slots, kv_heads, repeat * steps, dim)
    stacked[rows.group, rows.slot] = grouped
    stacked = stacked.transpose(1, 2).reshape(prompts, kv_heads, rows.slots * repeat * steps, dim)
    out_p, lse_p = _flash(stacked, rows.prefix.keys[layer], rows.prefix.values[layer], 0.0, False, attn_mask=rows.mask, scale=scaling)
    out_p = out_p.reshape(prompts, kv_heads, rows.slots, repeat * steps, dim).transpose(1, 2)[rows.group, rows.slot]
    lse_p = lse_p.reshape(prompts, kv_heads, rows.slots, repeat * steps).transpose(1, 2)[rows.group, rows.slot]
    # The row's own part; a query with none of its own columns (left padding) weighs it 0.
    columns = key.shape[2]
    own = causal(steps, columns, query.device)[None, None] if attention_mask is None else attention_mask  # None: causal, nothing padded
    own = own.expand(batch, 1, steps, columns)
    own_rows = own[:, :, None].expand(batch, 1, repeat, steps, columns).reshape(batch, 1, repeat * steps, columns)
    out_s, lse_s = _flash(grouped, key, value, 0.0, False, attn_mask=_additive(own_rows, query.dtype), scale=scaling)
    lse_s = lse_s.masked_fill(~own_rows.any(-1), float("-inf"))  # the kernel gives 0 for a query with no column
    out = merged_softmax(out_p, lse_p, out_s.nan_to_num(0.0), lse_s)  # [B, KV, repeat * S, D]
    out = out.to(query.dtype).reshape(batch, heads, steps, dim).transpose(1, 2).contiguous()
    return out, None


def shares_prefixes(model: torch.nn.Module) -> bool:
    """Whether `model` can attend through SharedPrefix: SDPA attention over every column of
    every layer (no sliding window, no logit soft-capping)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    full = all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ["full_attention"])
    windowed = bool(getattr(config, "sliding_window", None)) and getattr(config, "use_sliding_window", True)
    capped = bool(getattr(config, "attn_logit_softcapping", None))
    return config._attn_implementation == "sdpa" and full and not windowed and not capped


def register(model: torch.nn.Module) -> None:
    """Attend through this module's attention in `model` (a sampling copy): plain SDPA until a
    forward passes `shared_prefix`."""
    AttentionInterface.register(ATTENTION, shared_prefix_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)
