"""Cross-check our losses against TRL's GRPOTrainer on identical tensors.

What is compared: TRL's own `GRPOTrainer._compute_loss` (trl/trainer/grpo_trainer.py), the
method that turns per-token log-probabilities, old log-probabilities, advantages, the
completion mask and (with beta > 0) reference log-probabilities into the scalar loss. It is
called unbound on a stub `self` that carries only the attributes the method reads; the stub's
`_get_per_token_logps_and_entropies` returns our fixed log-probability tensor instead of
running a model. So the whole of TRL's loss path runs unchanged from the log-probabilities
on: importance ratio (token or sequence level), clipping (epsilon / epsilon_high, `delta`),
k3 KL, and the loss_type-specific aggregation. Ours is POLICY_LOSSES[ratio_level] +
beta * kl_k3 -> aggregate_loss. Both values and gradients with respect to the
log-probabilities must match:

    TRL loss_type="grpo"                          == ppo_clip_loss + "seq_mean_token_mean"
    TRL loss_type="dr_grpo" (max_completion_length) == ppo_clip_loss + "seq_mean_token_sum_norm"(norm_length)
    TRL loss_type="dapo" (num_items_in_batch)      == ppo_clip_loss + "token_mean"
    TRL importance_sampling_level="sequence", "grpo" == gspo_loss + "seq_mean_token_mean"
    TRL delta=c (INTELLECT-2 two-sided clip)       == ppo_clip_loss(dual_clip=c), for c > 1 + clip_high

Skipped, with the reason, when trl is not installed (`pip install trl`, the dev extra).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from toolpolicy.algorithms import POLICY_LOSSES, aggregate_loss, kl_k3

trl = pytest.importorskip("trl", reason="trl is not installed (`pip install -e '.[dev]'`): no TRL loss to compare with")
try:
    from trl.trainer.grpo_trainer import GRPOTrainer
except Exception as exc:  # pragma: no cover - depends on the installed trl / transformers pair
    pytest.skip(f"trl {trl.__version__} is installed but GRPOTrainer does not import: {exc}", allow_module_level=True)


class _OneProcess:
    """The accelerator calls _compute_loss makes, for a single process."""

    num_processes = 1

    @staticmethod
    def gather(x):
        return x

    @staticmethod
    def gather_for_metrics(x):
        return x

    @staticmethod
    def reduce(x, reduction="sum"):
        return x


def _trl_loss(logprobs, inputs, *, loss_type, level="token", eps_low=0.2, eps_high=0.2, beta=0.0, delta=None,
              max_completion_length=None, accumulation_steps=1):
    """TRL's GRPOTrainer._compute_loss on a stub trainer whose model 'returns' `logprobs`."""
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logprobs, torch.zeros_like(logprobs), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        beta=beta,
        args=SimpleNamespace(delta=delta, use_bias_correction_kl=False, steps_per_generation=accumulation_steps),
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=accumulation_steps,
        max_completion_length=max_completion_length,
        accelerator=_OneProcess(),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    loss = GRPOTrainer._compute_loss(stub, None, inputs)
    return loss, stub._metrics["train"]


