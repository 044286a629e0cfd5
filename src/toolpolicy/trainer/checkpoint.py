"""Checkpoints that resume exactly, and the run's metrics log.

A checkpoint is a Hugging Face model folder plus `trainer_state.pt` (optimizer,
LR schedule, RNG states, step, and the rollout pool's state: its audit logs' ends); a run
whose processes shard the model keeps the optimizer state in a folder of shards beside them
(`distributed.SHARDS`, one file per rank), its trainer_state.pt an optimizer of None. It is
written to a temporary folder and renamed into place, so a process killed mid-write leaves the previous checkpoint intact
and never a half-written one. The data cursor of both loops is a pure function
of the step, so the step is the cursor. A checkpoint damaged after it was written (a
full disk, a bad copy) is passed over on resume for the one before it, with a warning; a
write that fails on a full disk removes its temporary folder and stops the run with a
CheckpointError naming the checkpoint kept (`written_whole`).
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import torch

from toolpolicy.atomic import replace_file
from toolpolicy.model.files import DAMAGED, CheckpointError, check_checkpoint, check_torch_zip
from toolpolicy.trainer.distributed import SHARDS, Shards, World
from toolpolicy.trainer.trackers import Tracker, metric_names

STATE_FILE = "trainer_state.pt"
STATE_KEYS = ("step", "optimizer", "scheduler", "rng")


def checkpoint_dirs(phase_dir: Path) -> list[Path]:
    """Checkpoint folders of a phase (step_NNNNNN, not the .tmp of one being written), oldest first."""
    root = phase_dir / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith("step_") and p.name.removeprefix("step_").isdigit()]
    return sorted(done, key=lambda p: int(p.name.removeprefix("step_")))


def latest_checkpoint(phase_dir: Path) -> Path | None:
    """The newest checkpoint of a phase that can be resumed from; None if the phase has none.
    A newer one that is corrupt or incomplete is passed over with a warning on stderr and
    left where it is; when every one is, CheckpointError."""
    found = checkpoint_dirs(phase_dir)
    for checkpoint in reversed(found):
        try:
            check_checkpoint(checkpoint)
            state = load_trainer_state(checkpoint / STATE_FILE, mmap=True)  # unpickles it; the tensors stay on disk
            if state["optimizer"] is None and not (checkpoint / SHARDS / ".metadata").is_file():
                raise CheckpointError(f"{checkpoint / SHARDS}: the optimizer's shards are incomplete; {DAMAGED}")
        except CheckpointError as error:
            print(f"warning: passing over checkpoint {checkpoint.name} for an earlier one: {error}", file=sys.stderr)
        else:
            return checkpoint
    if found:
        raise CheckpointError(
            f"{phase_dir / 'checkpoints'}: no checkpoint left to resume from, all {len(found)} are damaged "
            "(the warnings above say how); run again without --resume to start this phase over"
        )
    return None


def checkpoint_step(checkpoint: Path) -> int:
    """The step a checkpoint folder (step_NNNNNN) was written after."""
    return int(checkpoint.name.removeprefix("step_"))


def resume_from(phase_dir: Path) -> Path | None:
    """`latest_checkpoint(phase_dir)`, announced on stderr: `resuming RUN_DIR from step N`."""
    checkpoint = latest_checkpoint(phase_dir)
    if checkpoint is None:
        print(f"resuming {phase_dir.parent} from step 0: {phase_dir.name} has no checkpoint yet", file=sys.stderr)
    else:
        print(f"resuming {phase_dir.parent} from step {checkpoint_step(checkpoint)}", file=sys.stderr)
    return checkpoint


def load_trainer_state(path: Path, mmap: bool = False) -> dict[str, Any]:
    """The dict `save_checkpoint` wrote to trainer_state.pt; CheckpointError naming the file
    if it is missing, cut short or not a trainer state. `mmap`: leave the tensors on disk."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; {DAMAGED}")
    check_torch_zip(path)
    try:
        state = torch.load(path, weights_only=True, mmap=mmap)
    except (RuntimeError, pickle.UnpicklingError, EOFError, KeyError, ValueError, OSError) as error:
        # what torch.load raises on damaged bytes: the zip reader's RuntimeError, the unpickler's
        # errors, EOFError, KeyError on a bad record, UnicodeDecodeError on a bad string
        first_line = (str(error).splitlines() or [""])[0].split(". ")[0]  # torch's messages run on for lines
        raise CheckpointError(f"{path}: unreadable ({type(error).__name__}: {first_line}); {DAMAGED}") from None
    missing = [key for key in STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise CheckpointError(f"{path}: not a trainer state (no {', '.join(missing)}); {DAMAGED}")
    return state


def save_checkpoint(
    phase_dir: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    sampler: torch.Generator | None,
    keep: int,
    rollouts: dict[str, Any] | None = None,
    world: World = World(),
    shards: Shards | None = None,
    replay: dict[str, Any] | None = None,
) -> Path:
    """Write checkpoint `step` atomically; keep the newest `keep`. `rollouts`: the rollout
    pool's state (`Rollouts.state()`: each audit log's own state), so that a resumed run
    cuts the decisions it will take again. Every rank calls it: rank 0 writes the checkpoint,
    and with `shards` (a sharded run) every rank first writes its shards of the optimizer state,
    once it has one (before the first optimizer step the state is empty, the same on every
    rank, and trainer_state.pt holds it: writing shards would have torch take a step of lr 0
    to create them, one more step than the run takes). `replay`: the success replay's store
    (`SuccessReplay.state()`), so that a resumed run replays what this one would."""
    final = phase_dir / "checkpoints" / f"step_{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    if world.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    shards = shards if optimizer.state else None
    if shards is not None:
        world.barrier()  # the folder exists before any rank writes into it
        shards.save(tmp)
    if not world.main:
        return final
    with written_whole(tmp, phase_dir, f"checkpoint step {step}"):
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(trainer_state(step, optimizer, scheduler, sampler, rollouts, replay, shards), tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in checkpoint_dirs(phase_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def trainer_state(
    step: int, optimizer: torch.optim.Optimizer, scheduler: Any, sampler: torch.Generator | None,
    rollouts: dict[str, Any] | None, replay: dict[str, Any] | None, shards: Shards | None,
) -> dict[str, Any]:
    """What trainer_state.pt holds (STATE_KEYS and the rollout pool's and replay's states)."""
    return {
        "step": step,
        "rollouts": rollouts or {},
        "replay": replay or {},
        "optimizer": optimizer.state_dict() if shards is None else None,
        "scheduler": scheduler.state_dict(),
        "rng": {
            "python": random.getstate(),
            "torch": torch.get_rng_state(),
            "sampler": sampler.get_state() if sampler is not None else None,
        },
    }


def resume_command(phase_dir: Path) -> str:
    """The command that resumes the run whose phase folder (sft or rl) is `phase_dir`."""
    return f"toolpolicy {'sft' if phase_dir.name == 'sft' else 'train'} --resume {phase_dir.parent}"


LOW_SPACE = 16 * 2**20
"""Free bytes below which a failed write is taken for a full disk (torch's writer does not say why it failed)."""


def out_of_space(error: BaseException, free: int) -> bool:
    """Whether a write failed for lack of space: the OS said so (ENOSPC, also in the text
    safetensors passes on), or `free` bytes are left on the disk.

    >>> out_of_space(OSError(errno.ENOSPC, "No space left on device"), 10**9)
    True
    >>> out_of_space(RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"), 4096)
    True
    >>> out_of_space(PermissionError(errno.EACCES, "Permission denied"), 10**9)
    False
    """
    return getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error) or free < LOW_SPACE


@contextmanager
def written_whole(tmp: Path, phase_dir: Path, what: str) -> Iterator[None]:
    """Around the writes into `tmp` (a folder of `phase_dir`'s, renamed into place once whole): if
    one fails, `tmp` is removed, so nothing half-written is left, and a full disk is a
    CheckpointError that says what was kept and how to go on."""
    try:
        yield
    except Exception as error:
        free = shutil.disk_usage(tmp.parent).free
        shutil.rmtree(tmp, ignore_errors=True)
        if not out_of_space(error, free):
            raise
        kept = latest_checkpoint(phase_dir)
        first_line = (str(error).splitlines() or [type(error).__name__])[0]
        raise CheckpointError(
            f"{what} could not be written to {tmp.parent}: the disk is full ({first_line}; {free // 2**20} MB free). "
            f"The run stopped there; its last whole checkpoint, {kept or 'none yet'}, is untouched. Free some space "
            f"(run.keep_checkpoints is how many checkpoints a run keeps) and go on with: {resume_command(phase_dir)}"
        ) from None


def save_final(phase_dir: Path, model: Any, tokenizer: Any) -> Path:
    """The phase's result as a plain Hugging Face checkpoint (PHASE_DIR/final), written atomically."""
    final = phase_dir / "final"
    tmp = final.with_name("final.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with written_whole(tmp, phase_dir, f"{phase_dir.name}'s final model"):
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


class Restored(NamedTuple):
    step: int
    rollouts: dict[str, Any]
    """The rollout pool's state when the checkpoint was taken (see `save_checkpoint`)."""
    replay: dict[str, Any] = {}
    """The success replay's store (empty: none, or a checkpoint from before it existed)."""


def older_rollout_state(state: dict[str, Any]) -> dict[str, Any]:
    """The rollout state of a checkpoint from before it had one: audit logs' last records by
    rank (`audit_seq`, `audit_seqs`), named as torchrun ranks and Ray workers name their logs."""
    seqs = state.get("audit_seqs") or [state.get("audit_seq")]
    named = {"audit.jsonl": seqs[0]} | {f"audit.rank{k}.jsonl": seq for k, seq in enumerate(seqs) if k}
    named |= {f"audit.worker{k}.jsonl": seq for k, seq in enumerate(seqs)}
    return {name: {"seq": seq} for name, seq in named.items() if seq is not None}


def restore_state(
    checkpoint: Path, optimizer: torch.optim.Optimizer, scheduler: Any, sampler: torch.Generator | None, shards: Shards | None = None
) -> Restored:
    """Load optimizer, schedule and RNG states saved with `checkpoint`; return its step.
    `shards`: a sharded run's, each rank reading its own shards of the optimizer state."""
    state = load_trainer_state(checkpoint / STATE_FILE)
    if state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    else:
        if shards is None:
            raise CheckpointError(
                f"{checkpoint}: its optimizer state is in shards ({SHARDS}), written by processes holding shards of "
                "the model: resume it under torchrun with model.sharing: shard, as it ran"
            )
        shards.load(checkpoint)
    scheduler.load_state_dict(state["scheduler"])
    random.setstate(state["rng"]["python"])
    torch.set_rng_state(state["rng"]["torch"])
    if sampler is not None and state["rng"]["sampler"] is not None:
        sampler.set_state(state["rng"]["sampler"])
    rollouts = state["rollouts"] if "rollouts" in state else older_rollout_state(state)
    return Restored(int(state["step"]), rollouts, state.get("replay", {}))


class MetricsLog:
    """`metrics.jsonl`: one JSON object per step, each with "phase" and "step"; every record
    also goes to the `trackers` (TensorBoard, wandb, Trackio) under the same names."""

    def __init__(self, path: Path, trackers: Sequence[Tracker] = ()) -> None:
        self.path = path
        self.trackers = trackers

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for tracker in self.trackers:
            tracker.log(record["step"], metric_names(record["phase"], record))

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()

    def last_step(self, phase: str) -> int:
        """The last step of `phase` logged; 0 if none."""
        steps = [0]
        for line in self.path.read_text().splitlines() if self.path.exists() else ():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill mid-write
            if record.get("phase") == phase:
                steps.append(record.get("step", 0))
        return steps[-1]

    def drop_after(self, phase: str, step: int) -> None:
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
        replace_file(self.path, "".join(line + "\n" for line in kept))
