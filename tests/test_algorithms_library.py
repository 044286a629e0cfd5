"""Hand-computed checks of the policy-optimisation library: advantage estimators, GDPO,
turn-level credit, tool-efficiency rewards, dual-clip, GSPO, Dr.GRPO aggregation, KL
estimators, filters and presets. Every expected number is worked out in a comment."""

import math

import pytest
import torch

from toolpolicy.algorithms import (
    AGGREGATIONS,
    ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    PRESETS,
    Algorithm,
    SequenceClip,
    TokenClip,
    aggregate_loss,
    apply_preset,
    broadcast_turns,
    discounted_returns,
    dr_grpo_advantages,
    first_groups,
    gdpo_advantages,
    grpo_advantages,
    gspo_loss,
    kl_k1,
    kl_k2,
    kl_k3,
    ppo_clip_loss,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    sequence_log_ratio,
    turn_advantages,
    turn_rewards,
    varied_batch,
    varied_components,
    varied_groups,
    varied_returns,
    void_turn_filter,
)
from toolpolicy.rewards import soft_overlong_penalty
from toolpolicy.algorithms.presets import REWARDS
from toolpolicy.rewards.tool_efficiency import eapo_reward, otc_scaled, otc_tool_score
from toolpolicy.rollout.trajectory import Trajectory
from toolpolicy.types import Episode, Event, Task

S = math.sqrt(0.5)  # 0.70711

# ---------------------------------------------------------------- scalar advantages


def test_grpo_and_dr_grpo_by_hand():
    # [1, 0, 0, 0]: mean 0.25, centred [0.75, -0.25, -0.25, -0.25]; unbiased std 0.5.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert torch.allclose(grpo_advantages(rewards, 4), torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)
    assert torch.allclose(dr_grpo_advantages(rewards, 4), torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_rloo_leave_one_out_by_hand():
    # [1, 0, 0, 0]: A_0 = 1 - mean(0, 0, 0) = 1; A_1 = 0 - mean(1, 0, 0) = -1/3.
    # [2, 4]: A = 2 - 4 = -2, 4 - 2 = 2. Equals k/(k-1) * (r - mean): 4/3 * 0.75 = 1.
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    assert torch.allclose(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    assert rloo_advantages(torch.tensor([2.0, 4.0]), 2).tolist() == [-2.0, 2.0]
    assert rloo_advantages(torch.tensor([3.0, 5.0]), 1).tolist() == [0.0, 0.0]  # no other sample


def test_reinforce_pp_normalises_over_the_batch():
    # [1, 0 | 0, 1 | 1, 1]: batch mean 2/3, deviations [1/3, -2/3, -2/3, 1/3, 1/3, 1/3];
    # sum of squares 4/9 + 8/9 = 4/3, unbiased var (4/3)/5 = 4/15, std 0.516398.
    # 1/3 / 0.516398 = 0.645497; -2/3 / 0.516398 = -1.290994. The all-right group [1, 1]
    # gets +0.645 (no per-prompt baseline), unlike GRPO's 0.
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), 2)
    expected = torch.tensor([0.645497, -1.290994, -1.290994, 0.645497, 0.645497, 0.645497])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_reinforce_pp_baseline_group_mean_then_batch_std():
    # Same rewards; group-centred [0.5, -0.5, -0.5, 0.5, 0, 0]; batch mean 0, sum of
    # squares 1, unbiased var 1/5, std 0.447214 -> 0.5 / 0.447214 = 1.118034.
    adv = reinforce_pp_baseline_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), 2)
    assert torch.allclose(adv, torch.tensor([1.118034, -1.118034, -1.118034, 1.118034, 0.0, 0.0]), atol=1e-5)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_has_the_common_signature(name):
    estimator = ESTIMATORS[name]
    components = torch.tensor([[1, 0], [0, 0], [0, 1], [1, 1]])  # int rewards are accepted too
    adv = estimator.advantages(components, torch.tensor([1.0, 0.5]), 2)
    assert adv.shape == (4,) and adv.dtype == torch.float32 and not adv.isnan().any()
    assert estimator.signal(components.float(), torch.tensor([1.0, 0.5]), 2).shape == (2,)
    with pytest.raises(ValueError):
        estimator.advantages(torch.tensor([[1.0], [0.0], [1.0]]), torch.tensor([1.0]), 2)


