"""Figures for the report, each returned as a self-contained PNG data URI.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas directly, never
through pyplot, so drawing a report neither changes the global backend nor leaks
figures in a long-lived process.

Readability rules every figure follows: a title that says what is plotted, labelled
axes, rates on a 0-100% axis, one colour per difficulty used everywhere (curves,
bars, trajectory tags), and, once a curve has SMOOTH_FROM points, the raw values
drawn faint under a bold exponential moving average.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

from toolpolicy.report.comparison import difficulties, metric, order_difficulties

SMOOTH_FROM = 10
"""Curves with at least this many points get a moving average over faint raw points."""

OVERALL_COLOUR = "#222222"
DIFFICULTY_COLOURS = {"easy": "#2a9d8f", "medium": "#e9c46a", "hard": "#e76f51"}
EXTRA_COLOURS = ["#457b9d", "#8e5ea2", "#b5838d", "#6a994e", "#bc6c25", "#3d405b"]
"""For difficulty names other than easy/medium/hard, assigned in sorted order."""

STYLE = {
    "font.size": 10,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "legend.fontsize": 9,
}


@dataclass(frozen=True)
class Plot:
    title: str
    data_uri: str
    """"data:image/png;base64,...", ready for an <img src>."""
    wide: bool = False
    """Spans the full page width (multi-panel figures)."""


def difficulty_colour(name: str) -> str:
    if name in DIFFICULTY_COLOURS:
        return DIFFICULTY_COLOURS[name]
    # a stable colour per name, independent of which other names this run has
    index = sum(name.encode()) % len(EXTRA_COLOURS)
    return EXTRA_COLOURS[index]


# ---------------------------------------------------------------------------
# training curves (metrics.jsonl)


def rl_plots(rows: list[dict[str, Any]]) -> list[Plot]:
    """One figure per RL signal present: reward, accuracy, tool calls, invalid calls, KL,
    entropy; then every other numeric key as small multiples."""
    rl = [row for row in rows if row.get("phase") == "rl"]
    if not rl:
        return []
    keys = _numeric_keys(rl)
    by_difficulty = {
        prefix: order_difficulties([k.split("/", 1)[1] for k in keys if k.startswith(prefix + "/")])
        for prefix in ("accuracy", "tool_calls")
    }
    plots = []

    def single(key: str, title: str, ylabel: str, *, rate: bool = False, colour: str = "#1d3557") -> None:
        if key in keys:
            plots.append(_line_plot(title, ylabel, [(key, *_series(rl, key), colour)], rate=rate, legend=False))

    single("reward", "Reward (mean per step)", "reward")
    accuracy_curves = [("overall", *_series(rl, "accuracy"), OVERALL_COLOUR)] if "accuracy" in keys else []
    accuracy_curves += [(d, *_series(rl, f"accuracy/{d}"), difficulty_colour(d)) for d in by_difficulty["accuracy"]]
    if accuracy_curves:
        plots.append(_line_plot("Training accuracy by difficulty", "accuracy", accuracy_curves, rate=True))
    tool_curves = [(d, *_series(rl, f"tool_calls/{d}"), difficulty_colour(d)) for d in by_difficulty["tool_calls"]]
    if tool_curves:
        plots.append(_line_plot("Tool calls per episode by difficulty", "tool calls / episode", tool_curves))
    single("invalid_call_rate", "Invalid tool-call rate", "invalid calls", rate=True, colour="#c1121f")
    single("kl", "KL to reference policy", "KL", colour="#6a4c93")
    single("entropy", "Policy entropy", "entropy (nats/token)", colour="#457b9d")

    shown = {"phase", "step", "reward", "accuracy", "invalid_call_rate", "kl", "entropy"}
    rest = [k for k in keys if k not in shown and not k.startswith(("accuracy/", "tool_calls/"))]
    if rest:
        plots.append(_small_multiples("Other RL training signals", rl, rest))
    return plots


def sft_plots(rows: list[dict[str, Any]]) -> list[Plot]:
    """The SFT loss curve, then any other SFT signal (lr, tokens/s) as small multiples."""
    sft = [row for row in rows if row.get("phase") == "sft"]
    keys = _numeric_keys(sft)
    plots = []
    if "loss" in keys:
        loss = [("loss", *_series(sft, "loss"), "#1d3557")]
        plots.append(_line_plot("SFT loss", "cross-entropy loss", loss, xlabel="SFT step", legend=False))
    rest = [k for k in keys if k not in ("phase", "step", "loss")]
    if rest:
        plots.append(_small_multiples("Other SFT signals", sft, rest))
    return plots


def _numeric_keys(rows: list[dict[str, Any]]) -> list[str]:
    """Keys with at least one finite number, in first-seen order."""
    keys: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            if key not in ("phase", "step") and _finite(value):
                keys.setdefault(key, None)
    return list(keys)


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that carry a finite number under key, sorted by step."""
    points = sorted((row["step"], float(row[key])) for row in rows if _finite(row.get(key)))
    return [s for s, _ in points], [v for _, v in points]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def smooth(values: list[float]) -> list[float]:
    """Debiased exponential moving average with a span of about a tenth of the curve."""
    span = min(50, max(2, len(values) // 10))
    alpha = 2 / (span + 1)
    out, average, weight = [], 0.0, 0.0
    for value in values:
        average = (1 - alpha) * average + alpha * value
        weight = (1 - alpha) * weight + alpha
        out.append(average / weight)
    return out


Curve = tuple[str, list[int], list[float], str]
"""(label, steps, values, colour)"""


def _line_plot(title: str, ylabel: str, curves: list[Curve], *, xlabel: str = "RL step", rate: bool = False,
               legend: bool = True) -> Plot:
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(6.4, 3.6), dpi=110, layout="constrained")
        ax = fig.add_subplot()
        for label, steps, values, colour in curves:
            _draw_curve(ax, steps, values, colour, label)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if rate:
            ax.set_ylim(-0.02, 1.02)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        if legend and len(curves) > 1:
            ax.legend(loc="best")
        return Plot(title, _data_uri(fig))


def _draw_curve(ax: Any, steps: list[int], values: list[float], colour: str, label: str) -> None:
    if len(values) >= SMOOTH_FROM:
        ax.plot(steps, values, color=colour, alpha=0.25, linewidth=0.8, marker="o", markersize=2.5)
        ax.plot(steps, smooth(values), color=colour, linewidth=2.2, label=label)
    else:
        ax.plot(steps, values, color=colour, linewidth=2, marker="o", markersize=5, label=label)


def _small_multiples(title: str, rows: list[dict[str, Any]], keys: list[str]) -> Plot:
    columns = min(3, len(keys))
    grid_rows = math.ceil(len(keys) / columns)
    with matplotlib.rc_context(STYLE | {"axes.titlesize": 10}):
        fig = Figure(figsize=(3.4 * columns, 2.5 * grid_rows + 0.4), dpi=110, layout="constrained")
        fig.suptitle(title, fontweight="bold")
        for index, key in enumerate(keys):
            ax = fig.add_subplot(grid_rows, columns, index + 1)
            _draw_curve(ax, *_series(rows, key), "#457b9d", key)
            ax.set_title(key)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            # plain "%.4g" labels: no offset or 1e-5 multiplier text colliding with the panel title
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.4g}"))
        return Plot(title, _data_uri(fig), wide=True)


