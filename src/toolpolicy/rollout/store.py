"""The rollout store: every RL step's episodes, token by token, one Parquet file a step.

RUN_DIR/rl/rollouts/step_000012.parquet holds step 12's episodes, one row each, in the
order the step sampled them (groups contiguous). A row keeps what the exact-token
contract is about, so a run can be audited after the fact:

    token_ids          [L]  every token: prompt, assistant turns, observations
    loss_mask          [L]  true on the tokens the policy sampled
    sampled_logprobs   [S]  the sampler's log-prob of each sampled token (S = sum of loss_mask)
    trainer_logprobs   [S]  the trainer's recomputed log-prob of each, before the update
                            (null for an episode the update left out)
    advantages         [S]  the advantage each sampled token was trained with
    reward, components      the Rubric's total and every term's value
    success                 the environment's success reward was 1 (what evaluation counts)
    turn_starts/ends        [start, end) of each assistant turn in token_ids
    events                  tool calls, gate denials (detail: the rules), truncation, ...
    truncated, infra_error, kept (trained this step), staleness (policy versions behind)
    messages, outcome       the episode as JSON text (what `rollouts export` writes as chat)

Per-token columns hold the sampled tokens only; `loss_mask` places them. Files are
written whole to a temporary name and renamed, so a killed run leaves no half file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from toolpolicy.rollout.trajectory import Trajectory

SCHEMA = pa.schema([
    ("step", pa.int32()),
    ("episode", pa.int32()),
    ("group", pa.int32()),
    ("task_id", pa.string()),
    ("prompt_len", pa.int32()),
    ("token_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.bool_())),
    ("sampled_logprobs", pa.list_(pa.float32())),
    ("trainer_logprobs", pa.list_(pa.float32())),
    ("advantages", pa.list_(pa.float32())),
    ("reward", pa.float64()),
    ("success", pa.bool_()),
    ("components", pa.map_(pa.string(), pa.float64())),
    ("turn_starts", pa.list_(pa.int32())),
    ("turn_ends", pa.list_(pa.int32())),
    ("events", pa.list_(pa.struct([("kind", pa.string()), ("turn", pa.int32()), ("detail", pa.string())]))),
    ("truncated", pa.bool_()),
    ("infra_error", pa.string()),
    ("kept", pa.bool_()),
    ("staleness", pa.int32()),
    ("messages", pa.string()),
    ("outcome", pa.string()),
    ("image_starts", pa.list_(pa.int32())),
])
STEP_FILE = re.compile(r"step_(\d{6})\.parquet")


@dataclass(frozen=True)
class StoredEpisode:
    """One stored row, as Python values (see the module docstring for the columns)."""

    step: int
    episode: int
    group: int
    task_id: str
    prompt_len: int
    token_ids: list[int]
    loss_mask: list[bool]
    sampled_logprobs: list[float]
    trainer_logprobs: list[float] | None
    advantages: list[float]
    reward: float
    success: bool
    components: dict[str, float]
    turn_starts: list[int]
    turn_ends: list[int]
    events: list[dict[str, Any]]
    truncated: bool
    infra_error: str | None
    kept: bool
    staleness: int
    messages: list[dict[str, Any]]
    outcome: dict[str, Any]
    image_starts: list[int] = field(default_factory=list)
    """Where each picture's placeholders start in token_ids; the pictures, in the same order,
    are those of `messages` (each message's `images`, base64 PNG)."""

    @property
    def sampled_positions(self) -> list[int]:
        """Where in token_ids the per-token columns' values belong."""
        return [i for i, sampled in enumerate(self.loss_mask) if sampled]


@dataclass(frozen=True)
class EpisodeRecord:
    """What the trainer knows of one episode at the end of a step, for `step_table`."""

    trajectory: Trajectory
    reward: float
    success: bool
    components: dict[str, float]
    advantages: Sequence[float]
    """One per sampled token."""
    trainer_logprobs: Sequence[float] | None
    kept: bool


def step_file(folder: Path, step: int) -> Path:
    return folder / f"step_{step:06d}.parquet"


def stored_steps(folder: Path) -> list[int]:
    """The steps with a file in `folder`, ascending."""
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := STEP_FILE.fullmatch(p.name)))


def step_table(step: int, group_size: int, staleness: int, records: Sequence[EpisodeRecord]) -> pa.Table:
    """One step's episodes as a table of SCHEMA."""
    rows = []
    for index, record in enumerate(records):
        t = record.trajectory
        episode = t.episode
        rows.append({
            "step": step,
            "episode": index,
            "group": index // group_size,
            "task_id": episode.task.id,
            "prompt_len": t.prompt_len,
            "token_ids": t.token_ids,
            "loss_mask": [bool(m) for m in t.loss_mask],
            "sampled_logprobs": [lp for lp, m in zip(t.logprobs, t.loss_mask) if m],
            "trainer_logprobs": None if record.trainer_logprobs is None else list(record.trainer_logprobs),
            "advantages": list(record.advantages),
            "reward": record.reward,
            "success": record.success,
            "components": list(record.components.items()),
            "turn_starts": [start for start, _ in t.turn_spans],
            "turn_ends": [end for _, end in t.turn_spans],
            "events": [{"kind": e.kind, "turn": e.turn, "detail": e.detail} for e in episode.events],
            "truncated": episode.truncated,
            "infra_error": episode.infra_error,
            "kept": record.kept,
            "staleness": staleness,
            "messages": json.dumps([m.to_dict() for m in episode.messages]),
            "outcome": json.dumps(episode.outcome, default=str),
            "image_starts": [position for position, _ in t.images],
        })
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def write_step(folder: Path, step: int, table: pa.Table) -> Path:
    """Write one step's table (zstd-compressed Parquet), atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    path = step_file(folder, step)
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def drop_steps_after(folder: Path, step: int) -> None:
    """Delete the files of steps after `step` (a resumed run samples them again)."""
    for later in stored_steps(folder):
        if later > step:
            step_file(folder, later).unlink()


def read_step(folder: Path, step: int) -> list[StoredEpisode]:
    """Step `step`'s episodes; a clear error if the run kept no such step."""
    path = step_file(folder, step)
    if not path.is_file():
        kept = stored_steps(folder)
        where = f"steps {kept[0]}..{kept[-1]}" if kept else "no steps (store_rollouts was off, or RL has not run)"
        raise FileNotFoundError(f"{path} does not exist: {folder} holds {where}")
    return [stored_episode(row) for row in pq.read_table(path).to_pylist()]


def stored_episode(row: dict[str, Any]) -> StoredEpisode:
    return StoredEpisode(**{
        **row,
        "components": dict(row["components"]),
        "messages": json.loads(row["messages"]),
        "outcome": json.loads(row["outcome"]),
        "image_starts": list(row.get("image_starts") or ()),  # absent from steps stored before pictures
    })
