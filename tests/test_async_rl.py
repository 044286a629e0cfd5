"""Async RL (`max_staleness: k`): a step's episodes are sampled by a copy of the policy that
is k updates behind, while the trainer updates its own. Checked exactly: with k = 1 the
episodes of step 3 are the ones a synchronous sampler draws from the weights after step 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from toolpolicy.build import build_rubric, load_policy_model
from toolpolicy.cli import main
from toolpolicy.build import load_config
from toolpolicy.config import ConfigError
from toolpolicy.rewards import REWARD_FUNCTIONS
from toolpolicy.trainer.distributed import World
from toolpolicy.trainer.groups import Sampling, sample_groups
from toolpolicy.trainer.update import algorithm_of
from toolpolicy.trainer.step_metrics import rollout_metrics
from toolpolicy.trainer.rollouts import LocalRollouts, open_engine

from conftest import SMOKE

CALC_SFT = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"
RUN = [
    f"rl.init_from={CALC_SFT}", "rl.steps=3", "run.checkpoint_every=1", "run.keep_checkpoints=5", "rl.sampling_streams=episode",
    "algorithm.dynamic_sampling=false",
]


def train(run_dir: Path, *settings: str) -> list[dict]:
    args = [a for s in [*RUN, f"run.dir={run_dir}", *settings] for a in ("--set", s)]
    assert main(["train", str(SMOKE), *args]) == 0
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_behind(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("async") / "k1"
    train(run_dir, "rl.max_staleness=1")
    return run_dir


def test_a_step_samples_from_the_weights_one_update_behind(one_behind: Path):
    rows = [json.loads(line) for line in (one_behind / "metrics.jsonl").read_text().splitlines()]
    assert [r["staleness"] for r in rows] == [0, 1, 1]
    # Step 3 (index 2) again, synchronously, from the checkpoint after step 1: the same episodes.
    cfg = load_config(SMOKE, [*RUN, f"run.dir={one_behind / 'replay'}"])
    policy = load_policy_model(cfg.model, one_behind / "rl" / "checkpoints" / "step_000001")
    engine = open_engine(cfg, policy, torch.Generator().manual_seed(cfg.run.seed), one_behind / "replay", "", {})
    pool = LocalRollouts(engine, build_rubric(cfg.rewards, engine.env.default_rewards), World())
    _, credit, _ = algorithm_of(cfg.algorithm)
    sampling = Sampling(cfg.rl.prompts_per_step, cfg.rl.group_size, False, 0, cfg.run.seed, episode_streams=True)
    with torch.no_grad():
        replayed = sample_groups(pool, pool.rubric, credit, sampling, 2)
    pool.close()
    expected = rollout_metrics(replayed.trajectories, replayed.scores, REWARD_FUNCTIONS[engine.env.success_reward])
    for key in ("reward", "accuracy", "tool_calls", "response_tokens"):
        assert rows[2][key] == expected[key], key
    # ... and not the ones the weights after step 2 draw: the lag is real.
    fresh = load_policy_model(cfg.model, one_behind / "rl" / "checkpoints" / "step_000002")
    engine = open_engine(cfg, fresh, torch.Generator().manual_seed(cfg.run.seed), one_behind / "replay2", "", {})
    pool = LocalRollouts(engine, build_rubric(cfg.rewards, engine.env.default_rewards), World())
    other = sample_groups(pool, pool.rubric, credit, sampling, 2)
    pool.close()
    assert [t.token_ids for t in other.trajectories] != [t.token_ids for t in replayed.trajectories]


def test_no_staleness_is_the_synchronous_run(tmp_path: Path):
    synchronous = train(tmp_path / "sync")
    zero = train(tmp_path / "zero", "rl.max_staleness=0")
    timing = ("time/", "memory/")
    assert [{k: v for k, v in r.items() if not k.startswith(timing)} for r in zero] == [
        {k: v for k, v in r.items() if not k.startswith(timing)} for r in synchronous
    ]
    assert all(r["staleness"] == 0 for r in zero)


@pytest.mark.parametrize("setting", ["backend=vllm", "rl.ray_workers=2", "algorithm.correction=tis"])
def test_async_needs_the_in_process_sampler_and_its_own_log_probs(setting: str):
    with pytest.raises(ConfigError, match=r"rl.max_staleness > 0 needs a backend that samples in this process \(hf\), no rl.ray_workers"):
        load_config(SMOKE, ["rl.max_staleness=1", "rl.sampling_streams=batch" if setting == "backend=vllm" else "rl.sampling_streams=episode", setting])


def test_the_sampler_thread_sees_updates_only_through_sync(tmp_path: Path):
    """A round submitted before the trainer's weights change is sampled from the weights it
    was submitted under, even while they change; a round submitted after `sync` sees them."""
    import copy
    from dataclasses import replace

    cfg = load_config(SMOKE, [*RUN, f"run.dir={tmp_path}"])
    trainer = load_policy_model(cfg.model, CALC_SFT)
    sampling_policy = replace(trainer, model=copy.deepcopy(trainer.model).eval())
    engine = open_engine(cfg, sampling_policy, torch.Generator(), tmp_path, "", {})
    pool = LocalRollouts(engine, build_rubric(cfg.rewards, engine.env.default_rewards), World(), sampling_policy.model)
    tasks = [t for t in engine.env.tasks("train", 4, seed=3) for _ in range(4)]
    seeds = list(range(16))
    before = pool.submit(tasks, seeds, 4)
    with torch.no_grad():
        for p in trainer.model.parameters():  # the trainer's update, while the round runs
            p.mul_(0.0)
    pool.sync(trainer.model)
    after = pool.submit(tasks, seeds, 4)
    unchanged, changed = before(), after()
    pool.close()
    reference_engine = open_engine(cfg, load_policy_model(cfg.model, CALC_SFT), torch.Generator(), tmp_path / "ref", "", {})
    reference = reference_engine.run(tasks, seeds=seeds)
    reference_engine.close()
    assert [t.token_ids for t, _ in unchanged] == [t.token_ids for t in reference]
    assert [t.token_ids for t, _ in changed] != [t.token_ids for t in reference]  # zero weights: another distribution
