"""The RL jobs the RL benchmarks run (bench/backend_rl.py, bench/ddp.py, bench/async_rl.py,
bench/rollout_store.py): an environment's config and the shipped SFT checkpoint RL starts
from, and `train`, which runs one of them as a user would and returns its RL metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
JOBS = {
    "calc": (ROOT / "src" / "toolpolicy" / "configs" / "demo.yaml", ROOT / "checkpoints" / "calc-sft"),
    "hotel": (ROOT / "src" / "toolpolicy" / "configs" / "hotel.yaml", ROOT / "checkpoints" / "hotel-sft"),
}


def train(env: str, run_dir: Path, threads: int, overrides: dict[str, Any], processes: int = 1) -> list[dict[str, Any]]:
    """`toolpolicy train` on `env`'s job from its SFT checkpoint, with `overrides`, in a process of
    its own (`processes` > 1: under torchrun) with `threads` threads, writing no checkpoint and
    no audit log; the RL rows of its metrics.jsonl."""
    config, checkpoint = JOBS[env]
    settings = {
        "run.dir": run_dir, "rl.init_from": checkpoint, "run.threads": threads, "run.checkpoint_every": 10_000, "gate.audit": False,
        **overrides,
    }
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    command = [*(launcher if processes > 1 else [sys.executable]), "-m", "toolpolicy", "train", str(config)]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["phase"] == "rl"]
