"""Evaluation metrics over repeated trials: pass@k, pass^k, accuracy and tool-use rates.

Episodes marked infra_error are excluded from every metric and only counted (DESIGN
contract 4: infrastructure failure is not model failure).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from toolpolicy.types import Episode

PASS_KS = (1, 2, 4, 8)


@dataclass(frozen=True)
class EpisodeRecord:
    """What evaluation keeps of one episode: enough for every metric, small enough to store."""

    task_id: str
    difficulty: str
    correct: bool
    tool_calls: int
    invalid_calls: int
    truncated: bool
    infra_error: bool
    tokens: int

    @staticmethod
    def from_episode(ep: Episode, correct: bool, tokens: int) -> EpisodeRecord:
        """Record an episode; `correct` comes from the rewards, `tokens` from the trajectory."""
        return EpisodeRecord(
            task_id=ep.task.id,
            difficulty=ep.task.difficulty,
            correct=correct,
            tool_calls=ep.count("tool_call"),
            invalid_calls=ep.count("invalid_call"),
            truncated=ep.truncated,
            infra_error=ep.infra_error is not None,
            tokens=tokens,
        )


def _check_counts(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k trials drawn from n (c correct) is correct.

    Unbiased estimator 1 - C(n-c, k) / C(n, k) of Chen et al. 2021 (Codex, arXiv 2107.03374),
    in their stable product form 1 - prod_{i=n-c+1}^{n} (1 - k / i).

    >>> round(pass_at_k(4, 2, 2), 6)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    0.833333
    """
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    failing_all = 1.0
    for i in range(n - c + 1, n + 1):
        failing_all *= 1.0 - k / i
    return 1.0 - failing_all


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Probability that all of k trials drawn from n (c correct) are correct: C(c, k) / C(n, k).

    tau-bench's pass^k (Yao et al. 2024, arXiv 2406.12045): reliability over repeated
    attempts, as product prod_{i=0}^{k-1} (c - i) / (n - i).

    >>> round(pass_hat_k(4, 2, 2), 6)  # C(2,2)/C(4,2) = 1/6
    0.166667
    """
    _check_counts(n, c, k)
    all_pass = 1.0
    for i in range(k):
        all_pass *= (c - i) / (n - i)
    return max(all_pass, 0.0)


def _pass_metrics(records: list[EpisodeRecord]) -> dict[str, dict[str, float]]:
    """Mean over tasks of pass@k and pass^k for k in PASS_KS up to the fewest trials any task has."""
    trials: dict[str, list[bool]] = defaultdict(list)
    for record in records:
        trials[record.task_id].append(record.correct)
    if not trials:
        return {"pass_at_k": {}, "pass_hat_k": {}}
    fewest = min(len(t) for t in trials.values())
    ks = [k for k in PASS_KS if k <= fewest]
    at_k = {str(k): sum(pass_at_k(len(t), sum(t), k) for t in trials.values()) / len(trials) for k in ks}
    hat_k = {str(k): sum(pass_hat_k(len(t), sum(t), k) for t in trials.values()) / len(trials) for k in ks}
    return {"pass_at_k": at_k, "pass_hat_k": hat_k}


def _rates(records: list[EpisodeRecord]) -> dict[str, Any]:
    """Per-episode means and the invalid-call rate, plus pass@k / pass^k; zeros when empty."""
    n = len(records)
    per_episode = max(1, n)
    tool_calls = sum(r.tool_calls for r in records)
    invalid_calls = sum(r.invalid_calls for r in records)
    return {
        "n": n,
        "accuracy": sum(r.correct for r in records) / per_episode,
        "tool_calls_per_episode": tool_calls / per_episode,
        "invalid_call_rate": invalid_calls / max(1, tool_calls + invalid_calls),
        "truncated_rate": sum(r.truncated for r in records) / per_episode,
        "tokens_per_episode": sum(r.tokens for r in records) / per_episode,
        **_pass_metrics(records),
    }


def summarize(records: list[EpisodeRecord]) -> dict[str, Any]:
    """JSON-ready summary: overall rates, the same per difficulty, and the infra-error count.

    Keys: n, accuracy, tool_calls_per_episode, invalid_call_rate (invalid / (valid + invalid)
    calls), truncated_rate, tokens_per_episode, pass_at_k and pass_hat_k ({str(k): mean over
    tasks} for k in 1, 2, 4, 8 up to the fewest trials of any task), by_difficulty
    ({difficulty: same keys}), infra_errors. Infra-error records count only in infra_errors.
    """
    scored = [r for r in records if not r.infra_error]
    by_difficulty: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for record in scored:
        by_difficulty[record.difficulty].append(record)
    return {
        **_rates(scored),
        "by_difficulty": {d: _rates(rs) for d, rs in sorted(by_difficulty.items())},
        "infra_errors": len(records) - len(scored),
    }
