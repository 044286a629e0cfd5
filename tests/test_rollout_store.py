"""The rollout store on a real run: the smoke demo's RL steps, read back from Parquet and
checked against the run's own metrics and the exact-token contract; `rollouts show`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolpolicy.cli import main
from toolpolicy.rollout.store import read_step, drop_steps_after, stored_steps, write_step

pytestmark = pytest.mark.usefixtures("smoke_run")


def rl_metrics(run_dir: Path) -> dict[int, dict]:
    lines = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r for r in lines if r["phase"] == "rl"}


def test_every_rl_step_is_stored_with_consistent_columns(smoke_run: Path):
    folder = smoke_run / "rl" / "rollouts"
    metrics = rl_metrics(smoke_run)
    assert stored_steps(folder) == sorted(metrics)
    assert not list(folder.glob("*.tmp"))
    for step, record in metrics.items():
        episodes = read_step(folder, step)
        assert [e.episode for e in episodes] == list(range(len(episodes)))
        for e in episodes:
            assert len(e.token_ids) == len(e.loss_mask)
            assert not any(e.loss_mask[: e.prompt_len])
            sampled = sum(e.loss_mask)
            assert len(e.sampled_logprobs) == len(e.advantages) == sampled
            assert all(lp <= 0 for lp in e.sampled_logprobs)
            assert (e.trainer_logprobs is not None) == e.kept
            assert all(start < end <= len(e.token_ids) for start, end in zip(e.turn_starts, e.turn_ends))
            assert e.messages[-1]["role"] in ("assistant", "tool", "user")
        # The same numbers the step logged: mean reward and trained episodes.
        usable = [e for e in episodes if e.infra_error is None]
        assert sum(e.reward for e in usable) / len(usable) == pytest.approx(record["reward"])
        assert sum(e.kept for e in episodes) == record["trained_episodes"]


def test_stored_advantages_are_each_groups_centred_rewards(smoke_run: Path):
    """GRPO: an episode's advantage is its reward minus its group's mean (over the std), the same
    on every sampled token; so a group's advantages sum to zero and order like its rewards."""
    folder = smoke_run / "rl" / "rollouts"
    for step in stored_steps(folder):
        groups: dict[int, list] = {}
        for e in read_step(folder, step):
            assert len(set(e.advantages)) <= 1
            groups.setdefault(e.group, []).append(e)
        for members in groups.values():
            values = [e.advantages[0] if e.advantages else 0.0 for e in members]
            assert sum(values) == pytest.approx(0.0, abs=1e-4)
            by_reward = sorted(members, key=lambda e: e.reward)
            assert [e.advantages[0] for e in by_reward if e.advantages] == sorted(e.advantages[0] for e in by_reward if e.advantages)


def test_trainer_logprobs_match_the_samplers_on_the_same_weights(smoke_run: Path):
    """Contract 1, seen in the store: before the update, the trainer's recomputed log-prob of
    every sampled token equals the sampler's (the hf backend samples with the trainer's weights)."""
    folder = smoke_run / "rl" / "rollouts"
    compared = 0
    for step in stored_steps(folder):
        for e in read_step(folder, step):
            if e.trainer_logprobs is not None:
                assert e.trainer_logprobs == pytest.approx(e.sampled_logprobs, abs=2e-4)
                compared += len(e.trainer_logprobs)
    assert compared > 100


def test_rewind_drops_later_steps_and_a_missing_step_is_named(smoke_run: Path, tmp_path: Path):
    source = smoke_run / "rl" / "rollouts"
    import pyarrow.parquet as pq

    for step in stored_steps(source):
        write_step(tmp_path, step, pq.read_table(source / f"step_{step:06d}.parquet"))
    drop_steps_after(tmp_path, 2)
    assert stored_steps(tmp_path) == [1, 2]
    with pytest.raises(FileNotFoundError, match=r"steps 1\.\.2"):
        read_step(tmp_path, 3)


def test_rollouts_show_lists_a_step_and_renders_an_episode(smoke_run: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["rollouts", "show", str(smoke_run), "--step", "1"]) == 0
    listing = capsys.readouterr().out
    episodes = read_step(smoke_run / "rl" / "rollouts", 1)
    assert f"step 1: {len(episodes)} episodes" in listing
    assert main(["rollouts", "show", str(smoke_run), "--step", "1", "--episode", "0"]) == 0
    shown = capsys.readouterr().out
    assert f"task {episodes[0].task_id}" in shown and "reward" in shown
    assert "calculator" in shown  # the tool call's tokens, decoded
    assert main(["rollouts", "show", str(smoke_run), "--step", "1", "--episode", "999"]) == 2
    assert "--episode 999" in capsys.readouterr().err


def test_rollouts_export_writes_the_stored_successes_as_sft_data(smoke_run: Path, tmp_path: Path):
    """Self-distillation from RL: every stored episode that succeeded (and was not truncated,
    with no denial) comes out as a chat record, in step order, and reads back as the same
    messages. The smoke model solves almost nothing, so a copy of its first step marks
    every other episode solved."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from toolpolicy.trainer.sft_data import load_conversations

    run = tmp_path / "run"
    (run / "rl").mkdir(parents=True)
    (run / "config.yaml").write_text((smoke_run / "config.yaml").read_text())
    table = pq.read_table(smoke_run / "rl" / "rollouts" / "step_000001.parquet")
    marked = pa.array([i % 2 == 0 for i in range(table.num_rows)])
    write_step(run / "rl" / "rollouts", 1, table.set_column(table.schema.get_field_index("success"), "success", marked))
    out = tmp_path / "sft.jsonl"
    assert main(["rollouts", "export", str(run), "--to", str(out)]) == 0
    expected = [
        e.messages for e in read_step(run / "rl" / "rollouts", 1)
        if e.success and not e.truncated and not any(ev["kind"] in ("gate_deny", "violation") for ev in e.events)
    ]
    assert expected
    assert [[m.to_dict() for m in c.messages] for _, c in load_conversations(out)] == expected


def test_stored_success_is_what_the_step_counted_as_accuracy(smoke_run: Path):
    folder = smoke_run / "rl" / "rollouts"
    for step, record in rl_metrics(smoke_run).items():
        usable = [e for e in read_step(folder, step) if e.infra_error is None]
        assert sum(e.success for e in usable) / len(usable) == pytest.approx(record["accuracy"])
