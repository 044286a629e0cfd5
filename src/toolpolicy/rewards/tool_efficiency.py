"""Tool-efficiency reward shaping as pure functions of numbers: how many calls, how many were needed.

The math only (`otc_scaled`, `eapo_reward`); `otc_reward` and `eapo_reward` in functions.py read the numbers off the
Episode (tool_call events, task.info["min_tool_calls"], task difficulty, correctness).
"""

from __future__ import annotations

import math


def otc_tool_score(calls: int, min_calls: int, c: float = 1.0) -> float:
    """OTC's tool-use factor in [0, 1]: 1 at exactly the fewest calls needed, smaller either side.

    OTC-PO (Wang et al., arXiv 2504.14870, "Acting Less is Reasoning More"), with m = `calls`
    and n = `min_calls`:
        n = 0:  cos(m * pi / (2m + c))         (1 for no call, decaying toward 0 as m grows;
                                                 the OTC-PPO form, `c` its smoothing constant)
        n > 0:  sin(f(m, n) * pi / (2n)),  f(m, n) = 2nm / (m + n)
                                                (1 at m = n; 0 at m = 0 and as m -> infinity)
    The paper estimates n per question as the fewest calls of any correct rollout seen so
    far (OTC-GRPO); here n is given, e.g. task.info["min_tool_calls"].
    """
    if calls < 0 or min_calls < 0:
        raise ValueError(f"calls and min_calls must be >= 0, got {calls}, {min_calls}")
    m, n = float(calls), float(min_calls)
    if n == 0:
        return math.cos(m * math.pi / (2 * m + c))
    f = 2 * n * m / (m + n)
    return math.sin(f * math.pi / (2 * n))


def otc_scaled(correct: float, calls: int, min_calls: int, alpha: float = 1.0, c: float = 1.0) -> float:
    """OTC reward: correctness scaled by the tool-use factor, alpha * otc_tool_score * correct.

    OTC-PO (arXiv 2504.14870): only a correct answer earns reward, and it earns the most
    with the fewest calls needed. `correct` in [0, 1] (e.g. the correct_answer reward).
    """
    return alpha * otc_tool_score(calls, min_calls, c) * float(correct)


def eapo_reward(correct: float, calls: int, min_calls: int, difficulty: float, weight: float = 0.2) -> float:
    """Difficulty-aware tool penalty, EAPO-style: excess calls cost most on easy tasks.

    EAPO (Chen et al., arXiv 2606.02132) penalises redundant tool calls "mainly on easier
    queries", so a hard task keeps its incentive to use the tool. This is our simple form of
    that idea, not the paper's exact equation:
        excess  = max(0, calls - min_calls)
        penalty = weight * (1 - difficulty) * excess        difficulty in [0, 1], 0 = easy
        reward  = correct * max(0, 1 - penalty)
    so a correct answer never scores below a wrong one, and on the hardest tasks
    (difficulty 1) extra calls cost nothing.
    """
    if not 0.0 <= difficulty <= 1.0:
        raise ValueError(f"difficulty must be in [0, 1] (0 = easy), got {difficulty}")
    excess = max(0, calls - min_calls)
    penalty = weight * (1.0 - difficulty) * excess
    return float(correct) * max(0.0, 1.0 - penalty)
