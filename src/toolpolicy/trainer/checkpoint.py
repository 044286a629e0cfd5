"""Checkpoints that resume exactly, and the run's metrics log.

A checkpoint is a Hugging Face model folder plus `trainer_state.pt` (optimizer,
LR schedule, RNG states, step, and where the run's audit log ended). It is
written to a temporary folder and renamed into place, so a process killed mid-write leaves the previous checkpoint intact
and never a half-written one. The data cursor of both loops is a pure function
of the step, so the step is the cursor.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import torch

STATE_FILE = "trainer_state.pt"


def checkpoint_dirs(phase_dir: Path) -> list[Path]:
    """Complete checkpoints of a phase, oldest first."""
    root = phase_dir / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith("step_") and (p / STATE_FILE).is_file() and not p.name.endswith(".tmp")]
    return sorted(done, key=lambda p: int(p.name.removeprefix("step_")))


def latest_checkpoint(phase_dir: Path) -> Path | None:
    found = checkpoint_dirs(phase_dir)
    return found[-1] if found else None


def save_checkpoint(
    phase_dir: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    sampler: torch.Generator | None,
    keep: int,
    audit_seq: int | None = None,
) -> Path:
    """Write checkpoint `step` atomically; keep the newest `keep`. `audit_seq`: the last record
    of the run's audit log, so a resumed run can cut the decisions it will replay."""
    final = phase_dir / "checkpoints" / f"step_{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    state = {
        "step": step,
        "audit_seq": audit_seq,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": {
            "python": random.getstate(),
            "torch": torch.get_rng_state(),
            "sampler": sampler.get_state() if sampler is not None else None,
        },
    }
    torch.save(state, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in checkpoint_dirs(phase_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_final(phase_dir: Path, model: Any, tokenizer: Any) -> Path:
    """The phase's result as a plain Hugging Face checkpoint (PHASE_DIR/final), written atomically."""
    final = phase_dir / "final"
    tmp = final.with_name("final.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


class Restored(NamedTuple):
    step: int
    audit_seq: int | None
    """The audit log's last record when the checkpoint was taken (None: no log)."""


def restore_state(
    checkpoint: Path, optimizer: torch.optim.Optimizer, scheduler: Any, sampler: torch.Generator | None
) -> Restored:
    """Load optimizer, schedule and RNG states saved with `checkpoint`; return its step."""
    state = torch.load(checkpoint / STATE_FILE, weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    random.setstate(state["rng"]["python"])
    torch.set_rng_state(state["rng"]["torch"])
    if sampler is not None and state["rng"]["sampler"] is not None:
        sampler.set_state(state["rng"]["sampler"])
    return Restored(int(state["step"]), state.get("audit_seq"))


class MetricsLog:
    """`metrics.jsonl`: one JSON object per step, each with "phase" and "step"."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def rewind(self, phase: str, step: int) -> None:
        """Drop the lines of `phase` logged after `step` (written after the checkpoint
        a resumed run starts from), so the log reads as one uninterrupted run."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill mid-write
            if not (record.get("phase") == phase and record.get("step", 0) > step):
                kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)
