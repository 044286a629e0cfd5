"""DESIGN contract 7, resume is exact: a run killed with SIGKILL at any moment (mid-rollout,
mid-update, right after a checkpoint) resumes from its last checkpoint and logs what an
uninterrupted run logs; the audit log holds each decision once, not the replayed steps twice."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from toolpolicy.cli import main
from toolpolicy.gate import verify
from toolpolicy.model.files import CheckpointError
from toolpolicy.trainer.checkpoint import (
    STATE_FILE, checkpoint_dirs, latest_checkpoint, older_rollout_state, resume_from, save_checkpoint, save_final,
)

from conftest import SMOKE
from test_bad_files import cut, damage_pickle

# The moment each run is killed with SIGKILL: right after the n-th call of a function,
# counting only calls made after the m-th call of another one (m = 0: from the start).
KILLERS = {
    # RL step 3, mid-rollout: its first turn was sampled and its calls gated (and audited),
    # its second sampled, not yet gated.
    "rl-mid-rollout": ("toolpolicy.rollout.backends", "HFBackend.generate", 2, ("toolpolicy.rollout.engine", "RolloutEngine.run", 3)),
    # RL step 3, mid-update: a micro-batch's loss was computed, no optimizer step taken.
    "rl-mid-update": ("toolpolicy.algorithms.algorithm", "Algorithm.objective", 1, ("toolpolicy.rollout.engine", "RolloutEngine.run", 3)),
    # RL step 2, mid-rollout, before any checkpoint: the resume starts over from the state
    # the audit log had when RL began (rl/rollout_start.json).
    "rl-before-a-checkpoint": ("toolpolicy.rollout.backends", "HFBackend.generate", 2, ("toolpolicy.rollout.engine", "RolloutEngine.run", 2)),
    # right after the checkpoint of step 2 was written.
    "rl-after-checkpoint": ("toolpolicy.trainer.rl", "save_checkpoint", 1, None),
    # SFT step 5, mid-update.
    "sft-mid-update": ("toolpolicy.trainer.sft", "sft_loss", 5, None),
    # right after SFT's checkpoint of step 4.
    "sft-after-checkpoint": ("toolpolicy.trainer.sft", "save_checkpoint", 2, None),
}
CALC_SFT = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"  # a model that calls the tool

DRIVER = textwrap.dedent(
    """
    import importlib, json, os, signal, sys
    target, when, after = json.loads(sys.argv[1])

    def owner_and_name(module_name, attribute):
        module = importlib.import_module(module_name)
        if "." not in attribute:
            return module, attribute
        cls, name = attribute.split(".")
        return getattr(module, cls), name

    def counted(module_name, attribute, on_call):
        owner, name = owner_and_name(module_name, attribute)
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)  # after the call: its effects happened
            on_call()
            return result

        setattr(owner, name, wrapper)

    calls = {"target": 0, "after": 0}

    def on_target():
        if after is None or calls["after"] >= after[2]:
            calls["target"] += 1
            if calls["target"] == when:
                os.kill(os.getpid(), signal.SIGKILL)

    if after is not None:
        def on_after():
            calls["after"] += 1
        # counted before its own call returns: a run's inner calls count as "after" it started
        owner, name = owner_and_name(after[0], after[1])
        original_after = getattr(owner, name)

        def starting(*args, **kwargs):
            on_after()
            return original_after(*args, **kwargs)

        setattr(owner, name, starting)
    counted(target[0], target[1], on_target)
    from toolpolicy.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


