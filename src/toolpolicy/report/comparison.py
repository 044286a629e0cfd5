"""Before/after comparison of two eval summaries, as rows and as a terminal table.

The rows are the one model of "what changed" that both the terminal table and the
HTML report render, so the two never disagree on a number or its rounding. Rates
(fractions in [0, 1]) are shown as percents and their change in percentage points;
counts per episode are shown as plain numbers and their change as a difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["rate", "count", "integer"]

KNOWN_DIFFICULTIES = ("easy", "medium", "hard")
"""Shown in this order; any other difficulty name follows, alphabetically."""


@dataclass(frozen=True)
class Row:
    """One metric of the comparison. None means the eval file did not report it."""

    label: str
    before: float | None
    after: float | None
    kind: Kind
    better: int = 0
    """+1 if higher is better, -1 if lower is better, 0 if neither (e.g. tool calls)."""

    @property
    def change(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def before_text(self) -> str:
        return format_value(self.before, self.kind)

    @property
    def after_text(self) -> str:
        return format_value(self.after, self.kind)

    @property
    def change_text(self) -> str:
        change = self.change
        if change is None:
            return "n/a"
        if self.kind == "rate":
            return f"{change * 100:+.1f} pts"
        if self.kind == "integer":
            return f"{change:+.0f}"
        return f"{change:+.2f}"

    @property
    def verdict(self) -> Literal["better", "worse", "same", "neutral"]:
        """Whether the change is an improvement, for colouring; "neutral" when no direction is better."""
        change = self.change
        if change is None or self.better == 0:
            return "neutral"
        if abs(change) < 1e-12:
            return "same"
        return "better" if change * self.better > 0 else "worse"


def format_value(value: float | None, kind: Kind) -> str:
    if value is None:
        return "n/a"
    if kind == "rate":
        return f"{value * 100:.1f}%"
    if kind == "integer":
        return f"{value:.0f}"
    return f"{value:.2f}"


def order_difficulties(names: set[str] | list[str]) -> list[str]:
    known = [d for d in KNOWN_DIFFICULTIES if d in names]
    return known + sorted(set(names) - set(KNOWN_DIFFICULTIES))


def difficulties(*evals: dict[str, Any] | None, within: str = "by_difficulty") -> list[str]:
    """Group names found in any of the evals' `within` ("by_difficulty" or "by_category"), in display order."""
    names: set[str] = set()
    for summary in evals:
        groups = (summary or {}).get(within)
        if isinstance(groups, dict):
            names.update(str(name) for name in groups)
    return order_difficulties(names)


