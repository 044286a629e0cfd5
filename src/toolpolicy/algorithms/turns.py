"""Turn-level credit for multi-turn episodes: per-turn rewards -> per-turn advantages -> token positions.

A multi-turn trajectory is a sequence of assistant turns; `Trajectory.turn_spans[t]` is
the [start, end) of turn t in its token ids and `Event.turn` says which turn an event
happened in, so nothing here re-parses text. The flow, per step:

    turn_rewards(num_turns, [(event.turn, event.kind), ...], weights, outcome)   # per trajectory
    turn_advantages(all_turn_rewards, group_size, gamma)                          # GTPO
    varied_returns(all_turn_rewards, group_size, gamma)                           # groups with a signal
    broadcast_turns(per_turn_values, turn_spans, len(token_ids)) -> [L]           # per trajectory

The [L] rows align with token_ids; the trainer's targets are shifted by one
(TokenBatch.loss_mask is [B, L-1]), so it uses row[1:], like the loss mask.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch
from torch import Tensor


def turn_rewards(
    num_turns: int,
    events: Iterable[tuple[int, str]],
    weights: Mapping[str, float],
    outcome: float,
) -> list[float]:
    """Per-turn rewards of one trajectory from its events; the outcome reward goes to the last turn.

    Turn-level reward assignment as in GTPO (Ding et al., arXiv 2511.14846): r_t = sum of
    `weights[kind]` over the events of turn t (e.g. {"tool_call": 0.1, "invalid_call": -0.1}:
    a call that parsed and ran vs one that did not), plus `outcome` on the last turn.
    `events` are (turn index, kind) pairs, e.g. [(e.turn, e.kind) for e in episode.events];
    kinds missing from `weights` add 0. Events with a turn outside [0, num_turns) are ignored.
    """
    rewards = [0.0] * num_turns
    for turn, kind in events:
        if 0 <= turn < num_turns:
            rewards[turn] += float(weights.get(kind, 0.0))
    if num_turns:
        rewards[-1] += float(outcome)
    return rewards


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}, from the last turn back (the return of each turn)."""
    returns = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        returns[t] = running
    return returns


def turn_advantages(
    turn_rewards: list[list[float]], group_size: int, gamma: float = 1.0, eps: float = 1e-6
) -> list[list[float]]:
    """Per-turn advantages: discounted returns per turn, normalised within the group.

    GTPO's return-based advantage (Ding et al., arXiv 2511.14846): each turn t of trajectory
    i gets G_it = sum_{k >= t} gamma^(k - t) r_ik, then (G_it - mean) / (std + eps), where the
    mean and (unbiased) std are taken over every turn's return of every trajectory in the
    group (trajectories of one prompt, contiguous). Pooling the group's turns is our reading
    for trajectories with different numbers of turns. A turn is credited only with what
    follows it, so a bad call early in a successful episode is not rewarded like the turn
    that solved it. A group whose returns are all equal gets 0.
    `turn_rewards[b]` is trajectory b's per-turn rewards (see `turn_rewards`); B must be a
    multiple of `group_size`. Returns the same ragged shape.
    """
    if group_size < 1 or len(turn_rewards) % group_size:
        raise ValueError(f"{len(turn_rewards)} trajectories are not whole groups of {group_size}")
    out: list[list[float]] = []
    for start in range(0, len(turn_rewards), group_size):
        returns = [discounted_returns(r, gamma) for r in turn_rewards[start : start + group_size]]
        pooled = torch.tensor([g for row in returns for g in row], dtype=torch.float64)  # [turns in group]
        mean = pooled.mean() if pooled.numel() else pooled.new_zeros(())
        std = pooled.std() if pooled.numel() > 1 else pooled.new_zeros(())
        out.extend([[float((g - mean) / (std + eps)) for g in row] for row in returns])
    return out


def varied_returns(turn_rewards: list[list[float]], group_size: int, gamma: float = 1.0) -> Tensor:
    """True for each group whose turns' returns are not all equal.   -> [G] bool

    The groups that carry a signal for `turn_advantages`: it normalises over every turn's
    return in the group, so a group learns something when any two returns differ, even if
    its episodes' outcomes tie (a needless call in one of them, say).
    """
    if group_size < 1 or len(turn_rewards) % group_size:
        raise ValueError(f"{len(turn_rewards)} trajectories are not whole groups of {group_size}")
    out = []
    for start in range(0, len(turn_rewards), group_size):
        returns = {g for r in turn_rewards[start : start + group_size] for g in discounted_returns(r, gamma)}
        out.append(len(returns) > 1)
    return torch.tensor(out, dtype=torch.bool)  # [G]


def broadcast_turns(values: Sequence[float], turn_spans: Sequence[tuple[int, int]], length: int) -> Tensor:
    """Put each turn's value on that turn's tokens: out[start:end] = values[t]; 0 elsewhere.   -> [L]

    `turn_spans` is Trajectory.turn_spans ([start, end) of each sampled assistant turn in
    token_ids) and `length` is len(token_ids). Prompt, tool output and user turns get 0, and
    the loss mask zeroes them anyway.
    """
    if len(values) != len(turn_spans):
        raise ValueError(f"{len(values)} turn values for {len(turn_spans)} turn spans")
    out = torch.zeros(length)  # [L]
    for value, (start, end) in zip(values, turn_spans):
        if not 0 <= start <= end <= length:
            raise ValueError(f"turn span ({start}, {end}) outside a sequence of length {length}")
        out[start:end] = float(value)
    return out  # [L]