def _metrics(run_dir: Path, phase: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/")) and k != "tokens_per_s"} for r in rows if r["phase"] == phase]


def _decisions(log: Path) -> list[tuple]:
    """What was decided, in order, without the time and the per-process decision ids."""
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [(r["seq"], r["tool"], r["args_digest"], r["decision"], tuple(r["rule_ids"])) for r in rows]


def _kill_then_resume(killer: str, command: list[str], run_dir: Path) -> None:
    module, attribute, when, after = KILLERS[killer]
    moment = json.dumps([[module, attribute], when, after])
    process = subprocess.run(
        [sys.executable, "-c", DRIVER, moment, *command, "--set", f"run.dir={run_dir}"],
        capture_output=True, text=True, timeout=600,
    )
    assert process.returncode == -9, f"the run was not killed: {process.returncode}\n{process.stderr[-2000:]}"
    assert main([command[0], "--resume", str(run_dir)]) == 0


RL = ["--set", f"rl.init_from={CALC_SFT}", "--set", "rl.steps=4", "--set", "run.checkpoint_every=2", "--set", "gate.audit=true"]


@pytest.fixture(scope="module")
def straight_rl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("straight") / "rl"
    assert main(["train", str(SMOKE), *RL, "--set", f"run.dir={run_dir}"]) == 0
    return run_dir


@pytest.mark.parametrize("killer", ["rl-mid-rollout", "rl-mid-update", "rl-after-checkpoint", "rl-before-a-checkpoint"])
def test_killed_rl_resumes_exactly_and_audits_each_decision_once(killer: str, straight_rl: Path, tmp_path: Path):
    run_dir = tmp_path / "killed"
    _kill_then_resume(killer, ["train", str(SMOKE), *RL], run_dir)
    assert [r["step"] for r in _metrics(run_dir, "rl")] == [1, 2, 3, 4]
    assert _metrics(run_dir, "rl") == _metrics(straight_rl, "rl")
    result = verify(run_dir / "audit.jsonl")
    assert result.ok, result.problems
    decisions = _decisions(run_dir / "audit.jsonl")
    assert len(decisions) > 20 and decisions == _decisions(straight_rl / "audit.jsonl")
    replayed = run_dir / "audit.jsonl.replayed"
    if killer == "rl-after-checkpoint":  # nothing was decided after the checkpoint
        assert not replayed.exists()
    elif killer == "rl-before-a-checkpoint":  # every decision of steps 1 and 2 was cut: RL began at record 0
        cut = replayed.read_text().splitlines()
        assert json.loads(cut[0]) == {"rewound_to_seq": 0} and json.loads(cut[1])["seq"] == 1
        assert json.loads((run_dir / "rl" / "rollout_start.json").read_text())["audit.jsonl"]["seq"] == 0
    else:  # the killed step's decisions were cut from the chain, and kept aside
        checkpoint = torch.load(run_dir / "rl" / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=True)
        saved = checkpoint["rollouts"]["audit.jsonl"]  # the log's own state, as AuditLog.state() gave it
        assert saved["log_id"] == json.loads((run_dir / "audit.jsonl").read_text().splitlines()[0])["log_id"]
        cut = replayed.read_text().splitlines()
        assert json.loads(cut[0]) == {"rewound_to_seq": saved["seq"]} and len(cut) > 1
        assert json.loads(cut[1])["seq"] == saved["seq"] + 1


SFT = ["--set", "sft.steps=6", "--set", "run.checkpoint_every=2", "--set", "sft.examples=64", "--set", "embedded.tokenizer_texts=50"]


@pytest.fixture(scope="module")
def straight_sft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("straight") / "sft"
    assert main(["sft", str(SMOKE), *SFT, "--set", f"run.dir={run_dir}"]) == 0
    return run_dir


@pytest.mark.parametrize("killer", ["sft-mid-update", "sft-after-checkpoint"])
def test_killed_sft_resumes_exactly(killer: str, straight_sft: Path, tmp_path: Path):
    run_dir = tmp_path / "killed"
    _kill_then_resume(killer, ["sft", str(SMOKE), *SFT], run_dir)
    assert [r["step"] for r in _metrics(run_dir, "sft")] == [1, 2, 3, 4, 5, 6]
    assert _metrics(run_dir, "sft") == _metrics(straight_sft, "sft")
    straight = (straight_sft / "sft" / "final" / "model.safetensors").read_bytes()
    assert (run_dir / "sft" / "final" / "model.safetensors").read_bytes() == straight


# --- a damaged newest checkpoint: resume falls back to the one before it --------------------


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _tiny_trainer() -> tuple:
    """A tiny model, its tokenizer, optimizer and LR schedule: what save_checkpoint writes."""
    tokenizer = AutoTokenizer.from_pretrained(CALC_SFT)
    shape = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), **shape))
    optimizer = torch.optim.AdamW(model.parameters())
    return model, tokenizer, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


@pytest.fixture
def two_checkpoints(tmp_path: Path) -> Path:
    """A phase folder with checkpoints step_000002 and step_000004 of a tiny model."""
    model, tokenizer, optimizer, scheduler = _tiny_trainer()
    phase_dir = tmp_path / "rl"
    for step in (2, 4):
        save_checkpoint(phase_dir, step, model, tokenizer, optimizer, scheduler, torch.Generator(), keep=2)
    return phase_dir


def _torch_writer_fails(*args, **kwargs):
    raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1024 vs 512\n"
                       "PytorchStreamWriter failed writing file data/0: file write failed")


