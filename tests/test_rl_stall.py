"""RL from a model that never earns a varied reward has nothing to learn from: after
max_idle_steps such steps in a row it stops with a user error that says what to do, and
leaves its run folder (config, metrics, checkpoints) whole."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from toolpolicy.build import prepare_run_dir
from toolpolicy.cli import main
from toolpolicy.build import load_config
from toolpolicy.trainer.checkpoint import latest_checkpoint
from toolpolicy.trainer import rl
from toolpolicy.trainer.rl import TrainingStalled, train_rl
from toolpolicy.trainer.groups import StepRollouts

from conftest import SMOKE

# Scored on the answer alone: the format terms of calc's default Rubric would vary
# with an untrained model's random tool-call tokens and give its groups a signal.
ANSWER_ONLY = "rewards.weights={correct_answer: 1.0}"


def _settings(untrained: Path, run_dir: Path, *overrides: str) -> list[str]:
    return [f"rl.init_from={untrained}", ANSWER_ONLY, "rollout.max_tokens=64", "run.checkpoint_every=1", f"run.dir={run_dir}", *overrides]


def _train(settings: list[str]) -> int:
    return main(["train", str(SMOKE), *(arg for setting in settings for arg in ("--set", setting))])


def test_rl_with_no_reward_signal_stops_and_keeps_its_run_folder(untrained: Path, tmp_path: Path) -> None:
    cfg = load_config(SMOKE, _settings(untrained, tmp_path / "run", "rl.steps=6", "rl.max_idle_steps=2"))
    with pytest.raises(TrainingStalled) as stalled:
        train_rl(cfg, prepare_run_dir(cfg))
    message = str(stalled.value)
    assert "\n" not in message and message.startswith("2 steps in a row had no group with a reward signal")
    for advice in ("never produces a scorable, varied answer", "`toolpolicy sft`, then set rl.init_from", "raise rl.temperature"):
        assert advice in message
    run_dir = tmp_path / "run"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["signal_groups"]) for r in rows] == [(1, 0), (2, 0)]
    assert load_config(run_dir / "config.yaml") == cfg
    assert latest_checkpoint(run_dir / "rl") == run_dir / "rl" / "checkpoints" / "step_000002"  # whole: a resume can start from it


def test_a_step_with_a_signal_starts_the_count_again(untrained: Path, tmp_path: Path, monkeypatch) -> None:
    sampled = rl.sample_groups

    def signal_on_step_2(pool, rubric, credit, sampling, step: int, first=None, replay=None) -> StepRollouts:
        rollouts = sampled(pool, rubric, credit, sampling, step, first, replay)
        second = step == 1  # steps count from 0 here, from 1 in the metrics
        return replace(rollouts, signal=torch.full_like(rollouts.signal, second), groups=torch.full_like(rollouts.groups, second))

    monkeypatch.setattr(rl, "sample_groups", signal_on_step_2)
    cfg = load_config(SMOKE, _settings(untrained, tmp_path / "run", "rl.steps=6", "rl.max_idle_steps=2"))
    with pytest.raises(TrainingStalled, match="^2 steps in a row"):
        train_rl(cfg, prepare_run_dir(cfg))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["signal_groups"] > 0 for r in rows] == [False, True, False, False]  # idle 1, 0, 1, 2: stop


def test_a_step_that_trains_nothing_leaves_the_lr_schedule_where_it_is(untrained: Path, tmp_path: Path, monkeypatch) -> None:
    """The warm-up counts optimizer steps. Stepping the schedule on a step that took none would
    also make torch warn "lr_scheduler.step() before optimizer.step()" on every such run."""
    sampled = rl.sample_groups

    def groups_from_step_2(pool, rubric, credit, sampling, step: int, first=None, replay=None) -> StepRollouts:
        rollouts = sampled(pool, rubric, credit, sampling, step, first, replay)
        kept = step >= 1  # steps count from 0 here, from 1 in the metrics
        return replace(rollouts, signal=torch.full_like(rollouts.signal, kept), groups=torch.full_like(rollouts.groups, kept))

    monkeypatch.setattr(rl, "sample_groups", groups_from_step_2)
    cfg = load_config(SMOKE, _settings(untrained, tmp_path / "run", "rl.steps=3", "rl.max_idle_steps=0", "rl.warmup_steps=4"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_rl(cfg, prepare_run_dir(cfg))
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # Warm-up factor (optimizer steps taken + 1) / 4: step 1 takes none, steps 2 and 3 one each.
    assert [r["trained_episodes"] > 0 for r in rows] == [False, True, True]
    assert [r["lr"] for r in rows] == pytest.approx([cfg.rl.lr / 4, cfg.rl.lr / 4, cfg.rl.lr / 2])


def test_a_cosine_schedule_falls_to_a_tenth_over_the_planned_optimizer_steps(untrained: Path, tmp_path: Path, monkeypatch) -> None:
    """rl.lr_schedule: cosine counts optimizer steps, two a batch here: 3 steps plan 6, and
    each step logs the LR of its first, cos-decayed from lr toward lr / 10 at the sixth."""
    sampled = rl.sample_groups

    def every_group_kept(pool, rubric, credit, sampling, step: int, first=None, replay=None) -> StepRollouts:
        rollouts = sampled(pool, rubric, credit, sampling, step, first, replay)
        return replace(rollouts, signal=torch.ones_like(rollouts.signal), groups=torch.ones_like(rollouts.groups))

    monkeypatch.setattr(rl, "sample_groups", every_group_kept)
    settings = ["rl.steps=3", "rl.max_idle_steps=0", "rl.lr_schedule=cosine", "algorithm.mini_batches=2"]
    cfg = load_config(SMOKE, _settings(untrained, tmp_path / "run", *settings))
    train_rl(cfg, prepare_run_dir(cfg))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["optimizer_steps"] for r in rows] == [2, 2, 2]
    # Before optimizer steps 0, 2, 4 of 6: 0.1 + 0.9 (1 + cos(pi k / 6)) / 2 = 1, 0.775, 0.325.
    assert [r["lr"] for r in rows] == pytest.approx([cfg.rl.lr, cfg.rl.lr * 0.775, cfg.rl.lr * 0.325])


def test_the_cli_reports_a_stall_in_one_line_and_zero_turns_the_stop_off(untrained: Path, tmp_path: Path, capsys) -> None:
    assert _train(_settings(untrained, tmp_path / "stalls", "rl.steps=3", "rl.max_idle_steps=2")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("toolpolicy train: error: 2 steps in a row had no group with a reward signal")
    assert _train(_settings(untrained, tmp_path / "runs_on", "rl.steps=2", "rl.max_idle_steps=0")) == 0
    assert (tmp_path / "runs_on" / "rl" / "final" / "model.safetensors").is_file()
