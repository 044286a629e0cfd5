"""An evaluation run: held-out tasks, several samples each, metrics and sample episodes to files.

    toolpolicy eval CONFIG [--set eval_checkpoint=PATH] [--set eval_tasks=N]

Tasks come from the environment's "eval" split with `eval_seed`, never used in
training. Sampling uses its own generator seeded from `eval_seed`, so the same
checkpoint scores the same every time and two checkpoints face the same tasks.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from toolpolicy.eval.metrics import EpisodeRecord, summarize
from toolpolicy.model import load_policy
from toolpolicy.rewards import Rubric
from toolpolicy.trainer.config import Config, save_config
from toolpolicy.trainer.setup import make_engine, wrap_policy


def pick_samples(rows: list[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """Up to `n` episodes for the report, spread over difficulty and outcome."""
    buckets: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for row in rows:
        buckets.setdefault((row["task"]["info"].get("difficulty", "all"), row["correct"]), []).append(row)
    rng = random.Random(seed)
    for bucket in buckets.values():
        rng.shuffle(bucket)
    picked: list[dict[str, Any]] = []
    while len(picked) < n and any(buckets.values()):
        for key in sorted(buckets):
            if buckets[key] and len(picked) < n:
                picked.append(buckets[key].pop())
    return picked


def evaluate(cfg: Config, checkpoint: Path, name: str, out_dir: Path) -> dict[str, Any]:
    """Score `checkpoint` and write out_dir/eval/{name}.json and {name}_samples.jsonl."""
    policy = wrap_policy(*load_policy(checkpoint))
    generator = torch.Generator().manual_seed(cfg.eval_seed)
    with make_engine(cfg, policy, generator) as engine:
        env = engine.env
        tasks = env.tasks("eval", cfg.eval_tasks, seed=cfg.eval_seed)
        trajectories = engine.run([task for task in tasks for _ in range(cfg.eval_samples)], progress=f"eval {name}")
    rubric = Rubric.from_weights(cfg.rewards or env.default_rewards)

    records, rows = [], []
    for t in trajectories:
        score = rubric.score(t.episode)
        correct = score.components.get("correct_answer", 0.0) == 1.0
        records.append(EpisodeRecord.from_episode(t.episode, correct, t.response_len))
        rows.append({**t.episode.to_dict(), "reward": score.total, "correct": correct})
    summary = {"name": name, "checkpoint": str(checkpoint), **summarize(records)}

    folder = out_dir / "eval"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(summary, indent=2))
    save_config(cfg, folder / f"{name}.config.yaml")
    samples = pick_samples(rows, cfg.samples_in_report, cfg.eval_seed)
    (folder / f"{name}_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    return summary
