"""The algorithm presets and knobs, wired into the RL trainer: each preset trains a step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from toolpolicy.algorithms import PRESETS
from toolpolicy.cli import main
from toolpolicy.rewards import Rubric
from toolpolicy.rollout import Trajectory
from toolpolicy.trainer.config import ConfigError, load_config
from toolpolicy.trainer.credit import Credit, productive_turns, step_rewards, update_mask
from toolpolicy.types import Episode, Event, Task

SMOKE = Path(__file__).parent.parent / "src" / "toolpolicy" / "configs" / "smoke.yaml"


def test_a_preset_fills_the_knobs_the_config_leaves_unset() -> None:
    cfg = load_config(SMOKE, ["algorithm=dr_grpo", "clip_high=0.3"])
    assert cfg.advantage == "dr_grpo" and cfg.aggregation == "seq_mean_token_sum_norm"
    assert cfg.clip_high == 0.3  # set explicitly: wins over the preset's 0.2
    assert load_config(SMOKE, ["algorithm=otc"]).rewards["otc_reward"] == 1.0
    with pytest.raises(ConfigError, match="field 'algorithm': unknown algorithm preset 'ppo'"):
        load_config(SMOKE, ["algorithm=ppo"])
    with pytest.raises(ConfigError, match="dual_clip"):
        load_config(SMOKE, ["dual_clip=0.5"])


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_every_preset_trains(algorithm: str, smoke_run: Path, tmp_path: Path) -> None:
    args = ["train", str(SMOKE), "--set", f"init_from={smoke_run / 'sft' / 'final'}", "--set", f"algorithm={algorithm}",
            "--set", "rl_steps=2", "--set", f"run_dir={tmp_path}", "--set", "checkpoint_every=2"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(abs(r.get("loss", 0.0)) < 1e3 and r["refill_rounds"] <= load_config(tmp_path / "config.yaml").max_refill_rounds for r in rows)
    assert load_config(tmp_path / "config.yaml").algorithm == algorithm  # the resolved config records it


def _trajectory(turn_spans: list[tuple[int, int]], events: list[Event], length: int, truncated: bool = False) -> Trajectory:
    episode = Episode(Task("t", "q", "a"), [], events, truncated=truncated)
    mask = [0] * length
    for start, end in turn_spans:
        mask[start:end] = [1] * (end - start)
    return Trajectory(list(range(length)), mask, [0.0] * length, turn_spans[0][0], episode, turn_spans)


def test_turn_credit_lands_on_each_turns_tokens_and_filters_apply() -> None:
    cfg = load_config(SMOKE, ["algorithm=gtpo", "group_size=2", "turn_gamma=1.0", "mask_truncated=true"])
    calls = [Event("tool_call", 0, "calculator")]
    good = _trajectory([(3, 5), (7, 9)], calls, 10)  # calls on turn 0, answers on turn 1
    void = _trajectory([(3, 5), (7, 9)], [], 10, truncated=True)  # turn 0 did nothing, then cut off
    from toolpolicy.rewards import Score

    scores = [Score(1.0, {"correct_answer": 1.0}), Score(0.0, {"correct_answer": 0.0})]
    usable = torch.tensor([True, True])
    rewards = step_rewards([good, void], scores, usable, cfg)
    advantages = Credit(cfg, Rubric.from_weights({"correct_answer": 1.0}))([good, void], scores, rewards, usable)
    assert advantages.shape == (2, 9)
    # returns: good (0.1 + 1, 1), void (0, 0): pooled mean 0.525 -> good's turns positive, void's negative
    assert (advantages[0, 2:4] > 0).all() and (advantages[0, 6:8] > 0).all() and (advantages[1, 2:4] < 0).all()
    assert advantages[0, 4:6].abs().sum() == 0  # tool output between the turns gets nothing
    assert productive_turns(good) == [True, True] and productive_turns(void) == [False, False]
    keep = update_mask([good, void], torch.tensor([True]), torch.tensor([True, True]), cfg)
    assert keep.tolist() == [True, False]  # the truncated, void episode is left out


def test_ablate_runs_presets_and_seeds_and_writes_the_table(smoke_run: Path, tmp_path: Path, capsys) -> None:
    args = ["ablate", str(SMOKE), "--set", f"init_from={smoke_run / 'sft' / 'final'}", "--set", "rl_steps=2",
            "--set", f"run_dir={tmp_path}", "--presets", "grpo,dr_grpo", "--seeds", "0,1", "--jobs", "2"]
    assert main(args) == 0
    results = json.loads((tmp_path / "ablation.json").read_text())
    assert [(r["preset"], r["seed"]) for r in results] == [("grpo", 0), ("grpo", 1), ("dr_grpo", 0), ("dr_grpo", 1)]
    assert all(len(r["reward_curve"]) == 2 and r["figures"]["accuracy"] is not None for r in results)
    assert load_config(tmp_path / "dr_grpo-s1" / "config.yaml").aggregation == "seq_mean_token_sum_norm"
    assert (tmp_path / "ablation.png").stat().st_size > 10_000
    assert "| grpo |" in capsys.readouterr().out
    assert main(["ablate", str(SMOKE), "--set", f"run_dir={tmp_path}", "--presets", "grpo"]) == 2  # no init_from


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
    assert cfg.env in ("calc", "hotel")