def _batch(seed: int, rows: int = 4, width: int = 6, spread: float = 0.3):
    """Random log-probabilities near the old ones, right-padded masks of different lengths, signed advantages."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3  # [B, T]
    new = old + spread * torch.randn(rows, width, generator=g, dtype=torch.float64)  # [B, T]
    ref = old + 0.2 * torch.randn(rows, width, generator=g, dtype=torch.float64)  # [B, T]
    lengths = torch.tensor([width, width - 2, 3, 1][:rows] + [width] * max(0, rows - 4))
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()  # [B, T]
    advantages = torch.tensor([1.2, -0.7, 0.4, -1.5][:rows] + [0.3] * max(0, rows - 4), dtype=torch.float64)
    inputs = {
        "prompt_ids": torch.zeros(rows, 2, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
        "completion_ids": torch.zeros(rows, width, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum().double(),
    }
    return new, inputs


def _ours(new, inputs, *, level="token", aggregation, clip_low=0.2, clip_high=0.2, beta=0.0, dual_clip=None,
          norm_length=None, total_tokens=None, total_sequences=None):
    mask = inputs["completion_mask"]
    per_token, stats = POLICY_LOSSES[level](
        new, inputs["old_per_token_logps"], inputs["advantages"], clip_low, clip_high,
        loss_mask=mask, dual_clip=dual_clip,
    )
    if beta:
        per_token = per_token + beta * kl_k3(new, inputs["ref_per_token_logps"])
    total_tokens = float(mask.sum()) if total_tokens is None else total_tokens
    total_sequences = float(mask.shape[0]) if total_sequences is None else total_sequences
    loss = aggregate_loss(per_token, mask, aggregation, total_tokens, total_sequences, norm_length=norm_length)
    return loss, stats


def _value_and_grad(fn, new):
    leaf = new.clone().requires_grad_(True)
    out = fn(leaf)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
    return loss.detach(), leaf.grad, out


CASES = {
    # name: (TRL kwargs, our kwargs)
    "grpo": (dict(loss_type="grpo"), dict(aggregation="seq_mean_token_mean")),
    "grpo_kl": (dict(loss_type="grpo", beta=0.04), dict(aggregation="seq_mean_token_mean", beta=0.04)),
    "dr_grpo": (
        dict(loss_type="dr_grpo", max_completion_length=8),
        dict(aggregation="seq_mean_token_sum_norm", norm_length=8),
    ),
    "dapo": (dict(loss_type="dapo", eps_high=0.28), dict(aggregation="token_mean", clip_high=0.28)),
    "gspo": (
        dict(loss_type="grpo", level="sequence", eps_low=3e-4, eps_high=4e-4),
        dict(level="sequence", aggregation="seq_mean_token_mean", clip_low=3e-4, clip_high=4e-4),
    ),
    "gspo_wide_clip": (
        dict(loss_type="grpo", level="sequence", eps_low=0.05, eps_high=0.05, beta=0.04),
        dict(level="sequence", aggregation="seq_mean_token_mean", clip_low=0.05, clip_high=0.05, beta=0.04),
    ),
    "dual_clip": (dict(loss_type="grpo", delta=1.5), dict(aggregation="seq_mean_token_mean", dual_clip=1.5)),
}


SEEDS = [0, 2, 3]  # batches where every case below clips some tokens (checked in test_comparisons_are_not_vacuous)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_gradient_equal_trl(case, seed):
    trl_kwargs, our_kwargs = CASES[case]
    spread = 1.0 if case == "dual_clip" else 0.3  # ratios well past 1.5 so the dual clip binds
    new, inputs = _batch(seed, spread=spread)
    trl_value, trl_grad, _ = _value_and_grad(lambda lp: _trl_loss(lp, inputs, **trl_kwargs), new)
    our_value, our_grad, _ = _value_and_grad(lambda lp: _ours(lp, inputs, **our_kwargs), new)
    torch.testing.assert_close(our_value, trl_value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(our_grad, trl_grad, rtol=1e-10, atol=1e-12)


def test_comparisons_are_not_vacuous():
    # Over the seeds used above: the dual clip binds on some A < 0 token, the token clip binds
    # on some token, and the wide GSPO clip clips some sequences but not all.
    dual, token, sequence = [], [], []
    for seed in SEEDS:
        new, inputs = _batch(seed, spread=1.0)
        dual.append(_ours(new, inputs, aggregation="seq_mean_token_mean", dual_clip=1.5)[1]["dual_clip_fraction"])
        new, inputs = _batch(seed)
        token.append(_ours(new, inputs, aggregation="token_mean", clip_high=0.28)[1]["clip_fraction"])
        wide = dict(level="sequence", aggregation="seq_mean_token_mean", clip_low=0.05, clip_high=0.05)
        sequence.append(_ours(new, inputs, **wide)[1]["clip_fraction"])
    assert all(f > 0 for f in dual) and all(f > 0 for f in token)
    assert any(0 < f < 1 for f in sequence)


@pytest.mark.parametrize("seed", [0, 1])
def test_token_level_clip_stats_equal_trl(seed):
    # TRL's clip_ratio/low_mean, high_mean, region_mean are masked token means, like ours.
    new, inputs = _batch(seed, spread=0.5)
    _, metrics = _trl_loss(new, inputs, loss_type="dapo", eps_high=0.28)
    _, stats = _ours(new, inputs, aggregation="token_mean", clip_high=0.28)
    assert stats["clip_low_fraction"] == pytest.approx(metrics["clip_ratio/low_mean"][0])
    assert stats["clip_high_fraction"] == pytest.approx(metrics["clip_ratio/high_mean"][0])
    assert stats["clip_fraction"] == pytest.approx(metrics["clip_ratio/region_mean"][0])
    assert stats["clip_fraction"] > 0


@pytest.mark.parametrize(
    "trl_kwargs, our_kwargs",
    [
        (dict(loss_type="grpo"), dict(aggregation="seq_mean_token_mean")),
        (
            dict(loss_type="dr_grpo", max_completion_length=8),
            dict(aggregation="seq_mean_token_sum_norm", norm_length=8),
        ),
        (dict(loss_type="dapo"), dict(aggregation="token_mean")),
    ],
)
def test_micro_batches_sum_like_trl_gradient_accumulation(trl_kwargs, our_kwargs):
    # Two equal micro-batches: TRL divides each by the accumulation steps (2); we divide by
    # whole-batch totals. Summed over micro-batches both equal the full-batch loss.
    new, inputs = _batch(3, rows=4)
    totals = dict(total_tokens=float(inputs["completion_mask"].sum()), total_sequences=4.0)
    trl_sum = our_sum = 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        part = {k: (v[rows] if k != "num_items_in_batch" else v) for k, v in inputs.items()}
        trl_sum += float(_trl_loss(new[rows], part, accumulation_steps=2, **trl_kwargs)[0])
        our_sum += float(_ours(new[rows], part, **our_kwargs, **totals)[0])
    full = float(_ours(new, inputs, **our_kwargs)[0])
    assert our_sum == pytest.approx(full, rel=1e-12)
    assert trl_sum == pytest.approx(full, rel=1e-12)
