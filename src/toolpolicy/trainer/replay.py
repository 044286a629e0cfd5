"""Success replay (SPEAR; the replay of ARPO-style agents): a group whose episodes all
failed gets a stored success of the same task in place of its last episode.

A group of failures alone carries no signal: every advantage is 0, and dynamic sampling
drops it. With one success in it, the failures are pushed down and the success up, on a
task the policy has solved before and no longer finds. The last success of each task is
kept (token ids, the sampled log-probs, its score); `algorithm.replay` turns it on.

A replayed episode enters the update as a stale rollout, as an async step's episodes do:
its log-probs are those of the policy that sampled it, so each of its tokens is weighted
by the ratio of the current policy to that one (PPO's clipped ratio against its stored
log-probs with `correction: none`, TIS's truncated weight with `tis`). Its own term is
then an importance-weighted policy gradient, unbiased up to the clip or the truncation.
Its reward joins the group's baseline like any member's, so the failures around it get
larger advantages than an on-policy group would give them: a bias toward the stored
success, which is what self-imitation wants. It is not an SFT term. Metrics of the step
(accuracy, reward, tool use) count only the episodes sampled in it.

The store is part of the trainer's checkpoint (`state`, `from_state`: plain values), so a
resumed run replays what an uninterrupted one would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolpolicy.rewards import Score
from toolpolicy.rollout import Trajectory
from toolpolicy.types import Episode, Image

Succeeded = Callable[[Episode], bool]


@dataclass
class SuccessReplay:
    """The last success of each task (by task id), and what `fill` replayed."""

    succeeded: Succeeded
    stored: dict[str, tuple[Trajectory, Score]] = field(default_factory=dict)

    def fill(self, scored: list[tuple[Trajectory, Score]], group_size: int) -> tuple[list[tuple[Trajectory, Score]], list[bool]]:
        """`scored` (groups contiguous) with each all-failed group's last episode replaced by the
        stored success of its task, where there is one; and which positions were replaced.
        Then the successes sampled here are stored (the latest of a task wins)."""
        out, replaced = list(scored), [False] * len(scored)
        counts = [self._counts(trajectory) for trajectory, _ in scored]
        for start in range(0, len(scored), group_size):
            task = scored[start][0].episode.task.id
            if task in self.stored and not any(counts[start : start + group_size]):
                out[start + group_size - 1] = self.stored[task]
                replaced[start + group_size - 1] = True
        for (trajectory, score), counted in zip(scored, counts):
            if counted:
                self.stored[trajectory.episode.task.id] = (trajectory, score)
        return out, replaced

    def _counts(self, trajectory: Trajectory) -> bool:
        """A success worth replaying: solved, and not cut short by the machine."""
        return trajectory.episode.infra_error is None and self.succeeded(trajectory.episode)

    def state(self) -> dict[str, Any]:
        """The store as plain values (lists, numbers, strings), for a checkpoint."""
        return {task: stored_record(trajectory, score) for task, (trajectory, score) in self.stored.items()}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back the store `state` describes."""
        self.stored = {task: from_record(record) for task, record in state.items()}


def stored_record(trajectory: Trajectory, score: Score) -> dict[str, Any]:
    """A stored success as JSON values (the episode's task info passed through JSON, so it holds nothing else)."""
    return {
        "token_ids": list(trajectory.token_ids),
        "loss_mask": list(trajectory.loss_mask),
        "logprobs": [float(x) for x in trajectory.logprobs],
        "prompt_len": trajectory.prompt_len,
        "turn_spans": [list(span) for span in trajectory.turn_spans],
        "images": [[position, image.to_dict()] for position, image in trajectory.images],
        "episode": json.loads(json.dumps(trajectory.episode.to_dict(), default=str)),
        "score": {"total": float(score.total), "components": {k: float(v) for k, v in score.components.items()}},
    }


def from_record(record: dict[str, Any]) -> tuple[Trajectory, Score]:
    trajectory = Trajectory(
        list(record["token_ids"]),
        list(record["loss_mask"]),
        list(record["logprobs"]),
        int(record["prompt_len"]),
        Episode.from_dict(record["episode"]),
        [(int(a), int(b)) for a, b in record["turn_spans"]],
        [(int(position), Image.from_dict(image)) for position, image in record.get("images", ())],
    )
    return trajectory, Score(float(record["score"]["total"]), dict(record["score"]["components"]))
