"""Evaluation metrics over repeated trials: pass@k, pass^k, accuracy and tool-use rates.

Episodes marked infra_error are excluded from every metric and only counted
(docs/architecture.md, contract 4: infrastructure failure is not model failure).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolpolicy.rewards import policy_violation, violations_run
from toolpolicy.types import Episode

MAX_PASS_K = 16
WRONG_WRITE_EXAMPLES = 10
"""How many silent wrong-state writes a summary lists, as "task (category): call"."""


@dataclass(frozen=True)
class ScoredEpisode:
    """What evaluation keeps of one episode: enough for every metric, small enough to store."""

    task_id: str
    difficulty: str
    correct: bool
    tool_calls: int
    invalid_calls: int
    truncated: bool
    infra_error: bool
    tokens: int
    denials: int = 0
    denials_by_rule: dict[str, int] = field(default_factory=dict)
    category: str = ""
    violations: int = 0
    """Calls that broke the policy: gate denials, plus the attempts the environment saw
    itself (with the gate off, a stateful environment still checks its policy)."""
    violations_run: int = 0
    """Of those, the calls that ran: zero when an enforcing gate saw every call."""
    wrong_writes: int = 0
    """Writes the environment found outside the task's reference (silent wrong state)."""
    wrong_write_calls: tuple[str, ...] = ()
    """Those writes as "name(arguments)", when the environment lists them."""

    @staticmethod
    def from_episode(ep: Episode, correct: bool, tokens: int) -> ScoredEpisode:
        """Record an episode; `correct` comes from the rewards, `tokens` from the trajectory."""
        return ScoredEpisode(
            task_id=ep.task.id,
            difficulty=ep.task.difficulty,
            correct=correct,
            tool_calls=ep.count("tool_call"),
            invalid_calls=ep.count("invalid_call"),
            truncated=ep.truncated,
            infra_error=ep.infra_error is not None,
            tokens=tokens,
            denials=ep.count("gate_deny"),
            denials_by_rule=ep.denials_by_rule(),
            category=str(ep.task.info.get("category", "")),
            violations=int(policy_violation(ep)),
            violations_run=int(violations_run(ep)),
            wrong_writes=int(ep.outcome.get("wrong_writes", 0)),
            wrong_write_calls=tuple(ep.outcome.get("wrong_write_calls", ())),
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


def pass_rates(counts: Sequence[int], n: int) -> dict[str, float]:
    """Mean pass@k and pass^k, k = 1 .. n, over tasks with `counts` right answers of `n` each.

    >>> pass_rates([2, 0], 2)
    {'pass@1': 0.5, 'pass@2': 0.5, 'pass^1': 0.5, 'pass^2': 0.5}
    >>> pass_rates([1, 1], 2)
    {'pass@1': 0.5, 'pass@2': 1.0, 'pass^1': 0.5, 'pass^2': 0.0}
    """
    at = {f"pass@{k}": sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in range(1, n + 1)}
    hat = {f"pass^{k}": sum(pass_hat_k(n, c, k) for c in counts) / len(counts) for k in range(1, n + 1)}
    return at | hat


def _pass_metrics(records: list[ScoredEpisode]) -> dict[str, dict[str, Any]]:
    """pass@k and pass^k for k = 1 .. MAX_PASS_K, each the mean over the tasks with at least
    k trials, and how many tasks that is ({str(k): tasks} under "pass_k_tasks").

    Each k has its own set of tasks, rather than k stopping at the fewest trials any task
    has: an infra error removes a trial (contract 4), and one such trial on one task would
    otherwise remove pass^4 for every task. The count says which figures cover fewer tasks.
    """
    trials: dict[str, list[bool]] = defaultdict(list)
    for record in records:
        trials[record.task_id].append(record.correct)
    at_k: dict[str, float] = {}
    hat_k: dict[str, float] = {}
    tasks: dict[str, int] = {}
    for k in range(1, MAX_PASS_K + 1):
        covered = [t for t in trials.values() if len(t) >= k]
        if not covered:
            break
        at_k[str(k)] = sum(pass_at_k(len(t), sum(t), k) for t in covered) / len(covered)
        hat_k[str(k)] = sum(pass_hat_k(len(t), sum(t), k) for t in covered) / len(covered)
        tasks[str(k)] = len(covered)
    return {"pass_at_k": at_k, "pass_hat_k": hat_k, "pass_k_tasks": tasks}


def _rates(records: list[ScoredEpisode]) -> dict[str, Any]:
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
        "denials_per_episode": sum(r.denials for r in records) / per_episode,
        "violations_per_episode": sum(r.violations for r in records) / per_episode,
        "violations_run_per_episode": sum(r.violations_run for r in records) / per_episode,
        "wrong_writes_per_episode": sum(r.wrong_writes for r in records) / per_episode,
        "denials_by_rule": {rule: count / per_episode for rule, count in sorted(_rule_totals(records).items())},
        **_pass_metrics(records),
    }


