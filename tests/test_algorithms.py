"""Hand-computed checks of the pure RL math in toolpolicy.algorithms."""

import math

import pytest
import torch

from toolpolicy.algorithms import (
    AGGREGATIONS,
    aggregate_loss,
    chunked_token_logprobs,
    entropy_from_logits,
    expand_group_mask,
    group_advantages,
    kl_k3,
    ppo_clip_loss,
    token_logprobs,
    varied_groups,
)

# ---------------------------------------------------------------- advantages


def test_group_advantages_grpo_two_groups_of_two():
    # rewards [1, 0 | 0, 1], group 2. Group 0: mean 0.5, centered [0.5, -0.5],
    # unbiased std = sqrt((0.25 + 0.25) / 1) = sqrt(0.5) = 0.70711 -> 0.5 / 0.70711 = 0.70711.
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
    s = math.sqrt(0.5)
    assert torch.allclose(adv, torch.tensor([s, -s, -s, s]), atol=1e-5)


def test_group_advantages_grpo_group_of_four_uses_unbiased_std():
    # rewards [1, 0, 0, 0]: mean 0.25, centered [0.75, -0.25, -0.25, -0.25],
    # unbiased var = (0.5625 + 3 * 0.0625) / 3 = 0.25, std 0.5 -> [1.5, -0.5, -0.5, -0.5].
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4)
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)


def test_group_advantages_dr_grpo_only_centers():
    # scale_std=False: r - mean. [1, 0, 0, 0] -> [0.75, -0.25, -0.25, -0.25]; [2, 4] -> [-1, 1].
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0, 4.0, 2.0]), group_size=4, scale_std=False)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, -1.0, 1.0, 1.0, -1.0]))


def test_group_advantages_all_equal_group_is_zero_not_nan():
    # group [1, 1]: centered [0, 0], std 0 -> 0 / (0 + eps) = 0. Group [0, 1] unaffected.
    adv = group_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), group_size=2)
    assert not adv.isnan().any()
    assert adv[:2].tolist() == [0.0, 0.0]
    assert adv[2] < 0 < adv[3]


def test_group_advantages_group_of_one_is_zero():
    adv = group_advantages(torch.tensor([3.0, -1.0]), group_size=1)
    assert adv.tolist() == [0.0, 0.0]


def test_group_advantages_rejects_uneven_batch():
    with pytest.raises(ValueError, match="divisible"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0]), group_size=2)


# ---------------------------------------------------------------- ppo clip