def _disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("failure", ["the OS says ENOSPC", "torch's writer fails with little space left"])
def test_a_full_disk_stops_with_a_clear_error_and_keeps_the_last_checkpoint(failure: str, two_checkpoints: Path, monkeypatch):
    import toolpolicy.trainer.checkpoint as checkpoint

    model, tokenizer, optimizer, scheduler = _tiny_trainer()
    before = _files(two_checkpoints)
    if failure == "the OS says ENOSPC":
        monkeypatch.setattr(model, "save_pretrained", _disk_full)
    else:
        monkeypatch.setattr(checkpoint.torch, "save", _torch_writer_fails)
        monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**10, 10**10 - 4096, 4096))
    with pytest.raises(CheckpointError) as caught:
        save_checkpoint(two_checkpoints, 6, model, tokenizer, optimizer, scheduler, torch.Generator(), keep=2)
    message = str(caught.value)
    assert message.startswith(f"checkpoint step 6 could not be written to {two_checkpoints / 'checkpoints'}: the disk is full")
    assert f"its last whole checkpoint, {two_checkpoints / 'checkpoints' / 'step_000004'}, is untouched" in message
    assert message.endswith(f"go on with: toolpolicy train --resume {two_checkpoints.parent}")
    assert _files(two_checkpoints) == before  # the half-written step_000006.tmp is gone, the others as they were
    assert sorted(p.name for p in (two_checkpoints / "checkpoints").iterdir()) == ["step_000002", "step_000004"]


def test_a_full_disk_at_the_final_model_keeps_the_checkpoints(two_checkpoints: Path, monkeypatch):
    model, tokenizer, _, _ = _tiny_trainer()
    monkeypatch.setattr(model, "save_pretrained", _disk_full)
    before = _files(two_checkpoints)
    with pytest.raises(CheckpointError, match=f"rl's final model could not be written to {two_checkpoints}: the disk is full"):
        save_final(two_checkpoints, model, tokenizer)
    assert _files(two_checkpoints) == before and not (two_checkpoints / "final.tmp").exists()


def test_what_counts_as_a_full_disk():
    import doctest

    import toolpolicy.trainer.checkpoint

    result = doctest.testmod(toolpolicy.trainer.checkpoint)
    assert result.attempted >= 3 and result.failed == 0


def test_a_write_that_fails_for_another_reason_is_raised_as_it_is(two_checkpoints: Path, monkeypatch):
    model, tokenizer, optimizer, scheduler = _tiny_trainer()
    monkeypatch.setattr(model, "save_pretrained", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    with pytest.raises(PermissionError):
        save_checkpoint(two_checkpoints, 6, model, tokenizer, optimizer, scheduler, torch.Generator(), keep=2)
    assert sorted(p.name for p in (two_checkpoints / "checkpoints").iterdir()) == ["step_000002", "step_000004"]


def test_a_resume_says_the_step_it_starts_from(two_checkpoints: Path, tmp_path: Path, capsys):
    assert resume_from(two_checkpoints) == two_checkpoints / "checkpoints" / "step_000004"
    assert capsys.readouterr().err == f"resuming {two_checkpoints.parent} from step 4\n"
    assert resume_from(tmp_path / "run" / "sft") is None
    assert capsys.readouterr().err == f"resuming {tmp_path / 'run'} from step 0: sft has no checkpoint yet\n"


def _sharded_without_shards(checkpoint: Path) -> None:
    """A checkpoint as a sharded run writes it (trainer_state.pt with no optimizer state), its
    folder of optimizer shards never written (a kill while the ranks were writing them)."""
    state = torch.load(checkpoint / STATE_FILE, weights_only=True)
    torch.save({**state, "optimizer": None}, checkpoint / STATE_FILE)


NEWEST_DAMAGE = {
    # name: (what happens to step_000004, the file the warning names)
    "weights cut short": (lambda c: cut(c / "model.safetensors", -1), "model.safetensors"),
    "trainer state damaged": (lambda c: damage_pickle(c / STATE_FILE), STATE_FILE),
    "trainer state cut short": (lambda c: cut(c / STATE_FILE, -100), STATE_FILE),
    "trainer state missing": (lambda c: (c / STATE_FILE).unlink(), STATE_FILE),
    "tokenizer missing": (lambda c: (c / "tokenizer.json").unlink(), ""),
    "optimizer shards missing": (_sharded_without_shards, "optimizer_shards"),
}


@pytest.mark.parametrize("damage", sorted(NEWEST_DAMAGE))
def test_resume_passes_over_a_damaged_newest_checkpoint_and_keeps_it(damage: str, two_checkpoints: Path, capsys):
    root = two_checkpoints / "checkpoints"
    assert latest_checkpoint(two_checkpoints) == root / "step_000004"
    spoil, name = NEWEST_DAMAGE[damage]
    spoil(root / "step_000004")
    before = _files(two_checkpoints)
    assert latest_checkpoint(two_checkpoints) == root / "step_000002"
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: passing over checkpoint step_000004")
    assert f"{root / 'step_000004' / name}: " in warnings[0]  # names the file at fault
    assert _files(two_checkpoints) == before  # nothing deleted or rewritten


def test_resume_with_no_whole_checkpoint_left_is_an_error(two_checkpoints: Path, capsys):
    for checkpoint in checkpoint_dirs(two_checkpoints):
        cut(checkpoint / "model.safetensors", -1)
    with pytest.raises(CheckpointError, match="no checkpoint left to resume from, all 2 are damaged"):
        latest_checkpoint(two_checkpoints)
    assert [line.split(":")[0] for line in capsys.readouterr().err.splitlines()] == ["warning", "warning"]


def test_rl_resume_past_a_damaged_last_checkpoint_is_exact_from_the_one_before(straight_rl: Path, tmp_path: Path, capsys):
    run_dir = Path(shutil.copytree(straight_rl, tmp_path / "damaged"))
    weights = run_dir / "rl" / "checkpoints" / "step_000004" / "model.safetensors"
    cut(weights, -1)
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert f"warning: passing over checkpoint step_000004 for an earlier one: {weights}: truncated" in capsys.readouterr().err
    assert [r["step"] for r in _metrics(run_dir, "rl")] == [1, 2, 3, 4]
    assert _metrics(run_dir, "rl") == _metrics(straight_rl, "rl")
    assert _decisions(run_dir / "audit.jsonl") == _decisions(straight_rl / "audit.jsonl")


def test_resume_with_every_checkpoint_damaged_is_a_one_line_error(straight_rl: Path, tmp_path: Path, capsys):
    run_dir = Path(shutil.copytree(straight_rl, tmp_path / "damaged"))
    for checkpoint in checkpoint_dirs(run_dir / "rl"):
        (checkpoint / STATE_FILE).write_bytes(b"")
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"toolpolicy train: error: {run_dir / 'rl' / 'checkpoints'}: no checkpoint left to resume from, all 2 are "
        "damaged (the warnings above say how); run again without --resume to start this phase over"
    )


