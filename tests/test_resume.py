"""DESIGN contract 7, resume is exact: a run killed with SIGKILL at any moment (mid-rollout,
mid-update, right after a checkpoint) resumes from its last checkpoint and logs what an
uninterrupted run logs; the audit log holds each decision once, not the replayed steps twice."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from toolpolicy.cli import main
from toolpolicy.gate import verify

from conftest import SMOKE

# The moment each run is killed with SIGKILL: right after the n-th call of a function,
# counting only calls made after the m-th call of another one (m = 0: from the start).
KILLERS = {
    # RL step 3, mid-rollout: its first turn was sampled and its calls gated (and audited),
    # its second sampled, not yet gated.
    "rl-mid-rollout": ("toolpolicy.rollout.backends", "HFBackend.generate", 2, ("toolpolicy.rollout.engine", "RolloutEngine.run", 3)),
    # RL step 3, mid-update: a micro-batch's loss was computed, no optimizer step taken.
    "rl-mid-update": ("toolpolicy.algorithms.algorithm", "Algorithm.objective", 1, ("toolpolicy.rollout.engine", "RolloutEngine.run", 3)),
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
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "tokens_per_s"} for r in rows if r["phase"] == phase]


def _decisions(log: Path) -> list[tuple]:
    """What was decided, in order, without the time and the per-process decision ids."""
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [(r["seq"], r["tool"], r["args_digest"], r["decision"], tuple(r["rule_ids"])) for r in rows]


def _kill_then_resume(killer: str, command: list[str], run_dir: Path) -> None:
    module, attribute, when, after = KILLERS[killer]
    moment = json.dumps([[module, attribute], when, after])
    process = subprocess.run(
        [sys.executable, "-c", DRIVER, moment, *command, "--set", f"run_dir={run_dir}"],
        capture_output=True, text=True, timeout=600,
    )
    assert process.returncode == -9, f"the run was not killed: {process.returncode}\n{process.stderr[-2000:]}"
    assert main([command[0], "--resume", str(run_dir)]) == 0


RL = ["--set", f"init_from={CALC_SFT}", "--set", "rl_steps=4", "--set", "checkpoint_every=2", "--set", "audit=true"]


@pytest.fixture(scope="module")
def straight_rl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("straight") / "rl"
    assert main(["train", str(SMOKE), *RL, "--set", f"run_dir={run_dir}"]) == 0
    return run_dir


@pytest.mark.parametrize("killer", ["rl-mid-rollout", "rl-mid-update", "rl-after-checkpoint"])
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
    else:  # the killed step's decisions were cut from the chain, and kept aside
        checkpoint = torch.load(run_dir / "rl" / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=True)
        cut = replayed.read_text().splitlines()
        assert json.loads(cut[0]) == {"rewound_to_seq": checkpoint["audit_seq"]} and len(cut) > 1
        assert json.loads(cut[1])["seq"] == checkpoint["audit_seq"] + 1


SFT = ["--set", "sft_steps=6", "--set", "checkpoint_every=2", "--set", "sft_examples=64", "--set", "tokenizer_texts=50"]


@pytest.fixture(scope="module")
def straight_sft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("straight") / "sft"
    assert main(["sft", str(SMOKE), *SFT, "--set", f"run_dir={run_dir}"]) == 0
    return run_dir


@pytest.mark.parametrize("killer", ["sft-mid-update", "sft-after-checkpoint"])
def test_killed_sft_resumes_exactly(killer: str, straight_sft: Path, tmp_path: Path):
    run_dir = tmp_path / "killed"
    _kill_then_resume(killer, ["sft", str(SMOKE), *SFT], run_dir)
    assert [r["step"] for r in _metrics(run_dir, "sft")] == [1, 2, 3, 4, 5, 6]
    assert _metrics(run_dir, "sft") == _metrics(straight_sft, "sft")
    straight = (straight_sft / "sft" / "final" / "model.safetensors").read_bytes()
    assert (run_dir / "sft" / "final" / "model.safetensors").read_bytes() == straight