def test_each_estimator_keeps_the_groups_it_learns_from():
    # Totals [1, 1 | 0, 1 | 0, 0] (one column, weight 1).
    totals = torch.tensor([[1.0], [1.0], [0.0], [1.0], [0.0], [0.0]])
    one = torch.tensor([1.0])
    # A per-group baseline learns only from the group that varies.
    assert varied_groups(totals[:, 0], 2).tolist() == [False, True, False]
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"):
        assert ESTIMATORS[name].signal(totals, one, 2).tolist() == [False, True, False], name
    # REINFORCE++'s baseline is the batch mean (4/6): the all-right group gets +0.33 / std and
    # the all-wrong one -0.67 / std, so every group learns; a constant batch teaches nothing.
    assert ESTIMATORS["reinforce_pp"].signal(totals, one, 2).tolist() == [True, True, True]
    assert ESTIMATORS["reinforce_pp"].advantages(totals, one, 2)[:2].gt(0).all()
    assert varied_batch(torch.ones(4), 2).tolist() == [False, False]
    # GDPO: components (correct, excess calls) with weights (1, -0.5). Group 0 is
    # [1, 2] and [0, 0]: totals 1 - 1 = 0 and 0 tie, but both components vary, so GDPO learns
    # (correct -> [+0.71, -0.71], calls -> [+0.71, -0.71] * -0.5: A = [+0.35, -0.35] before
    # batch norm) where GRPO's totals say nothing. Group 1 differs only in a weight-0 metric column.
    components = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    weights = torch.tensor([1.0, -0.5, 0.0])
    assert ESTIMATORS["grpo"].signal(components, weights, 2).tolist() == [False, False]
    assert ESTIMATORS["gdpo"].signal(components, weights, 2).tolist() == [True, False]
    assert varied_components(components, weights, 2).tolist() == [True, False]
    raw = gdpo_advantages(components, weights, 2, batch_norm=False)
    assert torch.allclose(raw, torch.tensor([S - 0.5 * S, -S + 0.5 * S, 0.0, 0.0]), atol=1e-5)


# ---------------------------------------------------------------- GDPO

# Two groups of two rollouts, components (correct, format):
#   group 0: [0, 0] and [1, 1]  -> totals 0 and 2
#   group 1: [0, 0] and [1, 0]  -> totals 0 and 1
COMPONENTS = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
WEIGHTS = torch.tensor([1.0, 1.0])


def test_grpo_collapses_distinct_reward_combinations():
    # GRPO on totals: group 0 [0, 2] -> centred [-1, 1], std sqrt(2) -> [-0.7071, 0.7071];
    # group 1 [0, 1] -> [-0.5, 0.5], std sqrt(0.5) -> [-0.7071, 0.7071]. Both reward
    # combinations (both rewards vs one) get the SAME advantage.
    adv = ESTIMATORS["grpo"].advantages(COMPONENTS, WEIGHTS, 2)
    assert torch.allclose(adv, torch.tensor([-S, S, -S, S]), atol=1e-5)


def test_gdpo_separates_them():
    # Per component within each group:
    #   group 0: correct [0, 1] -> [-0.7071, 0.7071]; format [0, 1] -> [-0.7071, 0.7071]; sum [-1.4142, 1.4142]
    #   group 1: correct [0, 1] -> [-0.7071, 0.7071]; format [0, 0] -> [0, 0];           sum [-0.7071, 0.7071]
    raw = gdpo_advantages(COMPONENTS, WEIGHTS, 2, batch_norm=False)
    assert torch.allclose(raw, torch.tensor([-2 * S, 2 * S, -S, S]), atol=1e-5)
    # Batch norm: mean 0, sum of squares 2 + 2 + 0.5 + 0.5 = 5, unbiased var 5/3, std 1.290994:
    # 1.4142 / 1.290994 = 1.095445, 0.7071 / 1.290994 = 0.547723. The 2:1 ratio survives.
    adv = ESTIMATORS["gdpo"].advantages(COMPONENTS, WEIGHTS, 2)
    assert torch.allclose(adv, torch.tensor([-1.095445, 1.095445, -0.547723, 0.547723]), atol=1e-5)
    assert adv[1] > adv[3] > 0


def test_gdpo_weight_zero_component_is_a_metric():
    # format has weight 0 -> only correct counts: both groups [-0.7071, 0.7071] before batch norm.
    raw = gdpo_advantages(COMPONENTS, torch.tensor([1.0, 0.0]), 2, batch_norm=False)
    assert torch.allclose(raw, torch.tensor([-S, S, -S, S]), atol=1e-5)