class _RecordingShards:
    """Stands for `distributed.Shards` (which needs a process group): records what it is asked to do."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def save(self, folder: Path) -> None:
        self.calls.append("save")

    def load(self, folder: Path) -> None:
        self.calls.append("load")


def test_a_sharded_checkpoint_before_the_first_optimizer_step_keeps_the_empty_state_whole(tmp_path: Path):
    """Before the first optimizer step the state is empty and the same on every rank: the
    checkpoint keeps it in trainer_state.pt (shards of it would need torch to take a step of lr
    0 first, one step more than the run), and resuming reads it from there; after a step the
    ranks write and read shards."""
    from toolpolicy.trainer.checkpoint import restore_state

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    tokenizer = AutoTokenizer.from_pretrained(CALC_SFT)
    model.save_pretrained = lambda folder: (folder / "model.safetensors").write_bytes(b"")  # a model folder's stand-in
    shards = _RecordingShards()
    early = save_checkpoint(tmp_path, 1, model, tokenizer, optimizer, scheduler, None, keep=2, shards=shards)
    assert shards.calls == [] and torch.load(early / STATE_FILE, weights_only=True)["optimizer"] is not None
    restore_state(early, optimizer, scheduler, None, shards)
    assert shards.calls == [] and not optimizer.state
    model(torch.ones(2)).sum().backward()
    optimizer.step()
    later = save_checkpoint(tmp_path, 2, model, tokenizer, optimizer, scheduler, None, keep=2, shards=shards)
    assert shards.calls == ["save"] and torch.load(later / STATE_FILE, weights_only=True)["optimizer"] is None
    restore_state(later, optimizer, scheduler, None, shards)
    assert shards.calls == ["save", "load"]


def test_a_checkpoint_from_before_rollout_states_names_each_log():
    """Checkpoints written before the pool kept its logs' states held their last records by
    rank; a resume reads them as the states of the logs torchrun ranks and Ray workers write."""
    two_ranks = older_rollout_state({"audit_seq": 7, "audit_seqs": [7, 5]})
    assert two_ranks["audit.jsonl"] == {"seq": 7} and two_ranks["audit.rank1.jsonl"] == {"seq": 5}
    assert two_ranks["audit.worker0.jsonl"] == {"seq": 7} and two_ranks["audit.worker1.jsonl"] == {"seq": 5}
    assert older_rollout_state({"audit_seq": 3}) == {"audit.jsonl": {"seq": 3}, "audit.worker0.jsonl": {"seq": 3}}
    assert older_rollout_state({"audit_seq": None}) == {}
