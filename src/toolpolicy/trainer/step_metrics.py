"""What an RL step writes to metrics.jsonl and the rollout store: the rollouts' figures
(reward and each Rubric term, accuracy, tool use, violations, per difficulty), the branched
groups', the step's counts, and each episode's record for the store.

Pure functions of a step's results; `train_rl` adds the update's figures, timings and memory.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch
from torch import Tensor

from toolpolicy.rewards import RewardFunction, Score, policy_violation, term_means
from toolpolicy.rollout import Trajectory
from toolpolicy.rollout.dropped import dropped_metrics
from toolpolicy.rollout.store import EpisodeRecord
from toolpolicy.trainer.groups import StepRollouts


def step_record(
    step: int, sampled: StepRollouts, success: RewardFunction, group_size: int, trained: int, update: dict[str, float],
    grad_norms: list[float], lr: float, staleness: int, branched: bool, replayed: bool,
) -> dict[str, float]:
    """Step `step`'s line of metrics.jsonl before its timings: the figures of the episodes sampled
    from the task's start (`rollout_metrics`; replayed and branched ones stand apart), the
    update's (`update`, from update.update_metrics), the groups kept and with a signal, the
    episodes `trained`, the refill rounds, the LR of its first optimizer step, the mean gradient
    norm, and the staleness of its first round's sampler (async RL)."""
    elsewhere = (sampled.replayed | sampled.branched).tolist()
    fresh = [i for i, other in enumerate(elsewhere) if not other]
    fresh_metrics = rollout_metrics([sampled.trajectories[i] for i in fresh], [sampled.scores[i] for i in fresh], success)
    record = {"phase": "rl", "step": step, **fresh_metrics, **update}
    record["sampled_tokens"] = sum(t.sampled_tokens for t, stand_in in zip(sampled.trajectories, sampled.replayed.tolist()) if not stand_in)
    if branched:
        record.update(branch_metrics(sampled, group_size, success))
    record.update({"kept_groups": int(sampled.groups.sum()), "signal_groups": int((sampled.groups & sampled.signal).sum())})
    record["trained_episodes"] = trained
    if replayed:
        record["replayed_episodes"] = int(sampled.replayed.sum())
    record.update({"refill_rounds": sampled.refill_rounds, "lr": lr, "optimizer_steps": len(grad_norms)})
    record["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else 0.0
    record["staleness"] = staleness
    return record


def rollout_metrics(trajectories: list[Trajectory], scores: list[Score], success: RewardFunction) -> dict[str, float]:
    """Per-step means of reward (and of each Rubric term, as rewards/<name>), accuracy (the share with `success` 1, as in evaluation),
    tool use and policy violations, overall and per difficulty. Episodes with an
    infrastructure error are left out of every mean and only counted (docs/architecture.md, contract 4),
    in all and per failed tool (infra_errors/<tool>)."""
    counted = [(t, s) for t, s in zip(trajectories, scores) if t.episode.infra_error is None]
    out: dict[str, float] = {"infra_errors": len(trajectories) - len(counted), **dropped_metrics([t.episode for t in trajectories])}
    if not counted:
        return out
    n = len(counted)
    episodes = [t.episode for t, _ in counted]
    solved = [success(e) == 1.0 for e in episodes]
    calls = sum(e.count("tool_call") for e in episodes)
    invalid = sum(e.count("invalid_call") for e in episodes)
    out["reward"] = sum(s.total for _, s in counted) / n
    out.update({f"rewards/{name}": mean for name, mean in term_means([s for _, s in counted]).items()})
    out["accuracy"] = sum(solved) / n
    out["tool_calls"] = calls / n
    out["invalid_call_rate"] = invalid / max(1, calls + invalid)
    out["truncated_rate"] = sum(e.truncated for e in episodes) / n
    out["response_tokens"] = sum(e.response_tokens for e in episodes) / n
    out["denials"] = sum(e.count("gate_deny") for e in episodes) / n
    out["violations"] = sum(policy_violation(e) for e in episodes) / n
    by_rule: Counter[str] = Counter()
    by_difficulty: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(episodes):
        by_rule.update(e.denials_by_rule())
        by_difficulty[e.task.difficulty].append(i)
    for rule, count in sorted(by_rule.items()):
        out[f"denials/{rule}"] = count / n
    for difficulty, rows in sorted(by_difficulty.items()):
        out[f"accuracy/{difficulty}"] = sum(solved[i] for i in rows) / len(rows)
        out[f"tool_calls/{difficulty}"] = sum(episodes[i].count("tool_call") for i in rows) / len(rows)
    return out


def branch_metrics(sampled: StepRollouts, group_size: int, success: RewardFunction) -> dict[str, float]:
    """The branched groups' figures: how many, how many carried a signal, and the share of their
    usable episodes that succeeded (after an error prefix: the recovery rate)."""
    rows = torch.nonzero(sampled.branched).flatten().tolist()
    groups = sorted({i // group_size for i in rows})
    solved = [success(sampled.trajectories[i].episode) == 1.0 for i in rows if sampled.usable[i]]
    return {
        "branch/groups": len(groups),
        "branch/signal_groups": int(sampled.signal[groups].sum()) if groups else 0,
        "branch/accuracy": sum(solved) / len(solved) if solved else 0.0,
    }


def step_records(
    sampled: StepRollouts, advantages: Tensor, keep: Tensor, recomputed: dict[int, list[float]], success: RewardFunction
) -> list[EpisodeRecord]:
    """What the rollout store keeps of each of the step's episodes."""
    return [
        EpisodeRecord(
            t, score.total, success(t.episode) == 1.0, score.components, sampled_advantages(advantages, i, t),
            recomputed.get(i), bool(keep[i]),
        )
        for i, (t, score) in enumerate(zip(sampled.trajectories, sampled.scores))
    ]


def sampled_advantages(advantages: Tensor, row: int, trajectory: Trajectory) -> list[float]:
    """The advantage of each token episode `row` sampled: its scalar repeated, or its per-token values
    (advantages [B] or [B, L-1], where position t is the advantage of token t + 1)."""
    if advantages.dim() == 1:
        return [float(advantages[row])] * trajectory.sampled_tokens
    mask = torch.tensor(trajectory.loss_mask[1:], dtype=torch.bool)  # [L-1]
    return advantages[row, : mask.shape[0]][mask].tolist()


def progress_line(record: dict[str, float]) -> dict[str, str]:
    """The RL bar's figures: reward, accuracy, kept groups, sampled tokens a second."""
    sampled = record["sampled_tokens"]
    return {
        "reward": f"{record.get('reward', 0.0):.3f}",
        "acc": f"{record.get('accuracy', 0.0):.2f}",
        "kept": str(record["kept_groups"]),
        "tok/s": f"{sampled / max(record['time/step'], 1e-9):.0f}",
    }
