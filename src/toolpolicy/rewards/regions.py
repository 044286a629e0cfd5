"""Rewards for looking closer: is a zoom's region where the evidence is? (envs/zoom).

A task that needs a closer look names its evidence, `task.info["evidence"]`: the box
[x0, y0, x1, y1] (pixels of the full picture) that holds what the answer reads. A zoom is
faithful when its region holds the whole box. Accuracy alone can hide unfaithful tool use
(zooms on irrelevant regions, a crop taken and then ignored); these make it visible, and
`faithful_zoom` and `unfaithful_zooms` make it part of the reward.
"""

from __future__ import annotations

from toolpolicy.types import Episode

ZOOM = "zoom"


def zoom_regions(episode: Episode) -> list[tuple[int, int, int, int]]:
    """The regions (x0, y0, x1, y1) of the episode's decoded zoom calls, in order (one the gate
    refused, outside the picture or over the budget, is never faithful, so it counts as tried)."""
    regions = []
    for message in episode.messages:
        for call in message.tool_calls if message.role == "assistant" else ():
            try:
                x, y, width, height = (int(call.arguments[k]) for k in ("x", "y", "width", "height"))
            except (KeyError, TypeError, ValueError):
                continue
            if call.name == ZOOM:
                regions.append((x, y, x + width, y + height))
    return regions


def holds(region: tuple[int, int, int, int], box: list[int]) -> bool:
    """Whether `region` contains the whole `box`.

    >>> holds((0, 0, 64, 64), [10, 10, 40, 30]), holds((32, 0, 96, 64), [10, 10, 40, 30])
    (True, False)
    """
    return region[0] <= box[0] and region[1] <= box[1] and region[2] >= box[2] and region[3] >= box[3]


def faithful_zoom(episode: Episode) -> float:
    """1.0 if a zoom of the episode holds the task's evidence box (a task that needs it), else 0.0."""
    box = episode.task.info.get("evidence")
    if box is None or not episode.task.info.get("min_tool_calls"):
        return 0.0
    return float(any(holds(region, box) for region in zoom_regions(episode)))


def unfaithful_zooms(episode: Episode) -> float:
    """Zooms whose region does not hold the evidence box (on a task that needs none: every zoom)."""
    box = episode.task.info.get("evidence")
    needed = bool(episode.task.info.get("min_tool_calls"))
    return float(sum(not (needed and box is not None and holds(region, box)) for region in zoom_regions(episode)))