# ---------------------------------------------------------------------------
# before/after bars (eval/<name>.json)

BAR_PANELS = (
    ("accuracy", "Accuracy", "rate"),
    ("tool_calls_per_episode", "Tool calls per episode", "count"),
    ("invalid_call_rate", "Invalid tool-call rate", "rate"),
)


def comparison_plot(before: dict[str, Any] | None, after: dict[str, Any] | None,
                    before_name: str, after_name: str) -> Plot | None:
    """Grouped bars, one group per difficulty (plus "all"): before hatched and light, after solid."""
    if before is None and after is None:
        return None
    groups = ["all", *difficulties(before, after)]
    title = f"Before ({before_name}) vs after ({after_name}), by difficulty"
    with matplotlib.rc_context(STYLE | {"axes.grid": False}):
        fig = Figure(figsize=(12, 3.9), dpi=110, layout="constrained")
        fig.suptitle(title, fontweight="bold", fontsize=12)
        for panel, (key, panel_title, kind) in enumerate(BAR_PANELS):
            ax = fig.add_subplot(1, len(BAR_PANELS), panel + 1)
            top = 0.0
            for index, group in enumerate(groups):
                colour = OVERALL_COLOUR if group == "all" else difficulty_colour(group)
                difficulty = None if group == "all" else group
                for offset, summary, style in ((-0.2, before, "before"), (0.2, after, "after")):
                    value = metric(summary, key, difficulty)
                    x = index + offset
                    if value is None:
                        ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=8, color="#777777")
                        continue
                    top = max(top, value)
                    ax.bar(x, value, width=0.38, color=colour, edgecolor=colour,
                           alpha=0.35 if style == "before" else 1.0, hatch="///" if style == "before" else None)
                    text = _bar_label(value, kind)
                    ax.text(x, value, text, ha="center", va="bottom", fontsize=8)
            ax.set_xticks(range(len(groups)), groups)
            ax.set_title(panel_title)
            ax.set_xlabel("difficulty")
            if kind == "rate":
                ax.set_ylim(0, max(0.05, min(1.0, top * 1.15 + 0.02)) if key != "accuracy" else 1.08)
                ax.yaxis.set_major_formatter(PercentFormatter(1.0))
                ax.set_ylabel("share of episodes" if key == "accuracy" else "share of call attempts")
            else:
                ax.set_ylim(0, max(0.5, top * 1.18))
                ax.set_ylabel("calls / episode")
            ax.grid(axis="y", alpha=0.3)
        fig.legend(handles=[
            Patch(facecolor="#888888", alpha=0.35, hatch="///", edgecolor="#888888", label=f"before: {before_name}"),
            Patch(facecolor="#888888", label=f"after: {after_name}"),
        ], loc="upper left", ncols=2)
        return Plot(title, _data_uri(fig), wide=True)


def _bar_label(value: float, kind: str) -> str:
    if kind != "rate":
        return f"{value:.2f}"
    return f"{value * 100:.1f}%" if value < 0.1 else f"{value * 100:.0f}%"


def _data_uri(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