def _rule_totals(records: list[ScoredEpisode]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for record in records:
        for rule, count in record.denials_by_rule.items():
            totals[rule] += count
    return totals


def summarize(records: list[ScoredEpisode]) -> dict[str, Any]:
    """JSON-ready summary: overall rates, the same per difficulty and per category, and
    the infra-error count.

    Keys: n, accuracy (share of successful episodes), tool_calls_per_episode,
    invalid_call_rate (invalid / (valid + invalid) calls), truncated_rate,
    tokens_per_episode, denials_per_episode (calls the policy gate denied),
    denials_by_rule ({rule id: denials per episode}), violations_per_episode (attempts),
    violations_run_per_episode (attempts that ran: the gate was off or missed them),
    wrong_writes_per_episode, pass_at_k and pass_hat_k ({str(k): mean over the tasks
    with at least k scored trials}, for k = 1 .. MAX_PASS_K while some task has k),
    pass_k_tasks ({str(k): how many tasks that mean covers}; "1" is every task with a
    scored trial), by_difficulty ({difficulty: same keys}), by_category (when tasks have
    a category), infra_errors, wrong_write_examples (the first WRONG_WRITE_EXAMPLES
    silent wrong writes, for environments that list them). Infra-error records count
    only in infra_errors: they are excluded, not scored as failures, so a task with an
    infra-failed trial drops out of the largest k only, and pass_k_tasks says so.
    """
    scored = [r for r in records if not r.infra_error]
    by_difficulty: dict[str, list[ScoredEpisode]] = defaultdict(list)
    by_category: dict[str, list[ScoredEpisode]] = defaultdict(list)
    for record in scored:
        by_difficulty[record.difficulty].append(record)
        if record.category:
            by_category[record.category].append(record)
    return {
        **_rates(scored),
        "by_difficulty": {d: _rates(rs) for d, rs in sorted(by_difficulty.items())},
        **({"by_category": {c: _rates(rs) for c, rs in sorted(by_category.items())}} if by_category else {}),
        "infra_errors": len(records) - len(scored),
        "wrong_write_examples": [
            f"{r.task_id} ({r.category or r.difficulty}): {call}" for r in scored for call in r.wrong_write_calls
        ][:WRONG_WRITE_EXAMPLES],
    }


def paired_bootstrap(before: list[float], after: list[float], resamples: int = 10_000, seed: int = 0) -> dict[str, float]:
    """The mean of `after - before` over paired items (the same entries scored twice) and its
    95% percentile bootstrap interval: the items are resampled with replacement, pairs kept
    together, so what the two runs share (an entry's difficulty) cancels.

    >>> paired_bootstrap([0, 0, 1, 1], [1, 1, 1, 1], resamples=2000)["mean"]
    0.5
    """
    import numpy as np

    if len(before) != len(after) or not before:
        raise ValueError(f"paired_bootstrap needs two equally long, non-empty lists (got {len(before)} and {len(after)})")
    difference = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)  # [N]
    picks = np.random.default_rng(seed).integers(0, len(difference), size=(resamples, len(difference)))  # [R, N]
    means = difference[picks].mean(axis=1)  # [R]
    low, high = np.percentile(means, [2.5, 97.5])
    return {"mean": float(difference.mean()), "low": float(low), "high": float(high), "n": len(difference)}
