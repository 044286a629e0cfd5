"""The spread of a figure over seeds: its mean and Student's t 95% interval."""

from __future__ import annotations

import math
import statistics

T_975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
    11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
    21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042,
}
"""Student's t quantile for a two-sided 95% interval, by degrees of freedom (up to 31 seeds)."""


def interval(values: list[float]) -> dict[str, float]:
    """Mean and 95% t interval half-width of `values` (half-width 0 for one value).

    >>> interval([0.5, 0.7])["half_width"]
    1.2706
    >>> interval([0.0, 1.0] * 5)["half_width"]  # ten seeds: t = 2.262 on 9 degrees of freedom
    0.377
    """
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "half_width": 0.0}
    if len(values) - 1 not in T_975:
        raise ValueError(f"{len(values)} values: the t table holds up to {max(T_975) + 1}; add its quantiles to T_975")
    half = T_975[len(values) - 1] * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": round(mean, 4), "half_width": round(half, 4)}
