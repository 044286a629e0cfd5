"""Where a run's metrics go besides metrics.jsonl: TensorBoard, Weights & Biases, Trackio.

`report_to: [tensorboard, wandb, trackio]` (any subset) opens one tracker each. Every
tracker gets the same records as metrics.jsonl under the same names, `PHASE/METRIC`
(`rl/reward`, `sft/loss`), aligned on the phase's own step, and the resolved config
as the run's hyperparameters. So one run's curves read the same in every tool.

    tensorboard  event files in RUN_DIR/tensorboard/PHASE (one folder per phase, so a
                 resumed phase purges the steps it repeats without touching the other)
    wandb        one W&B run per run folder (its id kept in RUN_DIR/wandb-run-id, so SFT,
                 RL and every resume append to it); `PHASE/step` is each phase's x-axis.
                 WANDB_MODE=offline keeps it on disk (`wandb sync` uploads it later)
    trackio      one Trackio run per run folder, stored where Trackio keeps its
                 projects (TRACKIO_DIR; `trackio show` opens the dashboard)

Each library is imported only when asked for, with an install hint if it is missing.
"""

from __future__ import annotations

import importlib
import json
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from toolpolicy.config import Config, ConfigError

TRACKERS = ("tensorboard", "wandb", "trackio")


class Tracker(Protocol):
    """A destination for one phase's metrics."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record `metrics` (already named PHASE/METRIC) at the phase's `step`."""
        ...

    def close(self) -> None: ...


def metric_names(phase: str, record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics.jsonl record, named PHASE/METRIC ("phase" and "step" left out)."""
    return {
        f"{phase}/{key}": float(value)
        for key, value in record.items()
        if key not in ("phase", "step") and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def hyperparameters(cfg: Config) -> dict[str, Any]:
    """The resolved config as `section.field` keys, with lists and mappings as JSON text (what every tracker accepts)."""
    return {
        f"{section}.{key}": value if isinstance(value, (int, float, str, bool)) else json.dumps(value)
        for section, fields in cfg.model_dump().items() for key, value in fields.items()
    }


def run_name(cfg: Config, run_dir: Path) -> str:
    return cfg.run.name or run_dir.resolve().name


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise ConfigError(
            f"run.report_to: {name!r} needs the {name} package ({error}); "
            f"install it with `pip install 'toolpolicy[track]'` or `pip install {name}`"
        ) from error


class TensorBoardTracker:
    def __init__(self, cfg: Config, run_dir: Path, phase: str, start: int) -> None:
        _import("tensorboard")
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # purge_step: a resumed phase drops the events it logged after its checkpoint.
        self.writer = SummaryWriter(str(run_dir / "tensorboard" / phase), purge_step=start + 1 if start else None)
        if not start:
            for summary in hparams(hyperparameters(cfg), {}):
                self.writer.file_writer.add_summary(summary)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, cfg: Config, run_dir: Path, phase: str, start: int) -> None:
        wandb = _import("wandb")
        id_file = run_dir / "wandb-run-id"
        if not id_file.is_file():
            id_file.write_text(secrets.token_hex(4) + "\n")
        self.run = wandb.init(
            project=cfg.run.tracker_project, name=run_name(cfg, run_dir), id=id_file.read_text().strip(),
            resume="allow", dir=str(run_dir), config=hyperparameters(cfg),
        )
        self.run.define_metric(f"{phase}/step")
        self.run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
        self.phase = phase

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({f"{self.phase}/step": step, **metrics})

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    def __init__(self, cfg: Config, run_dir: Path, phase: str, start: int) -> None:
        self.trackio = _import("trackio")
        self.run = self.trackio.init(
            project=cfg.run.tracker_project, name=run_name(cfg, run_dir), config=hyperparameters(cfg), resume="allow",
            embed=False,
        )
        self.phase = phase

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({f"{self.phase}/step": step, **metrics})

    def close(self) -> None:
        self.run.finish()


OPENERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "trackio": TrackioTracker}


def open_trackers(cfg: Config, run_dir: Path, phase: str, start: int) -> list[Tracker]:
    """One tracker per `run.report_to` entry for `phase`, which starts (or resumes) after `start` steps."""
    return [OPENERS[name](cfg, run_dir, phase, start) for name in cfg.run.report_to]
