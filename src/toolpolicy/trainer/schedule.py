"""Learning-rate schedules: the multiplier of the configured LR after `step` optimizer steps.

SFT warms up linearly and decays on a cosine to a tenth (`warmup_cosine`); RL warms up
and then holds its LR (`rl.lr_schedule: constant`) or decays the same way over the run's
planned optimizer steps (`cosine`). Each is a pure function of the optimizer step, so a
resumed run's `LambdaLR` (its step restored from the checkpoint) continues the same curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable

Schedule = Callable[[int], float]
"""Optimizer steps taken -> the multiplier of the configured LR for the next one."""


def warmup_constant(warmup: int) -> Schedule:
    """Linear warm-up over `warmup` optimizer steps, then the full LR.

    >>> [warmup_constant(4)(step) for step in (0, 1, 3, 10)]
    [0.25, 0.5, 1.0, 1.0]
    """
    return lambda step: min(1.0, (step + 1) / max(1, warmup))


def warmup_cosine(warmup: int, total: int, floor: float = 0.1) -> Schedule:
    """Linear warm-up over `warmup` optimizer steps, then a cosine decay to `floor` at `total`.

    >>> schedule = warmup_cosine(2, 12)
    >>> [round(schedule(step), 3) for step in (0, 1, 2, 7, 12, 20)]  # halfway down at step 7: 0.1 + 0.9 / 2
    [0.5, 1.0, 1.0, 0.55, 0.1, 0.1]
    """

    ramp = warmup_constant(warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return ramp(step)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def rl_schedule(name: str, warmup: int, optimizer_steps: int) -> Schedule:
    """`rl.lr_schedule`'s multiplier: `constant` after warm-up, or `cosine` down to a tenth at
    the run's last planned optimizer step (`optimizer_steps`).

    >>> rl_schedule("cosine", 0, 40)(40), rl_schedule("constant", 0, 40)(40)
    (0.1, 1.0)
    """
    return warmup_cosine(warmup, optimizer_steps) if name == "cosine" else warmup_constant(warmup)