def test_scalar_estimators_run_on_the_weighted_sum_and_unknown_names_are_rejected():
    # rloo on totals [0, 2 | 0, 1]: [-2, 2, -1, 1].
    adv = ESTIMATORS["rloo"].advantages(COMPONENTS, WEIGHTS, 2)
    assert adv.tolist() == [-2.0, 2.0, -1.0, 1.0]
    with pytest.raises(ValueError, match="gdpo"):
        Algorithm.named("ppo", "token", "k3", "token_mean")
    with pytest.raises(ValueError, match="sequence"):
        Algorithm.named("grpo", "word", "k3", "token_mean")
    with pytest.raises(ValueError):
        gdpo_advantages(COMPONENTS, torch.tensor([1.0]), 2)


# ---------------------------------------------------------------- turn-level credit


def test_turn_rewards_from_events():
    # turn 0: invalid call (-0.1); turn 1: clean call (+0.1); turn 2: final answer, outcome 1.0
    # -> [-0.1, 0.1, 1.0].
    weights = {"tool_call": 0.1, "invalid_call": -0.1}
    rewards = turn_rewards(3, [(0, "invalid_call"), (1, "tool_call")], weights, outcome=1.0)
    assert rewards == pytest.approx([-0.1, 0.1, 1.0])
    mixed = turn_rewards(3, [(0, "tool_error"), (1, "tool_call"), (1, "invalid_call"), (7, "tool_call")], weights, 0.0)
    assert mixed == pytest.approx([0.0, 0.0, 0.0])  # tool_error has no weight; turn 1: 0.1 - 0.1; turn 7 is outside
    assert turn_rewards(0, [], weights, 1.0) == []


def test_varied_returns_finds_groups_whose_turns_differ():
    # Group 0: [0.1, 1] and [1] -> returns (gamma 1) [1.1, 1] and [1]: they differ although both
    # episodes succeeded. Group 1: [1] and [1]: nothing to learn.
    assert varied_returns([[0.1, 1.0], [1.0], [1.0], [1.0]], 2, 1.0).tolist() == [True, False]


def test_discounted_returns_by_hand():
    # rewards [0, 0, 1], gamma 0.5: G_2 = 1, G_1 = 0.5, G_0 = 0.25.
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]


def test_turn_advantages_normalise_returns_within_the_group():
    # Group of 2: A has turn rewards [0, 1] (two turns, solved), B has [0] (one turn, failed).
    # gamma 0.5: returns A [0.5, 1], B [0]; pooled [0.5, 1, 0]: mean 0.5, deviations
    # [0, 0.5, -0.5], unbiased var 0.5 / 2 = 0.25, std 0.5 -> A [0, 1], B [-1].
    adv = turn_advantages([[0.0, 1.0], [0.0]], group_size=2, gamma=0.5)
    assert adv[0] == pytest.approx([0.0, 1.0], abs=1e-5) and adv[1] == pytest.approx([-1.0], abs=1e-5)
    # gamma 1: returns A [1, 1], B [0]; mean 2/3, var (1/9 + 1/9 + 4/9) / 2 = 1/3, std 0.57735
    # -> A [0.57735, 0.57735], B [-1.154701].
    adv = turn_advantages([[0.0, 1.0], [0.0]], group_size=2, gamma=1.0)
    assert adv[0] == pytest.approx([0.57735, 0.57735], abs=1e-5) and adv[1] == pytest.approx([-1.154701], abs=1e-5)
    # An all-equal group gets zeros, not NaN; groups are normalised separately.
    adv = turn_advantages([[1.0], [1.0], [0.0, 0.0], [0.0, 2.0]], group_size=2, gamma=1.0)
    assert adv[0] == [0.0] and adv[1] == [0.0]
    with pytest.raises(ValueError):
        turn_advantages([[1.0]] * 3, group_size=2)


def test_broadcast_turns_by_hand():
    # length 10, turns at [3, 5) and [7, 9) with values 1 and -2.
    out = broadcast_turns([1.0, -2.0], [(3, 5), (7, 9)], 10)
    assert out.tolist() == [0, 0, 0, 1, 1, 0, 0, -2, -2, 0]
    with pytest.raises(ValueError):
        broadcast_turns([1.0], [(3, 5), (7, 9)], 10)
    with pytest.raises(ValueError):
        broadcast_turns([1.0], [(8, 12)], 10)


