"""From scored episodes to what the loss needs: rewards, advantages and which episodes train.

The RL loop calls three things, each picked from the config once:
- `step_rewards`: the Rubric totals, with infra-failed episodes filled from their group
  (DESIGN contract 4) and DAPO's soft overlong penalty when it is on;
- `Credit`: the advantage of every episode (outcome credit, [B]) or of every token
  (GTPO turn credit, [B, L-1], aligned with TokenBatch.targets);
- `update_mask`: dynamic sampling, truncation and void-turn filters together.
The math lives in `toolpolicy.algorithms`; this file only reads Trajectories and Scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolpolicy.algorithms import (
    ADVANTAGES,
    broadcast_turns,
    expand_group_mask,
    gdpo_advantages,
    soft_overlong_penalty,
    turn_advantages,
    turn_rewards,
    void_turn_filter,
)
from toolpolicy.rewards import Rubric, Score
from toolpolicy.rollout import Trajectory
from toolpolicy.trainer.config import Config

# Events that make a turn productive for SimpleTIR's void-turn filter: it tried a call.
CALL_EVENTS = frozenset({"tool_call", "invalid_call", "tool_error", "gate_deny", "violation"})


def usable_rewards(rewards: torch.Tensor, usable: torch.Tensor, group_size: int) -> torch.Tensor:
    """Replace rewards of infra-failed episodes by their group's mean over usable ones,
    so a machine failure neither scores 0 nor moves the baseline (DESIGN contract 4).
    rewards [B] or [B, C] (per component)."""
    shape = rewards.shape
    grouped = rewards.reshape(-1, group_size, *shape[1:])  # [G, n, ...]
    ok = usable.reshape(-1, group_size, *([1] * (len(shape) - 1))).to(rewards.dtype)  # [G, n, 1...]
    mean = (grouped * ok).sum(1, keepdim=True) / ok.sum(1, keepdim=True).clamp(min=1)  # [G, 1, ...]
    return torch.where(ok.bool(), grouped, mean).reshape(shape)


def overlong(trajectories: list[Trajectory], cfg: Config) -> torch.Tensor:
    """DAPO's soft overlong penalty per episode ([B], 0 when off), on tokens after the prompt."""
    if cfg.overlong_penalty == 0:
        return torch.zeros(len(trajectories))
    lengths = torch.tensor([t.response_len for t in trajectories])  # [B]
    buffer = int(cfg.overlong_buffer * cfg.max_tokens)
    return cfg.overlong_penalty * soft_overlong_penalty(lengths, cfg.max_tokens, buffer)  # [B]


def step_rewards(trajectories: list[Trajectory], scores: list[Score], usable: torch.Tensor, cfg: Config) -> torch.Tensor:
    """The scalar reward of every episode: Rubric total (+ overlong penalty), infra-filled.   -> [B]"""
    totals = torch.tensor([s.total for s in scores]) + overlong(trajectories, cfg)  # [B]
    return usable_rewards(totals, usable, cfg.group_size)


@dataclass(frozen=True)
class Credit:
    """Advantages for one step. `per_token` says whether `__call__` returns [B, L-1] rows
    (turn credit, to be cut to each micro-batch's width) or one value per episode [B]."""

    cfg: Config
    rubric: Rubric

    @property
    def per_token(self) -> bool:
        return self.cfg.credit == "turn"

    def __call__(
        self, trajectories: list[Trajectory], scores: list[Score], rewards: torch.Tensor, usable: torch.Tensor
    ) -> torch.Tensor:
        """Per-episode advantages [B], or with turn credit per-token rows [B, L-1] (L: the
        longest trajectory) aligned with TokenBatch.targets. `rewards` [B] is step_rewards'."""
        if not self.per_token:
            return self.episodes(trajectories, scores, rewards, usable)
        return self.tokens(trajectories, rewards, max(len(t.token_ids) for t in trajectories))

    def episodes(
        self, trajectories: list[Trajectory], scores: list[Score], rewards: torch.Tensor, usable: torch.Tensor
    ) -> torch.Tensor:
        """One advantage per episode: an estimator on the rewards, or GDPO on the components.   -> [B]"""
        size = self.cfg.group_size
        if self.cfg.advantage != "gdpo":
            return ADVANTAGES[self.cfg.advantage](rewards, size)
        terms = [term for term in self.rubric.terms if term.weight != 0.0]
        columns = [[s.components[term.name] for term in terms] for s in scores]
        components = torch.tensor(columns, dtype=torch.float32).reshape(len(scores), len(terms))  # [B, C]
        weights = torch.tensor([term.weight for term in terms])  # [C]
        penalty = overlong(trajectories, self.cfg)  # [B]
        if self.cfg.overlong_penalty:
            components = torch.cat([components, penalty[:, None]], dim=1)  # [B, C+1]
            weights = torch.cat([weights, torch.ones(1)])
        return gdpo_advantages(usable_rewards(components, usable, size), weights, size)

    def tokens(
        self, trajectories: list[Trajectory], rewards: torch.Tensor, width: int
    ) -> torch.Tensor:
        """GTPO turn credit for whole groups of trajectories, in order.   -> [B, width-1]

        Each turn's reward comes from its events (cfg.turn_rewards) and the episode's
        reward on its last turn; the discounted returns are normalised within the group
        and put on that turn's sampled tokens.
        """
        per_turn = [
            turn_rewards(len(t.turn_spans), [(e.turn, e.kind) for e in t.episode.events], self.cfg.turn_rewards, float(r))
            for t, r in zip(trajectories, rewards.tolist())
        ]
        values = turn_advantages(per_turn, self.cfg.group_size, self.cfg.turn_gamma)
        rows = torch.zeros(len(trajectories), width)  # [B, L]
        for row, (t, v) in enumerate(zip(trajectories, values)):
            rows[row, : len(t.token_ids)] = broadcast_turns(v, t.turn_spans, len(t.token_ids))
        return rows[:, 1:]  # [B, L-1]: position t predicts token t+1, as TokenBatch.targets


def productive_turns(trajectory: Trajectory) -> list[bool]:
    """Per sampled turn: did it try a tool call, or is it the final answer? (SimpleTIR)"""
    turns = len(trajectory.turn_spans)
    calling = {e.turn for e in trajectory.episode.events if e.kind in CALL_EVENTS}
    answered = not trajectory.episode.truncated
    return [t in calling or (t == turns - 1 and answered) for t in range(turns)]


def update_mask(trajectories: list[Trajectory], groups: torch.Tensor, usable: torch.Tensor, cfg: Config) -> torch.Tensor:
    """Episodes the update uses: kept groups, usable, and not filtered out.   -> [B] bool"""
    keep = expand_group_mask(groups, cfg.group_size) & usable  # [B]
    if cfg.mask_truncated:
        keep &= torch.tensor([not t.episode.truncated for t in trajectories])
    if cfg.void_turn_filter:
        keep &= void_turn_filter([productive_turns(t) for t in trajectories])
    return keep
