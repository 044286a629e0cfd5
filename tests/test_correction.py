"""Sampler/trainer log-prob mismatch: truncated importance sampling and its measurement."""

from __future__ import annotations

import math

import pytest
import torch

from toolpolicy.algorithms import Algorithm
from toolpolicy.algorithms.correction import Correction, mismatch_sums, truncated_importance_weights


def objective_and_grad(correction: str, trainer: torch.Tensor, sampler: torch.Tensor, advantages: torch.Tensor, mask):
    algorithm = Algorithm.named("grpo", "token", "k3", "token_mean", clip_low=0.2, clip_high=0.28, dual_clip=None,
                                beta=0.0, loss_norm_length=8)
    logprobs = trainer.clone().requires_grad_(True)
    old, weights = Correction.named(correction, tis_cap=2.0).old_policy(logprobs, sampler)
    loss, _ = algorithm.objective(logprobs, old, advantages, mask, None, float(mask.sum()), 2.0, weights)
    loss.backward()
    return float(loss), logprobs.grad


def test_tis_is_a_no_op_when_sampler_and_trainer_agree() -> None:
    torch.manual_seed(0)
    logprobs = -torch.rand(2, 8)
    mask = torch.ones(2, 8)
    advantages = torch.tensor([1.0, -0.5])
    plain = objective_and_grad("none", logprobs, logprobs, advantages, mask)
    tis = objective_and_grad("tis", logprobs, logprobs, advantages, mask)
    assert plain[0] == pytest.approx(tis[0], abs=1e-7)
    assert torch.allclose(plain[1], tis[1], atol=1e-7)


def test_tis_weighs_each_token_by_the_truncated_ratio() -> None:
    trainer = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    sampler = torch.log(torch.tensor([[0.5, 0.1, 0.3]]))  # ratios 1, 5 (capped at 2), 3 (capped)
    weights = truncated_importance_weights(trainer, sampler, cap=2.0)
    assert weights[0].tolist() == pytest.approx([1.0, 2.0, 2.0])
    trainer = torch.log(torch.tensor([[0.2]]))
    sampler = torch.log(torch.tensor([[0.4]]))
    assert truncated_importance_weights(trainer, sampler, cap=2.0).item() == pytest.approx(0.5)
    # With TIS the PPO ratio is taken against the trainer's own pi_old (1 at the first step),
    # so a mismatch is no longer clipped as if it were a policy change: the gradient of each
    # token is its weight times the plain on-policy gradient.
    mask = torch.ones(1, 3)
    trainer = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    sampler = torch.log(torch.tensor([[0.5, 0.1, 0.3]]))
    _, on_policy = objective_and_grad("none", trainer, trainer, torch.tensor([1.0]), mask)
    _, corrected = objective_and_grad("tis", trainer, sampler, torch.tensor([1.0]), mask)
    assert torch.allclose(corrected, on_policy * torch.tensor([[1.0, 2.0, 2.0]]))


def test_mismatch_sums_measure_the_gap_over_masked_tokens() -> None:
    trainer = torch.log(torch.tensor([[0.5, 0.5, 0.9, 0.9]]))
    sampler = torch.log(torch.tensor([[0.5, 0.25, 0.3, 0.01]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is tool output: not counted
    sums = mismatch_sums(trainer, sampler, mask, cap=2.0)
    assert sums["abs"] == pytest.approx(math.log(2) + math.log(3), rel=1e-5)
    assert sums["abs_max"] == pytest.approx(math.log(3), rel=1e-5)
    assert sums["truncated"] == 1.0  # the ratio 3; the masked 90 is not counted
    assert sums["kl"] == pytest.approx((2 - 1 - math.log(2)) + (3 - 1 - math.log(3)), rel=1e-5)
    agree = mismatch_sums(trainer, trainer, mask, cap=2.0)
    assert agree == {"abs": 0.0, "kl": 0.0, "truncated": 0.0, "abs_max": 0.0}


def test_an_unknown_correction_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="none.*tis"):
        Correction.named("is", tis_cap=2.0)