def test_turn_credit_lands_on_the_trajectorys_sampled_tokens():
    # A real Trajectory: prompt [1, 2, 3]; turn 0 samples [4, 5] (an invalid call); a tool
    # observation [6, 7] is forced; turn 1 samples [8, 9] (a clean call, then the answer).
    # turn_spans = [(3, 5), (7, 9)]; loss_mask = [0, 0, 0, 1, 1, 0, 0, 1, 1].
    task = Task("t", "2+2?", "4")
    episode = Episode(task, [], events=[Event("invalid_call", 0, "bad_json"), Event("tool_call", 1, "calc")])
    traj = Trajectory([1, 2, 3], [0, 0, 0], [0.0, 0.0, 0.0], 3, episode)
    traj.append([4, 5], sampled=True, logprobs=[-0.1, -0.2])
    traj.append([6, 7], sampled=False)
    traj.append([8, 9], sampled=True, logprobs=[-0.3, -0.4])
    assert traj.turn_spans == [(3, 5), (7, 9)]

    # Turn rewards from the events: [-0.1, 0.1 + 1.0 outcome] = [-0.1, 1.1]. Its group-mate
    # failed in one turn with an invalid call: [-0.1 + 0.0] = [-0.1].
    weights = {"tool_call": 0.1, "invalid_call": -0.1}
    events = [(e.turn, e.kind) for e in episode.events]
    mine = turn_rewards(len(traj.turn_spans), events, weights, outcome=1.0)
    assert mine == pytest.approx([-0.1, 1.1])
    # gamma 1: returns [1.0, 1.1] and [-0.1]; pooled mean 2/3, deviations [1/3, 13/30, -23/30],
    # sum of squares (100 + 169 + 529) / 900 = 0.886667, var 0.443333, std 0.665833
    # -> [0.500626, 0.650814] and [-1.151440].
    adv = turn_advantages([mine, [-0.1]], group_size=2, gamma=1.0)
    assert adv[0] == pytest.approx([0.500626, 0.650814], abs=1e-5)
    assert adv[1] == pytest.approx([-1.151440], abs=1e-5)

    row = broadcast_turns(adv[0], traj.turn_spans, len(traj.token_ids))  # [L]
    mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
    assert torch.equal(row != 0, mask)  # credit exactly on sampled tokens
    assert row[3:5].tolist() == pytest.approx([0.500626] * 2, abs=1e-5)
    assert row[7:9].tolist() == pytest.approx([0.650814] * 2, abs=1e-5)

    # Into the loss, shifted like TokenBatch (targets = ids[1:]): at ratio 1 the per-token
    # loss is -A on each sampled token.
    shifted = row[1:].unsqueeze(0)  # [1, L-1]
    logprobs = torch.tensor(traj.logprobs[1:]).unsqueeze(0)
    loss, _ = ppo_clip_loss(logprobs, logprobs.clone(), shifted, loss_mask=mask[1:].unsqueeze(0))
    assert torch.allclose(loss, -shifted)


# ---------------------------------------------------------------- tool-efficiency rewards


def test_otc_tool_score_by_hand():
    # n = 0: cos(m pi / (2m + c)), c = 1: m=0 -> cos 0 = 1; m=1 -> cos(pi/3) = 0.5; m=2 -> cos(2pi/5) = 0.309017.
    assert otc_tool_score(0, 0) == pytest.approx(1.0)
    assert otc_tool_score(1, 0) == pytest.approx(0.5)
    assert otc_tool_score(2, 0) == pytest.approx(0.309017, abs=1e-6)
    # n = 2: f = 2nm / (m + n), score sin(f pi / 4). m=2: f=2 -> 1; m=1: f=4/3 -> sin(pi/3) = 0.866025;
    # m=4: f=8/3 -> sin(2pi/3) = 0.866025; m=0: f=0 -> 0.
    assert otc_tool_score(2, 2) == pytest.approx(1.0)
    assert otc_tool_score(1, 2) == pytest.approx(0.866025, abs=1e-6)
    assert otc_tool_score(4, 2) == pytest.approx(0.866025, abs=1e-6)
    assert otc_tool_score(0, 2) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        otc_tool_score(-1, 0)


def test_otc_reward_scales_correctness():
    assert otc_scaled(1.0, 4, 2) == pytest.approx(0.866025, abs=1e-6)
    assert otc_scaled(0.0, 2, 2) == 0.0  # a wrong answer earns nothing, however efficient
    assert otc_scaled(1.0, 2, 2, alpha=2.0) == pytest.approx(2.0)