def _ratios_to_logprobs(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs = torch.log(torch.tensor(ratios)).requires_grad_(True)
    return logprobs, torch.zeros_like(logprobs)


def test_ppo_clip_loss_both_sides_both_signs():
    # Row 0 has A = +1, row 1 has A = -1; ratios [1.0, 1.5, 0.5] each; clip 0.2 -> [0.8, 1.2].
    # A=+1: r=1.0 -> -min(1.0, 1.0) = -1.0
    #       r=1.5 -> -min(1.5, 1.2) = -1.2   (clipped high: binding)
    #       r=0.5 -> -min(0.5, 0.8) = -0.5   (clip not binding: pessimistic term is unclipped)
    # A=-1: r=1.0 -> -min(-1.0, -1.0) = 1.0
    #       r=1.5 -> -min(-1.5, -1.2) = 1.5  (clip not binding)
    #       r=0.5 -> -min(-0.5, -0.8) = 0.8  (clipped low: binding)
    logprobs, old = _ratios_to_logprobs([[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]])
    loss, stats = ppo_clip_loss(logprobs, old, torch.tensor([1.0, -1.0]))
    assert torch.allclose(loss, torch.tensor([[-1.0, -1.2, -0.5], [1.0, 1.5, 0.8]]), atol=1e-6)
    # 2 of 6 tokens clipped: one high (row 0), one low (row 1). ratio mean (3 + 3) / 6 = 1.
    assert stats["clip_fraction"] == pytest.approx(2 / 6)
    assert stats["clip_high_fraction"] == pytest.approx(1 / 6)
    assert stats["clip_low_fraction"] == pytest.approx(1 / 6)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["ratio_max"] == pytest.approx(1.5)
    # d loss / d logprob = -A * ratio where unclipped, 0 where the clip binds.
    loss.sum().backward()
    expected_grad = torch.tensor([[-1.0, 0.0, -0.5], [1.0, 1.5, 0.0]])
    assert torch.allclose(logprobs.grad, expected_grad, atol=1e-6)


def test_ppo_clip_loss_ratio_one_is_minus_advantage():
    logprobs = torch.randn(3, 5)
    advantages = torch.tensor([0.7, -2.0, 0.0])
    loss, stats = ppo_clip_loss(logprobs, logprobs.clone(), advantages)
    assert torch.allclose(loss, -advantages[:, None].expand(3, 5))
    assert stats["clip_fraction"] == 0.0
    assert stats["ratio_mean"] == pytest.approx(1.0)


def test_ppo_clip_loss_clip_higher_is_asymmetric():
    # DAPO clip-higher: ratio 1.25 with A = +1. Symmetric 0.2 clips at 1.2 -> -1.2;
    # clip_high 0.28 allows up to 1.28 -> -1.25. Ratio 0.75 with A = -1: clip_low 0.2 -> 0.8.
    logprobs, old = _ratios_to_logprobs([[1.25], [0.75]])
    advantages = torch.tensor([1.0, -1.0])
    symmetric, _ = ppo_clip_loss(logprobs, old, advantages)
    higher, stats = ppo_clip_loss(logprobs, old, advantages, clip_low=0.2, clip_high=0.28)
    assert torch.allclose(symmetric, torch.tensor([[-1.2], [0.8]]))
    assert torch.allclose(higher, torch.tensor([[-1.25], [0.8]]))
    assert stats["clip_high_fraction"] == 0.0 and stats["clip_low_fraction"] == pytest.approx(0.5)


def test_ppo_clip_loss_stats_respect_loss_mask():
    # Same ratios as above, mask drops column 2: masked ratios [1, 1.5, 1, 1.5] -> mean 1.25;
    # only row 0 column 1 is clipped -> 1 / 4; the low clip at row 1 column 2 is masked out.
    logprobs, old = _ratios_to_logprobs([[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    _, stats = ppo_clip_loss(logprobs, old, torch.tensor([1.0, -1.0]), loss_mask=mask)
    assert stats["ratio_mean"] == pytest.approx(1.25)
    assert stats["clip_fraction"] == pytest.approx(0.25)
    assert stats["clip_low_fraction"] == 0.0
    assert all(isinstance(v, float) for v in stats.values())


# ---------------------------------------------------------------- aggregation

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_token_mean_by_hand():
    # masked tokens 1, 2, 4 -> 7 / 3
    value = aggregate_loss(PER_TOKEN, MASK, "token_mean", total_tokens=3, total_sequences=2)
    assert value.item() == pytest.approx(7 / 3)


def test_seq_mean_token_mean_by_hand():
    # row 0: (1 + 2) / 2 = 1.5; row 1: 4 / 1 = 4 -> (1.5 + 4) / 2 = 2.75
    value = aggregate_loss(PER_TOKEN, MASK, "seq_mean_token_mean", total_tokens=3, total_sequences=2)
    assert value.item() == pytest.approx(2.75)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_micro_batches_sum_to_full_batch(mode):
    torch.manual_seed(0)
    per_token = torch.randn(6, 7)
    mask = (torch.rand(6, 7) > 0.4).long()
    totals = {"total_tokens": float(mask.sum()), "total_sequences": 6.0}
    full = aggregate_loss(per_token, mask, mode, **totals)
    parts = sum(aggregate_loss(per_token[i : i + 2], mask[i : i + 2], mode, **totals) for i in range(0, 6, 2))
    assert parts.item() == pytest.approx(full.item(), abs=1e-6)
    # Hand check for the pair used above: micro-batches of rows [0] and [1].
    halves = sum(aggregate_loss(PER_TOKEN[i : i + 1], MASK[i : i + 1], mode, 3, 2) for i in range(2))
    assert halves.item() == pytest.approx(aggregate_loss(PER_TOKEN, MASK, mode, 3, 2).item())


def test_aggregate_loss_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        aggregate_loss(PER_TOKEN, MASK, "sum", 3, 2)


# ---------------------------------------------------------------- kl, entropy, logprobs


def test_kl_k3_by_hand():
    # d = ref - lp. d = ln 2: 2 - 0.693147 - 1 = 0.306853; d = -ln 2: 0.5 + 0.693147 - 1 = 0.193147.
    ln2 = math.log(2.0)
    kl = kl_k3(torch.tensor([[0.0, 0.0]]), torch.tensor([[ln2, -ln2]]))
    assert torch.allclose(kl, torch.tensor([[2 - ln2 - 1, 0.5 + ln2 - 1]]), atol=1e-6)


def test_kl_k3_zero_when_equal_and_never_negative():
    lp = torch.randn(4, 9)
    assert torch.equal(kl_k3(lp, lp.clone()), torch.zeros(4, 9))
    assert (kl_k3(lp, lp + 1e-7 * torch.randn(4, 9)) >= 0).all()
    assert (kl_k3(lp, torch.randn(4, 9)) >= 0).all()


def test_entropy_by_hand():
    # uniform over 4 -> ln 4 = 1.386294; p = [0.25, 0.75] (logits ln 1, ln 3):
    # -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335.
    uniform = entropy_from_logits(torch.zeros(1, 1, 4))
    assert uniform.item() == pytest.approx(math.log(4.0), abs=1e-6)
    skewed = entropy_from_logits(torch.log(torch.tensor([[[1.0, 3.0]]])))
    assert skewed.item() == pytest.approx(0.562335, abs=1e-5)


def test_entropy_is_stable_for_huge_and_masked_logits():
    # [1000, 1000] -> ln 2 without overflow; [0, -inf, -inf] -> 0, not NaN.
    logits = torch.tensor([[[1000.0, 1000.0, -float("inf")], [0.0, -float("inf"), -float("inf")]]])
    entropy = entropy_from_logits(logits)
    assert entropy.shape == (1, 2)
    assert torch.allclose(entropy, torch.tensor([[math.log(2.0), 0.0]]), atol=1e-6)


def test_token_logprobs_by_hand_and_against_log_softmax():
    # logits ln[1, 3]: target 1 -> ln 0.75 = -0.287682; uniform over 4, target 2 -> -ln 4.
    logits = torch.tensor([[[math.log(1.0), math.log(3.0), -1e9, -1e9], [0.0, 0.0, 0.0, 0.0]]])
    lp = token_logprobs(logits, torch.tensor([[1, 2]]))
    assert torch.allclose(lp, torch.tensor([[math.log(0.75), -math.log(4.0)]]), atol=1e-6)

    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11, dtype=torch.bfloat16)
    targets = torch.randint(0, 11, (2, 3))
    lp = token_logprobs(logits, targets)
    expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    assert lp.dtype == torch.float32 and lp.shape == (2, 3)
    assert torch.allclose(lp, expected, atol=1e-5)
    # float64 logits keep their precision (float64 runs compare code paths to 1e-10)
    wide = token_logprobs(logits.double() / 3, targets)
    assert wide.dtype == torch.float64 and entropy_from_logits(logits.double()).dtype == torch.float64
    assert torch.allclose(wide, torch.log_softmax(logits.double() / 3, dim=-1).gather(-1, targets[..., None]).squeeze(-1), atol=1e-15)


def test_chunked_token_logprobs_equal_the_whole_computation_and_never_save_all_logits():
    # 10 positions through a 16 -> 50 head, 3 at a time (chunks of 3, 3, 3, 1): the same
    # log-probs, entropies and gradients (of the hidden states and the head) as computing
    # the [10, 50] logits at once; the backward pass recomputes each chunk, so what autograd
    # keeps for it is the chunks' inputs (10 x 16 hidden values, 10 targets), not 10 x 50 logits.
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(10, 16, requires_grad=True)
    targets = torch.randint(0, 50, (10,))
    weights = torch.randn(10)

    logits = head(hidden) / 0.7  # [10, 50]
    whole = token_logprobs(logits, targets)
    (whole * weights).sum().backward()
    expected_grads = (hidden.grad.clone(), head.weight.grad.clone())
    expected_entropy = entropy_from_logits(logits.detach())
    hidden.grad, head.weight.grad = None, None

    saved = []

    def pack(tensor):
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        chunked, entropy = chunked_token_logprobs(hidden, head, targets, chunk=3, temperature=0.7, with_entropy=True)
    (chunked * weights).sum().backward()
    assert torch.allclose(chunked, whole, atol=1e-6) and torch.allclose(entropy, expected_entropy, atol=1e-6)
    assert torch.allclose(hidden.grad, expected_grads[0], atol=1e-6) and torch.allclose(head.weight.grad, expected_grads[1], atol=1e-6)
    assert sum(saved) == 10 * 16 + 10, saved

    with torch.no_grad():  # the sampler's and the reference's case: no recomputation
        assert torch.allclose(chunked_token_logprobs(hidden, head, targets, chunk=4, temperature=0.7)[0], whole, atol=1e-6)


# ---------------------------------------------------------------- filters


def test_varied_groups_and_expand():
    # groups [1, 1] (all right), [0, 1] (varied), [0.5, 0.5] (all equal)
    keep = varied_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5]), group_size=2)
    assert keep.tolist() == [False, True, False]
    assert expand_group_mask(keep, 2).tolist() == [False, False, True, True, False, False]


def test_varied_groups_matches_nonzero_advantage():
    rewards = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    keep = expand_group_mask(varied_groups(rewards, 3), 3)
    assert torch.equal(keep, group_advantages(rewards, 3) != 0)


def test_varied_groups_rejects_uneven_batch():
    with pytest.raises(ValueError):
        varied_groups(torch.tensor([1.0, 0.0, 1.0]), group_size=2)
