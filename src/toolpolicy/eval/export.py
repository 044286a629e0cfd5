"""A run's successful episodes as SFT data: rejection sampling, or self-distillation from RL.

    toolpolicy rollouts export RUN_DIR --to sft.jsonl

The episodes come from the run's rollout store (every RL step's episodes,
RUN_DIR/rl/rollouts, with the tools of the run's environment) and from the evaluation
sample files it holds (RUN_DIR/eval/<name>_samples.jsonl, `samples_in_report` episodes
per evaluation), each with the tools of the environment its evaluation ran
(RUN_DIR/eval/<name>.config.yaml).
`chat_record` turns any episode's messages into the record SFT reads back with
`sft_data`, so another source of episodes plugs in at `export_episodes`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from toolpolicy.chat.records import chat_record
from toolpolicy.build import load_config
from toolpolicy.jsonl import read_objects
from toolpolicy.types import Message, ToolSpec

class ExportError(ValueError):
    """A run folder whose files cannot be exported; the message names the file."""


FORBIDDEN_EVENTS = ("gate_deny", "violation")
"""Events of a call the policy forbids: an episode with one is not a demonstration to imitate."""


def is_success(correct: Any, truncated: Any, infra_error: Any, events: Any) -> bool:
    """An episode worth imitating: its success reward was 1 (`correct` is True), it ran to its
    end (not truncated, no infrastructure error), and it made no call the policy forbids,
    denied or not.

    >>> is_success(True, False, None, [])
    True
    >>> is_success(True, False, None, [{"kind": "gate_deny"}])
    False
    """
    forbidden = any(isinstance(e, dict) and e.get("kind") in FORBIDDEN_EVENTS for e in events or [])
    return correct is True and not truncated and not infra_error and not forbidden


def export_episodes(conversations: Iterable[tuple[Sequence[Message], Sequence[ToolSpec]]], out: Path) -> int:
    """Write each (messages, tools) as one chat record line of `out`; return how many."""
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with out.open("w", encoding="utf-8") as lines:
        for messages, tools in conversations:
            lines.write(json.dumps(chat_record(messages, tools), ensure_ascii=False) + "\n")
            count += 1
    return count


def successful_stored_episodes(run_dir: Path) -> Iterable[tuple[list[Message], list[ToolSpec]]]:
    """The messages of every successful episode of the run's stored RL steps, with the run's tools."""
    from toolpolicy.build import build_env  # here: building an environment imports its tools
    from toolpolicy.rollout.store import read_step, stored_steps

    folder = run_dir / "rl" / "rollouts"
    steps = stored_steps(folder)
    if not steps:
        return
    tools = build_env(load_config(run_dir / "config.yaml").env).tools.specs()
    for step in steps:
        for stored in read_step(folder, step):
            if is_success(stored.success, stored.truncated, stored.infra_error, stored.events):
                yield [Message.from_dict(m) for m in stored.messages], tools


def successful_eval_episodes(run_dir: Path) -> Iterable[tuple[list[Message], list[ToolSpec]]]:
    """The messages of every successful episode in the run's evaluation sample files, with
    the tools of the environment each evaluation ran."""
    from toolpolicy.build import build_env  # here: building an environment imports its tools

    for samples in sorted((run_dir / "eval").glob("*_samples.jsonl")):
        config = samples.with_name(samples.name.removesuffix("_samples.jsonl") + ".config.yaml")
        if not config.is_file():
            raise ExportError(f"{samples}: its evaluation's config {config.name} is missing, so its tools are unknown")
        tools = build_env(load_config(config).env).tools.specs()
        for _, sample in read_objects(samples, ExportError):
            if is_success(sample.get("correct"), sample.get("truncated"), sample.get("infra_error"), sample.get("events")):
                yield [Message.from_dict(m) for m in sample.get("messages") or []], tools


def export_run(run_dir: str | Path, out: str | Path) -> int:
    """`toolpolicy rollouts export`: the run's successful episodes (stored RL steps, then
    evaluation samples) to `out` as chat records."""
    run_dir = Path(run_dir)
    if not list((run_dir / "eval").glob("*_samples.jsonl")) and not (run_dir / "rl" / "rollouts").is_dir():
        raise FileNotFoundError(
            f"{run_dir}: no stored RL rollouts (rl/rollouts) and no evaluation samples (eval/*_samples.jsonl); "
            "train with store_rollouts: true or run `toolpolicy eval` first"
        )
    return export_episodes(itertools.chain(successful_stored_episodes(run_dir), successful_eval_episodes(run_dir)), Path(out))