def metric(
    summary: dict[str, Any] | None, key: str, difficulty: str | None = None, within: str = "by_difficulty"
) -> float | None:
    """summary[key], or summary[within][difficulty][key]; None if absent or not a finite number."""
    if not isinstance(summary, dict):
        return None
    if difficulty is not None:
        summary = (summary.get(within) or {}).get(difficulty)
        if not isinstance(summary, dict):
            return None
    value = summary.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def comparison_rows(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[Row]:
    """Accuracy, tool calls per episode (overall and per difficulty) and invalid-call rate."""
    ds = difficulties(before, after)
    if ds == ["all"]:  # tasks without a difficulty: the per-difficulty rows would repeat the totals
        ds = []

    def row(label: str, key: str, kind: Kind, better: int, difficulty: str | None = None) -> Row:
        return Row(label, metric(before, key, difficulty), metric(after, key, difficulty), kind, better)

    return [
        row("accuracy", "accuracy", "rate", +1),
        *(row(f"accuracy {d}", "accuracy", "rate", +1, d) for d in ds),
        row("tool calls/episode", "tool_calls_per_episode", "count", 0),
        *(row(f"tool calls/episode {d}", "tool_calls_per_episode", "count", 0, d) for d in ds),
        row("invalid-call rate", "invalid_call_rate", "rate", -1),
    ]


def policy_rows(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[Row]:
    """Success per task category, policy violations, wrong-state writes and gate denials,
    for environments that report them (absent from both evals: no rows)."""
    categories = difficulties(before, after, within="by_category")
    rows = [
        Row(f"success {c}", metric(before, "accuracy", c, "by_category"), metric(after, "accuracy", c, "by_category"), "rate", +1)
        for c in categories
    ]
    for label, key in (
        ("violation attempts/episode", "violations_per_episode"),
        ("violating calls run/episode", "violations_run_per_episode"),
        ("wrong-state writes/episode", "wrong_writes_per_episode"),
        ("gate denials/episode", "denials_per_episode"),
    ):
        values = metric(before, key), metric(after, key)
        if categories or any(v for v in values):
            rows.append(Row(label, *values, "count", -1))
    for c in categories:  # where the silent wrong writes happen: what no pre-execution gate can see
        values = (metric(before, "wrong_writes_per_episode", c, "by_category"),
                  metric(after, "wrong_writes_per_episode", c, "by_category"))
        if any(values):
            rows.append(Row(f"wrong-state writes/episode {c}", *values, "count", -1))
    return rows


def pass_rows(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[Row]:
    """pass@k for every k either eval reports, then pass^k ("pass_hat_k") if present.

    A label carries the tasks its k covers when that is fewer than all, e.g.
    "pass^4 (59 of 60 tasks)": each k is a mean over the tasks with k scored trials, and
    a task whose trial hit an infrastructure error has one fewer.
    """
    rows = []
    for key, symbol in (("pass_at_k", "@"), ("pass_hat_k", "^")):
        tables = [(summary or {}).get(key) or {} for summary in (before, after)]
        ks = {str(k) for table in tables if isinstance(table, dict) for k in table}
        for k in sorted(ks, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k)):
            b, a = (metric(table, k) if isinstance(table, dict) else None for table in tables)
            rows.append(Row(f"pass{symbol}{k}{coverage_note(before, after, k)}", b, a, "rate", +1))
    return rows


def pass_coverage(summary: dict[str, Any] | None, k: str) -> tuple[int, int] | None:
    """(tasks pass@k and pass^k average over, tasks with any scored trial) from the eval's
    "pass_k_tasks"; None for an eval that does not report it (written before it existed)."""
    tasks = (summary or {}).get("pass_k_tasks")
    if not isinstance(tasks, dict):
        return None
    covered, total = metric(tasks, k), metric(tasks, "1")
    if covered is None or total is None:
        return None
    return int(covered), int(total)


def coverage_note(before: dict[str, Any] | None, after: dict[str, Any] | None, k: str) -> str:
    """" (59 of 60 tasks)" when pass@k covers fewer than all tasks of either eval, "" otherwise;
    " (59 of 60 / 60 of 60 tasks)" (before / after) when the two evals differ.

    >>> coverage_note(None, {"pass_k_tasks": {"1": 60, "4": 59}}, "4")
    ' (59 of 60 tasks)'
    >>> coverage_note(None, {"pass_k_tasks": {"1": 60, "4": 60}}, "4")
    ''
    """
    coverages = [pass_coverage(summary, k) for summary in (before, after) if summary is not None]
    if not any(c is not None and c[0] < c[1] for c in coverages):
        return ""
    texts = [f"{c[0]} of {c[1]}" if c is not None else "n/a" for c in coverages]
    if len(set(texts)) == 1:
        return f" ({texts[0]} tasks)"
    return f" ({' / '.join(texts)} tasks)"


def detail_rows(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[Row]:
    """The rest of an eval summary: each Rubric term's mean (custom reward functions by
    their names), truncation, length, infrastructure errors, sample size."""
    return reward_rows(before, after) + [
        Row("truncated rate", metric(before, "truncated_rate"), metric(after, "truncated_rate"), "rate", -1),
        Row("tokens/episode", metric(before, "tokens_per_episode"), metric(after, "tokens_per_episode"), "count"),
        Row("infra errors", metric(before, "infra_errors"), metric(after, "infra_errors"), "integer"),
        Row("episodes (n)", metric(before, "n"), metric(after, "n"), "integer"),
    ]


def reward_rows(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[Row]:
    """One row per Rubric term either summary reports under "rewards" (its mean per episode).

    >>> [(r.label, r.after) for r in reward_rows(None, {"rewards": {"exact_sum": 0.5}})]
    [('reward exact_sum', 0.5)]
    """
    tables = [(summary or {}).get("rewards") or {} for summary in (before, after)]
    names = dict.fromkeys(name for table in tables if isinstance(table, dict) for name in table)
    return [Row(f"reward {name}", metric(tables[0], name), metric(tables[1], name), "count") for name in names]


def format_comparison(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A plain-text before/after table of two eval summaries (eval/<name>.json contents).

    >>> print(format_comparison({"accuracy": 0.5}, {"accuracy": 0.75}))  # doctest: +NORMALIZE_WHITESPACE
    before -> after
    metric              before   after     change
    accuracy             50.0%   75.0%  +25.0 pts
    tool calls/episode     n/a     n/a        n/a
    invalid-call rate      n/a     n/a        n/a
    """
    rows = comparison_rows(before, after) + policy_rows(before, after) + pass_rows(before, after)
    title = f"{(before or {}).get('name', 'before')} -> {(after or {}).get('name', 'after')}"
    sizes = [metric(before, "n"), metric(after, "n")]
    if any(size is not None for size in sizes):
        title += "   (n = " + " / ".join(format_value(size, "integer") for size in sizes) + " episodes)"
    table = [("metric", "before", "after", "change")]
    table += [(r.label, r.before_text, r.after_text, r.change_text) for r in rows]
    return "\n".join([title, *_aligned(table)])


def format_summary(summary: dict[str, Any]) -> str:
    """A plain-text table of one eval summary: success, per group, policy figures, pass^k, details."""
    rows = comparison_rows(None, summary) + policy_rows(None, summary) + pass_rows(None, summary)
    rows += detail_rows(None, summary)
    table = [("metric", "value")] + [(r.label, r.after_text) for r in rows if r.after is not None]
    gate = f", policy {summary['policy']} {'enforced' if summary.get('gate') else 'not enforced'}" if summary.get("policy") else ""
    return "\n".join([f"{summary.get('name', 'eval')} ({summary.get('checkpoint', '')}{gate})", *_aligned(table),
                      *wrong_write_lines(summary)])


def wrong_write_lines(summary: dict[str, Any]) -> list[str]:
    """The summary's examples of silent wrong-state writes, if it has any: what a gate lets through."""
    examples = summary.get("wrong_write_examples") or []
    return [f"silent wrong-state writes ({summary.get('name', 'eval')}, first {len(examples)}):",
            *(f"  {e}" for e in examples)] if examples else []


def _aligned(table: list[tuple[str, ...]]) -> list[str]:
    """Rows of cells as lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    lines = []
    for line in table:
        cells = [line[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(line[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return lines