def test_eapo_penalty_is_heaviest_on_easy_tasks():
    # 3 calls, 1 needed -> excess 2; weight 0.2. easy (0): penalty 0.4 -> 0.6;
    # medium (0.5): 0.2 -> 0.8; hard (1): 0 -> 1.0.
    assert eapo_reward(1.0, 3, 1, difficulty=0.0) == pytest.approx(0.6)
    assert eapo_reward(1.0, 3, 1, difficulty=0.5) == pytest.approx(0.8)
    assert eapo_reward(1.0, 3, 1, difficulty=1.0) == pytest.approx(1.0)
    # weight 0.6 on easy: penalty 1.2 -> floored at 0, never below a wrong answer; wrong -> 0.
    assert eapo_reward(1.0, 3, 1, difficulty=0.0, weight=0.6) == 0.0
    assert eapo_reward(0.0, 1, 1, difficulty=0.0) == 0.0
    assert eapo_reward(1.0, 1, 1, difficulty=0.0) == 1.0  # no excess, no penalty
    with pytest.raises(ValueError):
        eapo_reward(1.0, 1, 1, difficulty=1.5)


# ---------------------------------------------------------------- losses


def _logratios(values):
    logprobs = torch.tensor(values).requires_grad_(True)
    return logprobs, torch.zeros_like(logprobs)


def test_dual_clip_caps_negative_advantage_loss():
    # ratios [1.0, 2.0, 4.0] for A = -1 and A = +1; clip 0.2; dual clip c = 3.
    # A=-1: plain -min(-r, -clip(r)) = [1.0, 2.0, 4.0]; dual caps at -c*A = 3 -> [1.0, 2.0, 3.0].
    # A=+1: [-1.0, -1.2, -1.2] either way (dual-clip only touches A < 0).
    logprobs, old = _logratios([[0.0, math.log(2.0), math.log(4.0)]] * 2)
    adv = torch.tensor([-1.0, 1.0])
    plain, _ = ppo_clip_loss(logprobs, old, adv)
    dual, stats = ppo_clip_loss(logprobs, old, adv, dual_clip=3.0)
    assert torch.allclose(plain, torch.tensor([[1.0, 2.0, 4.0], [-1.0, -1.2, -1.2]]), atol=1e-6)
    assert torch.allclose(dual, torch.tensor([[1.0, 2.0, 3.0], [-1.0, -1.2, -1.2]]), atol=1e-6)
    assert stats["dual_clip_fraction"] == pytest.approx(1 / 6)
    # Gradient: -A * r where unclipped ([1, 2] on row 0), 0 at the dual cap and where the clip binds.
    dual.sum().backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[1.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]), atol=1e-6)
    with pytest.raises(ValueError, match="> 1"):
        ppo_clip_loss(logprobs, old, adv, dual_clip=1.0)


def test_ppo_clip_accepts_per_token_advantages():
    # ratio 1 everywhere: loss = -A per token, A = [[1, -1]].
    lp = torch.zeros(1, 2)
    loss, _ = ppo_clip_loss(lp, lp.clone(), torch.tensor([[1.0, -1.0]]))
    assert loss.tolist() == [[-1.0, 1.0]]


def test_gspo_sequence_ratio_value_clip_and_gradient():
    # log ratios [0.2, -0.1, 0.5], mask [1, 1, 0]: mean over masked (0.2 - 0.1) / 2 = 0.05,
    # s = exp(0.05) = 1.051271 on every token (the unmasked 0.5 does not count).
    logprobs, old = _logratios([[0.2, -0.1, 0.5], [0.2, -0.1, 0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    log_s = sequence_log_ratio(logprobs, old, mask)
    assert torch.allclose(log_s, torch.full((2, 3), 0.05), atol=1e-7)
    # clip 3e-4 / 4e-4: A=+1 -> s > 1.0004, clipped: -1.0004; A=-1 -> unclipped: +1.051271.
    loss, stats = gspo_loss(logprobs, old, torch.tensor([1.0, -1.0]), loss_mask=mask)
    assert torch.allclose(loss[0], torch.full((3,), -1.0004), atol=1e-6)
    assert torch.allclose(loss[1], torch.full((3,), 1.051271), atol=1e-6)
    assert stats["clip_high_fraction"] == pytest.approx(0.5)
    # seq_mean_token_mean = (-1.0004 + 1.051271) / 2 = 0.025436. Gradient: row 0 clipped -> 0;
    # row 1: (1/2 sequences) * (1/2 tokens) * (-A) * s = 0.25 * 1.051271 = 0.262818 on masked tokens.
    total = aggregate_loss(loss, mask, "seq_mean_token_mean", total_tokens=4, total_sequences=2)
    assert total.item() == pytest.approx(0.025436, abs=1e-6)
    total.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, 0.0, 0.0], [0.262818, 0.262818, 0.0]]), atol=1e-6)


