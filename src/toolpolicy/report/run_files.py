"""Reading a run folder: the only place `report/` touches the file system for input.

A run folder, as the trainer and eval write it:

    config.yaml                 resolved config (shown as text, never parsed)
    metrics.jsonl               one object per line, each with "phase" ("sft"|"rl") and "step"
    eval/<name>.json            summary of one evaluation ("sft" = before, "rl" = after)
    eval/<name>_samples.jsonl   sample episodes of that evaluation, one per line

Every piece is optional: a missing file reads as None and the report says "not
available"; a folder with none of them (or no folder) is RunFileError saying what to run. A file that exists but cannot be read raises RunFileError naming the
file and the line, because a silently half-drawn report is worse than none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolpolicy.jsonl import read_objects


class RunFileError(ValueError):
    """A run-folder file that exists but is malformed (the message starts "path:line:"), or
    no run folder at all (it starts "path:")."""


@dataclass(frozen=True)
class RunFiles:
    """Everything the report shows, as read from one run folder. None means "file absent"."""

    run_dir: Path
    before_name: str
    after_name: str
    config_text: str | None
    metrics: list[dict[str, Any]] | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    before_samples: list[dict[str, Any]] | None
    after_samples: list[dict[str, Any]] | None
    eval_names: list[str]
    """Every eval/<name>.json present, so the reader knows what else could be compared."""


def read_run(run_dir: Path, before: str = "sft", after: str = "rl") -> RunFiles:
    run_dir = Path(run_dir)
    eval_dir = run_dir / "eval"
    config = run_dir / "config.yaml"
    eval_names = sorted(p.stem for p in eval_dir.glob("*.json")) if eval_dir.is_dir() else []
    make_one = f"a run writes one: `toolpolicy demo --set run.dir={run_dir}` (or sft, train, eval CONFIG --set run.dir={run_dir})"
    if not run_dir.is_dir():
        raise RunFileError(f"{run_dir}: no such run folder; {make_one}")
    if not (config.is_file() or (run_dir / "metrics.jsonl").is_file() or eval_names):
        raise RunFileError(f"{run_dir}: no metrics.jsonl, config.yaml or eval results to report; {make_one}")
    return RunFiles(
        run_dir=run_dir,
        before_name=before,
        after_name=after,
        config_text=config.read_text(encoding="utf-8") if config.is_file() else None,
        metrics=read_metrics(run_dir / "metrics.jsonl"),
        before=read_eval(eval_dir / f"{before}.json"),
        after=read_eval(eval_dir / f"{after}.json"),
        before_samples=read_jsonl(eval_dir / f"{before}_samples.jsonl"),
        after_samples=read_jsonl(eval_dir / f"{after}_samples.jsonl"),
        eval_names=eval_names,
    )


def read_jsonl(path: Path) -> list[dict[str, Any]] | None:
    """Objects of a JSON-lines file, blank lines skipped; None if the file is absent."""
    return [row for _, row in read_objects(path, RunFileError)] if path.is_file() else None


def read_metrics(path: Path) -> list[dict[str, Any]] | None:
    """metrics.jsonl rows; each must carry a string "phase" and an integer "step"."""
    if not path.is_file():
        return None
    rows = []
    for where, row in read_objects(path, RunFileError):
        if not isinstance(row.get("phase"), str):
            raise RunFileError(f'{where}: missing "phase" (expected "sft" or "rl")')
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            raise RunFileError(f'{where}: "step" must be an integer, got {step!r}')
        rows.append(row)
    return rows


def read_eval(path: Path) -> dict[str, Any] | None:
    """One eval summary (eval/<name>.json); None if the file is absent."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RunFileError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(data, dict):
        raise RunFileError(f"{path}:1: expected a JSON object, got {type(data).__name__}")
    return data
