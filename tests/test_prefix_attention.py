"""Attention over shared prompts (rollout/prefix_attention.py) is the softmax over each row's
prompt and its own columns together: against a float64 SDPA over the two concatenated, with
prompts of different lengths (left padding), groups of different sizes, several queries a
row (an appended block) and a query that has none of its own columns."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from toolpolicy.rollout.prefix_attention import PrefixRows, SharedPrefix, causal, merged_softmax, shared_prefix_attention

GROUP = torch.tensor([0, 0, 1, 2, 2, 2, 1])  # 7 rows of 3 prompts, 2, 2 and 3 rows each
KV, REPEAT, DIM, PROMPT, OWN = 2, 3, 8, 6, 5


def _case(dtype: torch.dtype, steps: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows, prompts = len(GROUP), int(GROUP.max()) + 1
    keys, values = (torch.randn(prompts, KV, PROMPT, DIM, generator=g, dtype=dtype) for _ in range(2))
    real = torch.ones(prompts, PROMPT, dtype=torch.long)
    real[1, :2] = 0  # prompt 1 is 4 tokens, prompt 2 is 2, left-padded
    real[2, :4] = 0
    own_keys, own_values = (torch.randn(rows, KV, OWN, DIM, generator=g, dtype=dtype) for _ in range(2))
    query = torch.randn(rows, KV * REPEAT, steps, DIM, generator=g, dtype=dtype)
    own = torch.rand(rows, 1, steps, OWN, generator=g) > 0.3
    own[..., -steps:] |= causal(steps, steps, torch.device("cpu"))  # each query sees itself
    own[2, :, 0] = False  # a query with none of its own columns (left padding of a block)
    return SharedPrefix((keys,), (values,), real), own_keys, own_values, query, own


def _reference(prefix: SharedPrefix, own_keys, own_values, query, own) -> torch.Tensor:
    keys = torch.cat([prefix.keys[0][GROUP], own_keys], 2).double().repeat_interleave(REPEAT, 1)
    values = torch.cat([prefix.values[0][GROUP], own_values], 2).double().repeat_interleave(REPEAT, 1)
    steps = query.shape[2]
    mask = torch.cat([prefix.attention[GROUP].bool()[:, None, None, :].expand(-1, 1, steps, -1), own], -1)
    return F.scaled_dot_product_attention(query.double(), keys, values, attn_mask=mask, scale=0.3).transpose(1, 2)


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_shared_prompt_attention_is_one_softmax_over_prompt_and_own_columns(steps: int, dtype: torch.dtype, tolerance: float):
    prefix, own_keys, own_values, query, own = _case(dtype, steps)
    module = SimpleNamespace(layer_idx=0)
    out, _ = shared_prefix_attention(module, query, own_keys, own_values, own, scaling=0.3, shared_prefix=PrefixRows.of(prefix, GROUP))
    expected = _reference(prefix, own_keys, own_values, query, own)
    assert out.shape == (len(GROUP), steps, KV * REPEAT, DIM) and out.dtype == dtype
    assert float((out.double() - expected).abs().max()) < tolerance
    # Without a mask the own columns are causal: the last `steps` columns, one more per query.
    out, _ = shared_prefix_attention(module, query, own_keys, own_values, None, scaling=0.3, shared_prefix=PrefixRows.of(prefix, GROUP))
    causal_own = causal(steps, OWN, torch.device("cpu"))[None, None].expand(len(GROUP), 1, steps, OWN)
    assert float((out.double() - _reference(prefix, own_keys, own_values, query, causal_own)).abs().max()) < tolerance


def test_rows_know_their_place_among_their_prompts_rows():
    prefix, *_ = _case(torch.float32, 1)
    rows = PrefixRows.of(prefix, GROUP)
    assert rows.slot.tolist() == [0, 1, 0, 0, 1, 2, 1] and rows.slots == 3


def test_joined_prompts_are_left_padded_to_the_widest():
    short = SharedPrefix((torch.ones(1, KV, 2, DIM),), (torch.ones(1, KV, 2, DIM),), torch.ones(1, 2, dtype=torch.long))
    long = SharedPrefix((torch.full((2, KV, 4, DIM), 2.0),), (torch.full((2, KV, 4, DIM), 2.0),), torch.ones(2, 4, dtype=torch.long))
    joined = SharedPrefix.joined([short, long])
    assert joined.attention.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert joined.keys[0].shape == (3, KV, 4, DIM) and float(joined.keys[0][0, :, :2].abs().sum()) == 0.0


def test_a_half_with_no_columns_weighs_nothing():
    out_a, out_b = torch.ones(2, 4), torch.full((2, 4), 7.0)
    lse_a, lse_b = torch.zeros(2), torch.tensor([float("-inf"), 0.0])
    merged = merged_softmax(out_a, lse_a, out_b, lse_b)
    assert merged[0].tolist() == [1.0] * 4 and merged[1].tolist() == [4.0] * 4  # equal log-sum-exps: the mean
