"""From scored episodes to what the loss needs: the reward matrix, advantages, and which episodes train.

Chosen once from the config, called every step:
- `reward_matrix`: every Rubric term's value per episode, [B, C], with its weights [C];
  infra-failed episodes filled from their group (docs/architecture.md, contract 4). The scalar reward
  is `rewards @ weights`; GDPO reads the columns.
- a credit: `OutcomeCredit` (one advantage per episode from the config's estimator, [B])
  or `TurnCredit` (GTPO turn credit, [B, L-1], aligned with TokenBatch.targets); each
  also says which groups carry a learning signal for it (dynamic sampling keeps those).
- episode filters: truncation and void-turn filters, each a function of the trajectories.
The math lives in `toolpolicy.algorithms`; this file only reads Trajectories and Scores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from toolpolicy.algorithms import (
    Estimator,
    broadcast_turns,
    expand_group_mask,
    turn_advantages,
    turn_rewards,
    varied_returns,
    void_turn_filter,
)
from toolpolicy.rewards import Rubric, Score
from toolpolicy.rollout import Trajectory

# Events that make a turn productive for SimpleTIR's void-turn filter: it tried a call.
CALL_EVENTS = frozenset({"tool_call", "invalid_call", "tool_error", "gate_deny", "violation"})


def usable_rewards(rewards: Tensor, usable: Tensor, group_size: int) -> Tensor:
    """Replace rewards of infra-failed episodes by their group's mean over usable ones,
    so a machine failure neither scores 0 nor moves the baseline (docs/architecture.md, contract 4).
    rewards [B] or [B, C] (per component)."""
    shape = rewards.shape
    grouped = rewards.reshape(-1, group_size, *shape[1:])  # [G, n, ...]
    ok = usable.reshape(-1, group_size, *([1] * (len(shape) - 1))).to(rewards.dtype)  # [G, n, 1...]
    mean = (grouped * ok).sum(1, keepdim=True) / ok.sum(1, keepdim=True).clamp(min=1)  # [G, 1, ...]
    return torch.where(ok.bool(), grouped, mean).reshape(shape)


def reward_matrix(rubric: Rubric, scores: list[Score], usable: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """Every term's value per episode, infra-filled, and the terms' weights.   -> [B, C], [C]

    Weight-0 terms (metrics) are columns too; they add nothing to `rewards @ weights`,
    which is each episode's Rubric total."""
    columns = [[score.components[term.name] for term in rubric.terms] for score in scores]
    rewards = torch.tensor(columns, dtype=torch.float64).reshape(len(scores), len(rubric.terms))  # [B, C]
    weights = torch.tensor([term.weight for term in rubric.terms], dtype=torch.float64)  # [C]
    return usable_rewards(rewards, usable, group_size), weights


class Credit(Protocol):
    """How a step's rewards become advantages, and which groups carry a signal for it."""

    def signal(self, trajectories: list[Trajectory], rewards: Tensor, weights: Tensor, group_size: int) -> Tensor:
        """[G] bool: the groups whose advantages are not all zero."""
        ...

    def advantages(
        self, trajectories: list[Trajectory], rewards: Tensor, weights: Tensor, group_size: int, groups: Tensor
    ) -> Tensor:
        """[B] per episode, or [B, L-1] per token (L: the longest trajectory), computed from the
        groups that train (`groups` [G] bool) alone and 0 elsewhere: an estimator that
        normalises over the batch normalises over what trains, not over groups dropped after."""
        ...


@dataclass(frozen=True)
class OutcomeCredit:
    """One advantage per episode, from an estimator on the reward matrix."""

    estimator: Estimator

    def signal(self, trajectories: list[Trajectory], rewards: Tensor, weights: Tensor, group_size: int) -> Tensor:
        return self.estimator.signal(rewards, weights, group_size)  # [G]

    def advantages(
        self, trajectories: list[Trajectory], rewards: Tensor, weights: Tensor, group_size: int, groups: Tensor
    ) -> Tensor:
        rows = expand_group_mask(groups, group_size)  # [B]: whole groups, in order
        out = torch.zeros(len(trajectories))  # [B]
        if rows.any():
            out[rows] = self.estimator.advantages(rewards[rows], weights, group_size).float()
        return out


@dataclass(frozen=True)
class TurnCredit:
    """GTPO turn credit: each turn's reward comes from its events (`event_weights`) and the
    episode's total reward on its last turn; the discounted returns are normalised within
    the group and put on that turn's sampled tokens."""

    event_weights: Mapping[str, float]
    gamma: float

    def per_turn(self, trajectories: list[Trajectory], rewards: Tensor, weights: Tensor) -> list[list[float]]:
        totals = (rewards @ weights).tolist()  # [B]
        return [
            turn_rewards(len(t.turn_spans), [(e.turn, e.kind) for e in t.episode.events], self.event_weights, total)
            for t, total in zip(trajectories, totals)
        ]

    def signal(self, trajectories: list[Trajectory], rewards: Tensor, weights: Tensor, group_size: int) -> Tensor:
        return varied_returns(self.per_turn(trajectories, rewards, weights), group_size, self.gamma)  # [G]

    def advantages(
        self, trajectories: list[Trajectory], rewards: Tensor, weights: Tensor, group_size: int, groups: Tensor
    ) -> Tensor:
        """Normalised within each group, so the groups that do not train change nothing; they get 0."""
        values = turn_advantages(self.per_turn(trajectories, rewards, weights), group_size, self.gamma)
        training = expand_group_mask(groups, group_size).tolist()  # [B]
        width = max(len(t.token_ids) for t in trajectories)
        rows = torch.zeros(len(trajectories), width)  # [B, L]
        for row, (t, v, trains) in enumerate(zip(trajectories, values, training)):
            if trains:
                rows[row, : len(t.token_ids)] = broadcast_turns(v, t.turn_spans, len(t.token_ids))
        return rows[:, 1:]  # [B, L-1]: position t predicts token t+1, as TokenBatch.targets


EpisodeFilter = Callable[[list[Trajectory]], Tensor]
"""Trajectories -> [B] bool, True for those the update may train on."""


def not_truncated(trajectories: list[Trajectory]) -> Tensor:
    """Episodes not cut by max turns or max tokens (DAPO's overlong filtering, arXiv 2503.14476,
    section 3.4; TRL's `mask_truncated_completions`): an unfinished answer is not a wrong one."""
    return torch.tensor([not t.episode.truncated for t in trajectories], dtype=torch.bool)  # [B]


def productive_turns(trajectory: Trajectory) -> list[bool]:
    """Per sampled turn: did it try a tool call, or is it the final answer? (SimpleTIR)"""
    turns = len(trajectory.turn_spans)
    calling = {e.turn for e in trajectory.episode.events if e.kind in CALL_EVENTS}
    answered = not trajectory.episode.truncated
    return [t in calling or (t == turns - 1 and answered) for t in range(turns)]


def no_void_turn(trajectories: list[Trajectory]) -> Tensor:
    """Episodes in which every turn called a tool or answered (SimpleTIR's void-turn filter)."""
    return void_turn_filter([productive_turns(t) for t in trajectories])  # [B]


def update_mask(
    trajectories: list[Trajectory], groups: Tensor, usable: Tensor, group_size: int, filters: tuple[EpisodeFilter, ...]
) -> Tensor:
    """Episodes the update uses: in a kept group, free of infrastructure errors, and kept
    by every filter.   -> [B] bool"""
    keep = expand_group_mask(groups, group_size) & usable  # [B]
    for keeps in filters:
        keep &= keeps(trajectories)
    return keep