def test_policy_losses_table():
    """Each ratio level is a dataclass of the clip constants, called as its function at them."""
    assert POLICY_LOSSES == {"token": TokenClip, "sequence": SequenceClip}
    torch.manual_seed(0)
    logprobs, old, advantages = -torch.rand(2, 4), -torch.rand(2, 4), torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    for row, function in ((TokenClip, ppo_clip_loss), (SequenceClip, gspo_loss)):
        loss, stats = row(0.1, 0.3, 1.5)(logprobs, old, advantages, mask)
        expected, expected_stats = function(logprobs, old, advantages, 0.1, 0.3, loss_mask=mask, dual_clip=1.5)
        assert torch.equal(loss, expected) and stats == expected_stats, row


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_seq_mean_token_sum_norm_by_hand():
    # masked sum 1 + 2 + 4 = 7; 2 sequences * norm_length 4 -> 7 / 8 = 0.875.
    value = aggregate_loss(PER_TOKEN, MASK, "seq_mean_token_sum_norm", 3, 2, norm_length=4)
    assert value.item() == pytest.approx(0.875)
    # Without norm_length: the mask width 3 (verl's fallback) -> 7 / 6.
    assert aggregate_loss(PER_TOKEN, MASK, "seq_mean_token_sum_norm", 3, 2).item() == pytest.approx(7 / 6)
    with pytest.raises(ValueError):
        aggregate_loss(PER_TOKEN, MASK, "seq_mean_token_sum_norm", 3, 2, norm_length=0)
    # Micro-batches of one row each sum to the full batch with a constant norm_length,
    # even though their widths differ after trimming: (1 + 2) / 8 + 4 / 8 = 7 / 8.
    parts = aggregate_loss(PER_TOKEN[:1, :2], MASK[:1, :2], "seq_mean_token_sum_norm", 3, 2, norm_length=4)
    parts = parts + aggregate_loss(PER_TOKEN[1:, :1], MASK[1:, :1], "seq_mean_token_sum_norm", 3, 2, norm_length=4)
    assert parts.item() == pytest.approx(0.875)
    assert "seq_mean_token_sum_norm" in AGGREGATIONS


