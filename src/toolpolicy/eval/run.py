"""An evaluation run: held-out tasks, several samples each, metrics and sample episodes to files.

    toolpolicy eval CONFIG [--trials N] [--gate on|off|both] [--set eval.checkpoint=PATH]
    toolpolicy eval CONFIG --set eval.served_url=http://localhost:8000/v1 --set eval.served_model=NAME

Tasks come from the environment's "eval" split with `eval_seed`, never used in
training. Sampling uses its own generator seeded from `eval_seed`, so the same
checkpoint scores the same every time and two checkpoints face the same tasks.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

from toolpolicy.build import build_engine, build_env, build_gate, build_rubric, episode_limits, inference_policy, policy_path
from toolpolicy.envs import Env
from toolpolicy.eval.metrics import ScoredEpisode, summarize
from toolpolicy.rewards import RewardFunction, reward_function, term_means
from toolpolicy.rollout.chat_endpoint import ChatClient, ChatEngine, Endpoint
from toolpolicy.rollout.dropped import dropped_causes, dropped_line
from toolpolicy.rollout.engine import Figures
from toolpolicy.config import Config, ConfigError, save_config
from toolpolicy.types import Episode, Task


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


def evaluate(cfg: Config, checkpoint: Path | None, name: str, out_dir: Path, gate: bool = True) -> dict[str, Any]:
    """Score `checkpoint` (or the served model at eval.served_url) and write
    out_dir/eval/{name}.json and {name}_samples.jsonl. Episodes dropped for an
    infrastructure error are counted (`infra_errors`), listed by cause (`dropped`) and
    reported on stderr.

    gate=False runs the gate in shadow mode: gate.policy is not enforced, so the agent
    does what it would do with nothing stopping it, and every call the policy would
    deny is counted as a violation.
    """
    if cfg.eval.served_url:
        env, episodes = _run_endpoint(cfg, name, gate)
    else:
        env, episodes = _run_checkpoint(cfg, checkpoint, name, gate)
    rubric = build_rubric(cfg.rewards, env.default_rewards)
    success = reward_function(env.success_reward)

    records, rows, scores = [], [], []
    for episode, tokens in episodes:
        correct = success(episode) == 1.0
        score = rubric.score(episode)
        records.append(ScoredEpisode.from_episode(episode, correct, tokens))
        rows.append({**episode.to_dict(), "reward": score.total, "correct": correct})
        if episode.infra_error is None:
            scores.append(score)
    scored = cfg.eval.served_model if cfg.eval.served_url else str(checkpoint)
    summary = {"name": name, "checkpoint": scored, "gate": gate, "policy": policy_path(cfg.gate, env), **summarize(records)}
    summary["rewards"] = term_means(scores)
    ended = [episode for episode, _ in episodes]
    summary["dropped"] = dict(dropped_causes(ended))  # infra_error -> episodes it dropped
    line = dropped_line(ended)
    if line is not None:
        print(f"warning: eval {name}: {line}", file=sys.stderr)

    folder = out_dir / "eval"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(summary, indent=2))
    save_config(cfg, folder / f"{name}.config.yaml")
    samples = pick_samples(rows, cfg.eval.samples_in_report, cfg.eval.seed)
    (folder / f"{name}_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    return summary


def running_success(success: RewardFunction) -> Figures:
    """The evaluation bar's figure: the share of the episodes ended so far that `success`
    scores 1 (infrastructure errors left out, as in the summary)."""

    def figures(ended: list[Episode]) -> dict[str, str]:
        counted = [e for e in ended if e.infra_error is None]
        return {"success": f"{sum(success(e) == 1.0 for e in counted) / len(counted):.2f}"} if counted else {}

    return figures


def _trials(cfg: Config, env: Env) -> list[Task]:
    tasks = env.tasks("eval", cfg.eval.tasks, seed=cfg.eval.seed)
    return [task for task in tasks for _ in range(cfg.eval.samples)]


def _run_checkpoint(cfg: Config, checkpoint: Path | None, name: str, gate: bool) -> tuple[Env, list[tuple[Episode, int]]]:
    """The environment, and the episodes of a local model with the tokens each generated after its prompt."""
    if checkpoint is None:
        raise ConfigError("no checkpoint to evaluate: set eval.checkpoint or eval.served_url")
    policy = inference_policy(cfg.model, checkpoint)
    generator = torch.Generator().manual_seed(cfg.eval.seed)
    with build_engine(cfg, policy, generator, cfg.eval.temperature, enforce=gate) as engine:
        figures = running_success(reward_function(engine.env.success_reward))
        trajectories = engine.run(_trials(cfg, engine.env), progress=f"eval {name}", figures=figures)
    return engine.env, [(t.episode, t.response_len) for t in trajectories]


def _run_endpoint(cfg: Config, name: str, gate: bool) -> tuple[Env, list[tuple[Episode, int]]]:
    """The environment, and the episodes of the model served at eval.served_url with the completion tokens it reported."""
    env = build_env(cfg.env)
    endpoint = Endpoint(
        cfg.eval.served_url,
        cfg.eval.served_model,
        api_key_env=cfg.eval.served_api_key_env,
        temperature=cfg.eval.temperature,
        max_tokens=cfg.eval.served_max_tokens,
        concurrency=cfg.eval.served_concurrency,
    )
    client = ChatClient(endpoint)
    try:
        with ChatEngine(env, client, episode_limits(cfg.rollout), build_gate(cfg.gate, env, Path(cfg.run.dir), enforce=gate)) as engine:
            figures = running_success(reward_function(env.success_reward))
            rollouts = engine.run(_trials(cfg, env), progress=f"eval {name}", figures=figures)
    finally:
        client.close()
    return env, [(r.episode, r.completion_tokens) for r in rollouts]
