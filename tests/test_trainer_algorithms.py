"""The algorithm presets and knobs, wired into the RL trainer: each preset takes gradient steps;
the reward matrix, GDPO, turn credit and the filters as the trainer calls them, by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pytest
import torch
from annotated_types import Gt
from safetensors.torch import load_file

from toolpolicy.algorithms import PRESETS
from toolpolicy.cli import main
from toolpolicy.build import load_config
from toolpolicy.config import ConfigError
from toolpolicy.envs import ENVS
from toolpolicy.rewards import Rubric, Score
from toolpolicy.rollout import Trajectory
from toolpolicy.trainer.credit import productive_turns, reward_matrix, update_mask
from toolpolicy.build import build_rubric
from toolpolicy.trainer.update import algorithm_of
from toolpolicy.types import Episode, Event, Message, Task

SMOKE = Path(__file__).parent.parent / "src" / "toolpolicy" / "configs" / "smoke.yaml"


def test_a_preset_fills_the_knobs_the_config_leaves_unset() -> None:
    cfg = load_config(SMOKE, ["algorithm.preset=dr_grpo", "algorithm.clip_high=0.3"])
    assert cfg.algorithm.advantage == "dr_grpo" and cfg.algorithm.aggregation == "seq_mean_token_sum_norm"
    assert cfg.algorithm.clip_high == 0.3  # set explicitly: wins over the preset's 0.2
    assert cfg.algorithm.loss_norm_length == cfg.rollout.max_tokens  # its own field, written in from the episode budget
    assert load_config(SMOKE, ["algorithm.preset=otc"]).rewards.weights["otc_reward"] == 1.0
    assert load_config(SMOKE, ["algorithm.preset=dapo"]).rewards.overlong_penalty == 1.0  # the preset's rewards fields too
    assert load_config(SMOKE, ["algorithm.preset=dapo", "rewards.overlong_penalty=0.5"]).rewards.overlong_penalty == 0.5
    with pytest.raises(ConfigError, match="field 'algorithm.preset': unknown algorithm preset 'ppo'"):
        load_config(SMOKE, ["algorithm.preset=ppo"])
    with pytest.raises(ConfigError, match="algorithm.dual_clip"):
        load_config(SMOKE, ["algorithm.dual_clip=0.5"])
    with pytest.raises(ConfigError, match="field 'env.name': 'adder': no environment of that name"):
        load_config(SMOKE, ["env=adder"])
    with pytest.raises(ConfigError, match="field 'algorithm.turn_rewards'.*'tool_cal'"):
        load_config(SMOKE, ["algorithm.turn_rewards={tool_cal: 0.1}"])
    with pytest.raises(ConfigError, match="algorithm.credit: turn .* algorithm.advantage 'rloo' would be ignored"):
        load_config(SMOKE, ["algorithm.preset=gtpo", "algorithm.advantage=rloo"])
    assert load_config(SMOKE, ["algorithm.preset=gtpo"]).algorithm.credit == "turn"


CALC_SFT = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"  # right on about 65% of tasks


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_every_preset_takes_gradient_steps(algorithm: str, tmp_path: Path) -> None:
    start = CALC_SFT  # a cold start whose groups vary, so every estimator has something to learn from
    args = ["train", str(SMOKE), "--set", f"rl.init_from={start}", "--set", f"algorithm.preset={algorithm}",
            "--set", "rl.steps=2", "--set", f"run.dir={tmp_path}", "--set", "run.checkpoint_every=2"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    cfg = load_config(tmp_path / "config.yaml")
    assert cfg.algorithm.preset == algorithm  # the resolved config records it
    for r in rows:
        assert r["refill_rounds"] <= cfg.algorithm.max_refill_rounds
        assert r["signal_groups"] <= r["kept_groups"]
        if r["signal_groups"]:  # a kept group with a signal trains: a finite loss, a nonzero gradient
            assert r["trained_episodes"] > 0 and r["grad_norm"] > 0 and abs(r["loss"]) < 1e3
            # the update's log-probabilities of the rollout's own tokens: the ratio is 1, nothing is clipped
            assert abs(r["ratio_mean"] - 1) < 1e-4 and r["ratio_max"] < 1 + 1e-3 and r["clip_fraction"] == 0.0
    assert sum(r["signal_groups"] for r in rows) > 0, "no step of this preset had a group to learn from"
    before, after = load_file(start / "model.safetensors"), load_file(tmp_path / "rl" / "final" / "model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before), "the weights did not change"


@pytest.mark.parametrize("algorithm", ["dapo", "gspo"])
def test_several_optimizer_steps_per_batch_move_the_ratio_and_the_clip_acts(algorithm: str, tmp_path: Path) -> None:
    """mini_batches 2 x update_passes 2: four optimizer steps a batch, of which the last three
    train a policy that has moved since it sampled, so the ratio leaves 1 and some tokens clip
    (GSPO's sequence clip, narrow as in its paper, clips whole sequences)."""
    args = ["train", str(SMOKE), "--set", f"rl.init_from={CALC_SFT}", "--set", f"algorithm.preset={algorithm}", "--set", "rl.steps=2",
            "--set", f"run.dir={tmp_path}", "--set", "algorithm.mini_batches=2", "--set", "algorithm.update_passes=2", "--set", "rl.lr=0.001"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["trained_episodes"]]
    assert trained and all(r["optimizer_steps"] == min(2, r["kept_groups"]) * 2 for r in trained), rows
    assert all(r["lr"] == 0.001 for r in rows)
    assert max(r["ratio_max"] for r in trained) > 1.01 and max(r["clip_fraction"] for r in trained) > 0


def test_the_variants_constants_are_flat_keys_of_the_algorithm_section_typed_by_their_variants(tmp_path) -> None:
    """clip_low, tis_cap, loss_norm_length, ...: declared by the variants of the algorithm tables,
    checked by their declarations, each one's value written into the resolved config."""
    from dataclasses import fields

    from toolpolicy.algorithms import SequenceClip, TokenClip
    from toolpolicy.checks import algorithm_options, describe_options
    from toolpolicy.config import AlgorithmSection, save_config

    options = algorithm_options()
    assert set(options) == {"clip_low", "clip_high", "dual_clip", "loss_norm_length", "tis_cap"}
    assert not set(options) & set(AlgorithmSection.model_fields)  # a flat key is a field or a constant, never both
    assert fields(SequenceClip) == fields(TokenClip)  # the two ratio levels share one declaration of the clip
    cfg = load_config(SMOKE)
    assert cfg.algorithm.options == {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": None, "loss_norm_length": cfg.rollout.max_tokens, "tis_cap": 2.0}
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml").algorithm.options == cfg.algorithm.options
    with pytest.raises(ConfigError) as error:
        load_config(SMOKE, ["algorithm.clip_hgh=0.3", "algorithm.tis_cap=1", "algorithm.loss_norm_length=long"])
    for problem in (
        "field 'algorithm.clip_hgh': unknown field; did you mean 'algorithm.clip_high'",
        "field 'algorithm.tis_cap': Input should be greater than 1 (got 1)",
        "field 'algorithm.loss_norm_length': Input should be a valid integer",
    ):
        assert problem in str(error.value), problem
    assert "algorithm.tis_cap: float = 2.0  (of tis)" in describe_options()
    algorithm, _, _ = algorithm_of(load_config(SMOKE, ["algorithm.ratio_level=sequence", "algorithm.dual_clip=3"]).algorithm)
    assert algorithm.policy_loss == SequenceClip(0.2, 0.28, 3.0)


def _trajectory(turn_spans: list[tuple[int, int]], events: list[Event], length: int, truncated: bool = False) -> Trajectory:
    episode = Episode(Task("t", "q", "a"), [], events, truncated=truncated)
    mask = [0] * length
    for start, end in turn_spans:
        mask[start:end] = [1] * (end - start)
    return Trajectory(list(range(length)), mask, [0.0] * length, turn_spans[0][0], episode, turn_spans)


def test_turn_credit_lands_on_each_turns_tokens_and_filters_apply() -> None:
    cfg = load_config(SMOKE, ["algorithm.preset=gtpo", "rl.group_size=2", "algorithm.turn_gamma=1.0", "algorithm.mask_truncated=true"])
    _, credit, filters = algorithm_of(cfg.algorithm)
    calls = [Event("tool_call", 0, "calculator")]
    good = _trajectory([(3, 5), (7, 9)], calls, 10)  # calls on turn 0, answers on turn 1
    void = _trajectory([(3, 5), (7, 9)], [], 10, truncated=True)  # turn 0 did nothing, then cut off
    rubric = Rubric.from_weights({"correct_answer": 1.0})
    scores = [Score(1.0, {"correct_answer": 1.0}), Score(0.0, {"correct_answer": 0.0})]
    usable = torch.tensor([True, True])
    rewards, weights = reward_matrix(rubric, scores, usable, 2)
    advantages = credit.advantages([good, void], rewards, weights, 2, torch.tensor([True]))
    assert advantages.shape == (2, 9)
    # turn rewards: good [0.1, 1] -> returns [1.1, 1]; void [0, 0] -> [0, 0]. Pooled mean 0.525,
    # unbiased std 0.6076: good's turns (1.1 - 0.525) / 0.6076 = 0.9463 and 0.7817; void's -0.8641.
    # Position t of the row predicts token t + 1, so turn [3, 5) sits at 2:4 and [7, 9) at 6:8.
    assert advantages[0, 2:4].tolist() == pytest.approx([0.9463, 0.9463], abs=1e-4)
    assert advantages[0, 6:8].tolist() == pytest.approx([0.7817, 0.7817], abs=1e-4)
    assert advantages[1, 2:4].tolist() == pytest.approx([-0.8641, -0.8641], abs=1e-4)
    assert advantages[0, 4:6].abs().sum() == 0  # tool output between the turns gets nothing
    assert credit.signal([good, void], rewards, weights, 2).tolist() == [True]
    assert productive_turns(good) == [True, True] and productive_turns(void) == [False, False]
    keep = update_mask([good, void], torch.tensor([True]), torch.tensor([True, True]), 2, filters)
    assert keep.tolist() == [True, False]  # the truncated, void episode is left out
    assert update_mask([good, void], torch.tensor([True]), torch.tensor([True, True]), 2, ()).tolist() == [True, True]


def test_gdpo_as_the_trainer_computes_it_by_hand() -> None:
    """The trainer's path: Rubric scores -> reward matrix (infra-filled) -> GDPO's credit."""
    cfg = load_config(SMOKE, ["algorithm.preset=gdpo", "rl.group_size=2"])
    _, credit, _ = algorithm_of(cfg.algorithm)
    rubric = Rubric.from_weights({"correct_answer": 1.0, "excess_tool_calls": -0.5, "tool_call_count": 0.0})
    # Group 0: A right with 2 needless calls (total 0), B wrong with none (total 0): GRPO sees a tie.
    # Group 1: C right, D right with 1 needless call (totals 1, 0.5). Group 2: E right, F an
    # infrastructure failure (its row is filled with E's, so the group is constant).
    rows = [(1, 2, 2), (0, 0, 0), (1, 0, 0), (1, 1, 1), (1, 0, 0), (0, 0, 0)]
    scores = [Score(c - 0.5 * x, {"correct_answer": c, "excess_tool_calls": x, "tool_call_count": n}) for c, x, n in rows]
    usable = torch.tensor([True, True, True, True, True, False])
    rewards, weights = reward_matrix(rubric, scores, usable, 2)
    assert rewards[5].tolist() == [1.0, 0.0, 0.0] and weights.tolist() == [1.0, -0.5, 0.0]
    assert (rewards @ weights).tolist() == [0.0, 0.0, 1.0, 0.5, 1.0, 1.0]  # the Rubric totals
    # Per component within each group (two samples: normalised values are +-0.70711 or 0):
    #   group 0: correct [1, 0] -> [+s, -s]; excess [2, 0] -> [+s, -s], weight -0.5 -> [-s/2, +s/2]
    #            sum [s/2, -s/2] = [0.35355, -0.35355]
    #   group 1: correct [1, 1] -> 0; excess [0, 1] -> [-s, +s] * -0.5 = [0.35355, -0.35355]
    #   group 2: constant -> [0, 0]. The metric column (weight 0) adds nothing.
    # Batch norm: mean 0; sum of squares 4 * 0.125 = 0.5; unbiased var 0.5 / 5 = 0.1, std 0.316228:
    # 0.35355 / 0.316228 = 1.118034.
    episodes = [_trajectory([(1, 2)], [], 3)] * 6
    advantages = credit.advantages(episodes, rewards, weights, 2, torch.tensor([True, True, True]))
    assert advantages.tolist() == pytest.approx([1.118034, -1.118034, 1.118034, -1.118034, 0.0, 0.0], abs=1e-5)
    assert credit.signal([], rewards, weights, 2).tolist() == [True, True, False]
    # What trains is the groups with a signal (dynamic sampling drops group 2), and the batch norm
    # is over those alone: sum of squares 0.5 over 4 rows, unbiased var 0.5 / 3, std 0.408248:
    # 0.35355 / 0.408248 = 0.866025 (over all six rows it was 1.118034).
    advantages = credit.advantages(episodes, rewards, weights, 2, torch.tensor([True, True, False]))
    assert advantages.tolist() == pytest.approx([0.866025, -0.866025, 0.866025, -0.866025, 0.0, 0.0], abs=1e-5)


def test_the_overlong_penalty_is_a_rubric_term() -> None:
    cfg = load_config(SMOKE, ["algorithm.preset=dapo", "rollout.max_tokens=20", "rewards.overlong_buffer=0.2"])
    rubric = build_rubric(cfg.rewards, {"correct_answer": 1.0})
    assert [(t.name, t.weight) for t in rubric.terms] == [("correct_answer", 1.0), ("overlong", 1.0)]
    # L_max 20, buffer int(0.2 * 20) = 4: 18 response tokens -> (16 - 18) / 4 = -0.5; right answer 1.
    episode = Episode(Task("t", "q", "4"), [Message("assistant", "Answer: 4")], response_tokens=18)
    score = rubric.score(episode)
    assert score.components == {"correct_answer": 1.0, "overlong": -0.5} and score.total == 0.5
    assert [t.name for t in build_rubric(load_config(SMOKE, ["algorithm.preset=grpo"]).rewards, {"correct_answer": 1.0}).terms] == ["correct_answer"]
    longer = build_rubric(load_config(SMOKE, ["algorithm.preset=dapo", "rollout.max_tokens=20", "rewards.overlong_length=40"]).rewards, {})
    assert longer.score(episode).components["overlong"] == 0.0  # L_max 40, buffer 8: 18 is far below 32


def test_ablate_runs_presets_and_seeds_and_writes_the_table(smoke_run: Path, tmp_path: Path, capsys) -> None:
    args = ["ablate", str(SMOKE), "--set", f"rl.init_from={smoke_run / 'sft' / 'final'}", "--set", "rl.steps=2",
            "--set", f"run.dir={tmp_path}", "--presets", "grpo,dr_grpo", "--seeds", "0,1", "--jobs", "2"]
    assert main(args) == 0
    results = json.loads((tmp_path / "ablation.json").read_text())
    assert [(r["preset"], r["seed"]) for r in results] == [("grpo", 0), ("grpo", 1), ("dr_grpo", 0), ("dr_grpo", 1)]
    assert all(len(r["reward_curve"]) == 2 and r["figures"]["accuracy"] is not None for r in results)
    assert load_config(tmp_path / "dr_grpo-s1" / "config.yaml").algorithm.aggregation == "seq_mean_token_sum_norm"
    assert (tmp_path / "ablation.png").stat().st_size > 10_000
    assert "| grpo |" in capsys.readouterr().out
    assert main(["ablate", str(SMOKE), "--set", f"run.dir={tmp_path}", "--presets", "grpo"]) == 2  # no init_from


def test_ablation_table_keeps_only_the_figures_some_run_reports() -> None:
    from toolpolicy.ablation import FIGURES, ablation_table, figure

    summary = {"accuracy": 0.5, "invalid_call_rate": 0.1, "violations_per_episode": 0.25, "tool_calls_per_episode": 3.0,
               "pass_hat_k": {"1": 0.5, "4": 0.125}, "by_difficulty": {"all": {"accuracy": 0.5}}}
    figures = {label: figure(summary, key, group) for label, key, group in FIGURES}
    assert figures["pass^4"] == 0.125 and figures["violation attempts"] == 0.25 and figures["accuracy hard"] is None
    other = {**figures, "accuracy": 0.75, "violation attempts": 0.75}
    results = [{"preset": "grpo", "seed": s, "minutes": 1.0, "figures": f} for s, f in enumerate((figures, other))]
    table = ablation_table(results, ["grpo"], load_config(SMOKE))
    header, _, row = table.splitlines()[2:5]
    assert header == "| preset | accuracy | pass^4 | invalid-call rate | violation attempts | minutes | within noise of best |"
    assert row == "| grpo | 62.5% (50.0..75.0) | 12.5% (12.5..12.5) | 10.0% (10.0..10.0) | 0.50 (0.25..0.75) | 1.0 | best |"


@pytest.mark.parametrize("path", sorted(SMOKE.parent.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.env.name in ENVS


def test_at_one_step_gspo_is_grpo_without_kl_and_rloo_is_dr_grpo_scaled() -> None:
    """At ratio 1 (one optimizer step per batch) GSPO's sequence-ratio gradient is the
    per-sequence mean of the token gradients, which grpo's aggregation takes; RLOO's
    leave-one-out advantage is G/(G-1) times Dr.GRPO's, with the same constant-length sum."""
    group = 4
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(2 * group, 1, generator=g, dtype=torch.float64)  # [B, C]: two groups, one component
    old = -torch.rand(2 * group, 6, generator=g, dtype=torch.float64) * 3  # [B, T]
    lengths = torch.tensor([6, 4, 3, 1, 5, 6, 2, 4])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).long()  # [B, T]

    def gradient(preset: str, *overrides: str) -> torch.Tensor:  # [B, T]
        cfg = load_config(None, [f"algorithm.preset={preset}", *overrides])
        algorithm, _, _ = algorithm_of(cfg.algorithm)
        advantages = algorithm.estimator.advantages(rewards, torch.ones(1, dtype=torch.float64), group)  # [B]
        leaf = old.clone().requires_grad_(True)
        loss, _ = algorithm.objective(leaf, old, advantages, mask, None, float(mask.sum()), float(len(lengths)))
        loss.backward()
        return leaf.grad

    assert torch.allclose(gradient("gspo"), gradient("grpo", "algorithm.beta=0"), atol=1e-12)
    assert torch.allclose(gradient("rloo"), group / (group - 1) * gradient("dr_grpo"), atol=1e-12)
    # Not vacuous: the other presets' gradients differ.
    assert not torch.allclose(gradient("grpo", "algorithm.beta=0"), gradient("dr_grpo"), atol=1e-6)
    assert not torch.allclose(gradient("gspo"), gradient("dapo"), atol=1e-6)


def test_a_new_estimator_is_one_entry_in_its_table(monkeypatch) -> None:
    """docs/architecture.md: an estimator is a function and an entry of ESTIMATORS; the config
    checks and the trainer find it there, with nothing else to change."""
    from toolpolicy.algorithms import advantages

    def centred(rewards: torch.Tensor, group_size: int) -> torch.Tensor:  # [B] -> [B]
        return rewards - rewards.view(-1, group_size).mean(dim=1).repeat_interleave(group_size)

    with pytest.raises(ConfigError, match="field 'algorithm.advantage': unknown 'centred'"):
        load_config(SMOKE, ["algorithm.advantage=centred"])
    estimator = advantages.Estimator(advantages.on_total(centred), advantages.on_total(advantages.varied_groups))
    monkeypatch.setitem(advantages.ESTIMATORS, "centred", estimator)
    algorithm, _, _ = algorithm_of(load_config(SMOKE, ["algorithm.advantage=centred"]).algorithm)
    assert algorithm.estimator is estimator


def test_a_new_policy_loss_with_a_constant_of_its_own_is_one_row_in_its_table(monkeypatch) -> None:
    """A loss with a new constant: a frozen dataclass of it, called as the loss, and a row of
    POLICY_LOSSES (its annotations resolve in its module, as a dataclass's do). The config then takes the constant as algorithm.NAME, typed and documented by
    the dataclass, and the trainer builds the loss with it; nothing else changes."""
    from dataclasses import dataclass

    from toolpolicy.algorithms import losses
    from toolpolicy.checks import describe_options

    @dataclass(frozen=True)
    class ScaledClip(losses.TokenClip):
        scale: Annotated[float, Gt(0)] = 1.0
        """How much the clipped loss is scaled."""

        def __call__(self, logprobs, old_logprobs, advantages, loss_mask):
            per_token, stats = super().__call__(logprobs, old_logprobs, advantages, loss_mask)
            return self.scale * per_token, stats

    with pytest.raises(ConfigError, match="field 'algorithm.scale': unknown field"):
        load_config(SMOKE, ["algorithm.scale=2"])
    monkeypatch.setitem(losses.POLICY_LOSSES, "scaled", ScaledClip)
    algorithm, _, _ = algorithm_of(load_config(SMOKE, ["algorithm.ratio_level=scaled", "algorithm.scale=2"]).algorithm)
    assert algorithm.policy_loss == ScaledClip(0.2, 0.28, None, 2.0)
    assert "algorithm.scale: float = 1.0  (of scaled)\n        How much the clipped loss is scaled." in describe_options()
    with pytest.raises(ConfigError, match=r"field 'algorithm.scale': Input should be greater than 0 \(got -1\)"):
        load_config(SMOKE, ["algorithm.scale=-1"])
