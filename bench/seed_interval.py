"""The spread of a figure over seeds: its mean and Student's t 95% interval."""

from __future__ import annotations

import math
import statistics

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}
"""Student's t quantile for a two-sided 95% interval, by degrees of freedom."""


def interval(values: list[float]) -> dict[str, float]:
    """Mean and 95% t interval half-width of `values` (half-width 0 for one value).

    >>> interval([0.5, 0.7])["half_width"]
    1.2706
    """
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "half_width": 0.0}
    half = T_975[len(values) - 1] * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": round(mean, 4), "half_width": round(half, 4)}