def test_kl_estimators_by_hand():
    # lp = 0; ref = ln 2 and -ln 2, so d = lp - ref = -ln 2 and +ln 2.
    # k1 = d: [-0.693147, 0.693147]; k2 = d^2 / 2 = 0.240227 both; k3: [0.306853, 0.193147].
    ln2 = math.log(2.0)
    lp, ref = torch.zeros(1, 2), torch.tensor([[ln2, -ln2]])
    assert torch.allclose(kl_k1(lp, ref), torch.tensor([[-ln2, ln2]]))
    assert torch.allclose(kl_k2(lp, ref), torch.tensor([[0.240227, 0.240227]]), atol=1e-6)
    assert torch.allclose(kl_k3(lp, ref), torch.tensor([[0.306853, 0.193147]]), atol=1e-6)
    assert KL_ESTIMATORS == {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


# ---------------------------------------------------------------- filters


def test_soft_overlong_penalty_dapo_formula():
    # L_max 20, L_cache 4: expected length 16. 10, 16 -> 0; 18 -> (16 - 18) / 4 = -0.5;
    # 19 -> -0.75; 20 -> -1; 21 (past the budget) -> -1.
    penalty = [soft_overlong_penalty(n, max_length=20, buffer=4) for n in (10, 16, 18, 19, 20, 21)]
    assert penalty == [0.0, 0.0, -0.5, -0.75, -1.0, -1.0]
    assert [soft_overlong_penalty(n, 20, 0) for n in (19, 20, 21)] == [0.0, 0.0, -1.0]
    with pytest.raises(ValueError):
        soft_overlong_penalty(1, 20, 21)


def test_void_turn_filter():
    # trajectory 1 has a turn with neither a call nor an answer.
    assert void_turn_filter([[True, True], [True, False], []]).tolist() == [True, False, True]


def test_first_groups_caps_the_refill():
    keep = torch.tensor([True, False, True, True])
    assert first_groups(keep, 2).tolist() == [True, False, True, False]
    assert first_groups(keep, 0).tolist() == [False] * 4
    assert first_groups(keep, 9).tolist() == keep.tolist()


# ---------------------------------------------------------------- presets


def test_presets_cover_the_issue_and_name_real_functions():
    assert set(PRESETS) == {"grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "gdpo", "gtpo", "otc"}
    for name, knobs in PRESETS.items():
        assert knobs.get("advantage", "grpo") in ESTIMATORS, name  # gtpo leaves it to its turn credit
        assert knobs["aggregation"] in AGGREGATIONS, name
        assert knobs["ratio_level"] in POLICY_LOSSES, name
        assert knobs["kl_estimator"] in KL_ESTIMATORS, name
        assert knobs["credit"] in ("outcome", "turn"), name
        assert knobs["clip_low"] >= 0 and knobs["clip_high"] >= 0
    assert PRESETS["dapo"]["clip_high"] == 0.28 and PRESETS["dapo"]["dynamic_sampling"] is True
    assert PRESETS["gspo"]["ratio_level"] == "sequence" and PRESETS["gspo"]["clip_high"] == 4e-4
    assert PRESETS["dr_grpo"]["aggregation"] == "seq_mean_token_sum_norm"
    assert PRESETS["gdpo"]["advantage"] == "gdpo" and PRESETS["gtpo"]["credit"] == "turn"
    assert REWARDS["dapo"] == {"overlong_buffer": 0.2, "overlong_penalty": 1.0}
    assert REWARDS["otc"]["weights"]["otc_reward"] == 1.0 and set(REWARDS) == set(PRESETS)


def test_explicit_knobs_win_over_the_preset():
    sections = apply_preset("dapo", {"algorithm": {"clip_high": 0.3, "beta": 0.01}, "rewards": {"overlong_penalty": 0.5}})
    knobs = sections["algorithm"]
    assert knobs["clip_high"] == 0.3 and knobs["beta"] == 0.01
    assert knobs["aggregation"] == "token_mean"  # untouched knobs keep the preset's value
    assert sections["rewards"] == {"overlong_buffer": 0.2, "overlong_penalty": 0.5}
    assert PRESETS["dapo"]["clip_high"] == 0.28  # the table itself is not modified
    with pytest.raises(ValueError, match="dapo"):
        apply_preset("ppo", {})


def test_the_algorithm_objective_wires_loss_kl_and_aggregation_by_hand():
    algorithm = Algorithm.named(
        "grpo", "token", "k1", "token_mean", clip_low=0.2, clip_high=0.2, dual_clip=None, beta=0.5, loss_norm_length=10
    )
    # Ratio 1 (logprobs == old), A = 2: the surrogate is -2 on both tokens. k1 = lp - ref = [1, -5],
    # times beta 0.5 -> [-1.5, -4.5]. Only token 0 is masked in: token_mean = -1.5 / 1.
    # The KL stat is the masked sum: 1.
    zeros = torch.zeros(1, 2)
    loss, stats = algorithm.objective(zeros, zeros, torch.tensor([2.0]), torch.tensor([[1.0, 0.0]]),
                                      torch.tensor([[-1.0, 5.0]]), total_tokens=1.0, total_sequences=1.0)
    assert loss.item() == pytest.approx(-1.5) and stats["kl_sum"] == 1.0 and stats["clip_fraction"] == 0.0
    # beta 0: the KL is measured, not in the loss; no reference: no KL stat at all.
    no_kl = Algorithm.named("grpo", "token", "k1", "token_mean", clip_low=0.2, clip_high=0.2, dual_clip=None, beta=0.0, loss_norm_length=10)
    loss, stats = no_kl.objective(zeros, zeros, torch.tensor([2.0]), torch.tensor([[1.0, 0.0]]), torch.tensor([[-1.0, 5.0]]), 1.0, 1.0)
    assert loss.item() == pytest.approx(-2.0) and stats["kl_sum"] == 1.0
    assert "kl_sum" not in no_kl.objective(zeros, zeros, torch.tensor([2.0]), torch.ones(1, 2), None, 2.0, 1.0)[1]
