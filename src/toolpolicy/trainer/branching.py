"""Where a step's episodes branch (`algorithm.branch`): each picker is a small function.

After a step's episodes are sampled, `algorithm.branch_groups` of them are continued again
from inside: rl.group_size new continuations of one prefix each (rollout/branch.py), a group
of their own whose advantages compare the continuations alone, so the prefix's outcome,
shared by every member, cancels and only what follows it is credited (TreeRL's advantage of
a node's children against the node). The prefix is not trained again.

- `fission` (Fission-GRPO, FATE): the prefix ends with the observation of an error, a
  malformed call, a tool error or a policy denial; the group learns to recover from it,
  which a group sampled from the task's start rarely reaches often enough to compare.
- `entropy` (ARPO, arXiv 2507.19849; AEPO): the prefix ends with a tool result after which
  the policy is most uncertain. ARPO branches where the entropy of the first tokens after a
  tool call rises above the episode's initial entropy; here each token's entropy is
  estimated by its sampled surprisal, -log p (the entropy is its expectation), averaged over
  the first ENTROPY_TOKENS of the turn, so every backend that returns log-probs serves.

A picker returns candidates, each scored; `choose` keeps the highest `count`, ties in the
order of a seeded shuffle (the step's seed), one per episode: a resumed run picks the same.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from toolpolicy.rollout import Trajectory
from toolpolicy.trainer.credit import CALL_EVENTS

Point = tuple[int, int]
"""(episode of the step, assistant turns in the prefix): where a branch starts."""
Candidate = tuple[float, Point]
"""A point and its score: the higher, the sooner it branches."""
Picker = Callable[[Sequence[Trajectory], Sequence[bool]], list[Candidate]]
"""(the step's episodes, which may branch) -> candidates, at most one per episode."""

ERROR_EVENTS = frozenset({"invalid_call", "tool_error", "gate_deny"})
ENTROPY_TOKENS = 8
"""Sampled tokens at the start of a turn whose surprisal estimates the turn's entropy."""


def error_points(trajectories: Sequence[Trajectory], eligible: Sequence[bool]) -> list[Candidate]:
    """Fission: each episode's first turn with an error observation (ERROR_EVENTS) that the
    episode went on from; the prefix ends after that observation. All scored alike.

    >>> from toolpolicy.types import Episode, Event, Task
    >>> def ep(events, turns):
    ...     e = Episode(Task("t", "", ""), [], [Event(k, t, "") for k, t in events])
    ...     return Trajectory([0] * 10, [0] * 10, [0.0] * 10, 1, e, [(2 * i + 1, 2 * i + 2) for i in range(turns)])
    >>> error_points([ep([("tool_call", 0), ("invalid_call", 1)], 3), ep([("gate_deny", 1)], 2), ep([], 3)], [True] * 3)
    [(0.0, (0, 2))]
    """
    out = []
    for i, trajectory in enumerate(trajectories):
        if not eligible[i]:
            continue
        turns = sorted({e.turn for e in trajectory.episode.events if e.kind in ERROR_EVENTS})
        going_on = [turn for turn in turns if turn + 1 < len(trajectory.turn_spans)]
        if going_on:
            out.append((0.0, (i, going_on[0] + 1)))
    return out


def surprisal(trajectory: Trajectory, turn: int, tokens: int = ENTROPY_TOKENS) -> float:
    """Mean -log p of the first `tokens` sampled tokens of `turn` (an estimate of its entropy).

    >>> from toolpolicy.types import Episode, Task
    >>> t = Trajectory([0] * 6, [0, 1, 1, 0, 1, 1], [0.0, -1.0, -3.0, 0.0, -0.5, -0.5], 1, Episode(Task("t", "", ""), []), [(1, 3), (4, 6)])
    >>> surprisal(t, 0), surprisal(t, 1, tokens=1)
    (2.0, 0.5)
    """
    start, end = trajectory.turn_spans[turn]
    values = trajectory.logprobs[start : min(end, start + tokens)]
    return -sum(values) / max(len(values), 1)


def entropy_points(trajectories: Sequence[Trajectory], eligible: Sequence[bool]) -> list[Candidate]:
    """Entropy-guided branching: in each episode, the turn after a tool call's observation
    whose opening surprisal rises most above the episode's first turn's; the prefix ends
    with that observation. Scored by the rise.

    >>> from toolpolicy.types import Episode, Event, Task
    >>> e = Episode(Task("t", "", ""), [], [Event("tool_call", 0, "calc"), Event("tool_call", 1, "calc")])
    >>> t = Trajectory([0] * 9, [0, 1, 0, 1, 1, 0, 1, 1, 1], [0.0, -1.0, 0.0, -3.0, -3.0, 0.0, -2.0, 0.0, 0.0], 1, e, [(1, 2), (3, 5), (6, 9)])
    >>> entropy_points([t], [True])  # turn 1 opens at 3.0, turn 2 at 2/3; the first turn at 1.0
    [(2.0, (0, 1))]
    """
    out = []
    for i, trajectory in enumerate(trajectories):
        if not eligible[i]:
            continue
        calling = {e.turn for e in trajectory.episode.events if e.kind in CALL_EVENTS}
        after_tools = [turn for turn in range(1, len(trajectory.turn_spans)) if turn - 1 in calling]
        if after_tools:
            baseline = surprisal(trajectory, 0)
            rise, turn = max((surprisal(trajectory, turn) - baseline, turn) for turn in after_tools)
            out.append((rise, (i, turn)))
    return out


PICKERS: dict[str, Picker] = {"fission": error_points, "entropy": entropy_points}
"""algorithm.branch -> its picker."""


def choose(candidates: list[Candidate], count: int, rng: random.Random) -> list[Point]:
    """The `count` best-scored points, ties in the order of `rng`'s shuffle, listed by episode.

    >>> choose([(0.0, (0, 1)), (2.0, (3, 1)), (0.0, (5, 2))], 2, random.Random(0))
    [(0, 1), (3, 1)]
    """
    order = list(candidates)
    rng.shuffle(order)
    order.sort(key=lambda candidate: -candidate[0])  # stable: equal scores keep the shuffle's order
    return sorted(point for _, point in order[:count])
