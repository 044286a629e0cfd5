"""The report page: one self-contained report.html per run folder.

Self-contained means it opens from a laptop, an email attachment or a CI artifact
with no network: CSS and the viewer's script are inline, every plot is a base64 PNG
inside its <img> and the viewer's rollouts are JSON inside the page.
Sections, top to bottom: headline numbers, before/after by difficulty, pass@k, RL
training curves, the stored RL rollouts token by token (viewer.py), SFT loss, sample
trajectories before and after, the config.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from toolpolicy.report.comparison import Row, comparison_rows, detail_rows, metric, pass_rows
from toolpolicy.report.plots import SMOOTH_FROM, Plot, comparison_plot, rl_plots, sft_plots
from toolpolicy.report.run_files import RunFiles, read_run
from toolpolicy.report.trajectories import pick_samples, render_episode
from toolpolicy.report.viewer import VIEWER_EPISODES, VIEWER_STEPS, viewer_css, viewer_data, viewer_section

SAMPLES_SHOWN = 6
"""Episodes shown per evaluation, picked as a mix of difficulties and outcomes."""


def write_report(run_dir: Path, before: str = "sft", after: str = "rl",
                 viewer_steps: int = VIEWER_STEPS, viewer_episodes: int = VIEWER_EPISODES) -> Path:
    """Read run_dir's files and write run_dir/report.html; return its path.

    `before` and `after` name the evaluations compared (eval/<name>.json). The
    rollout viewer embeds the last `viewer_steps` stored RL steps, `viewer_episodes`
    episodes of each. Missing pieces are shown as "not available"; a malformed file
    raises RunFileError.
    """
    run = read_run(Path(run_dir), before, after)
    rollouts = viewer_data(run.run_dir, run.metrics, run.config_text, viewer_steps, viewer_episodes)
    path = run.run_dir / "report.html"
    path.write_text(render_page(run, rollouts), encoding="utf-8")
    return path


def render_page(run: RunFiles, rollouts: dict | None = None) -> str:
    """The page; `rollouts` is viewer.viewer_data's result (None: no stored rollouts)."""
    sections = [
        ("headline", "Headline", _headline(run)),
        ("before-after", "Before vs after", _before_after(run)),
        ("pass-at-k", "pass@k", _pass_at_k(run)),
        ("rl", "RL training", _plots(rl_plots(run.metrics or []), run.metrics, "no RL steps in metrics.jsonl")
         + (_ROLLOUTS_LINK if rollouts else "")),
        ("rollouts", "Rollouts", viewer_section(rollouts)),
        ("sft", "SFT", _plots(sft_plots(run.metrics or []), run.metrics, "no SFT steps in metrics.jsonl")),
        ("samples-before", f"Sample episodes: before ({run.before_name})",
         _samples(run.before_samples, run.before_name)),
        ("samples-after", f"Sample episodes: after ({run.after_name})", _samples(run.after_samples, run.after_name)),
        ("config", "Config", _config(run.config_text)),
    ]
    nav = " ".join(f'<a href="#{anchor}">{escape(title)}</a>' for anchor, title, _ in sections)
    body = "\n".join(f'<section id="{anchor}"><h2>{escape(title)}</h2>\n{content}\n</section>'
                     for anchor, title, content in sections)
    title = f"toolpolicy report: {run.run_dir.resolve().name}"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<link rel="icon" href="data:,">
<style>{CSS}{viewer_css()}</style>
</head>
<body>
<h1>{escape(title)}</h1>
<p class="muted">{escape(str(run.run_dir))} &middot; evaluations found: {escape(", ".join(run.eval_names) or "none")}</p>
<nav>{nav}</nav>
{body}
</body>
</html>
"""


_ROLLOUTS_LINK = ('<p class="muted">Each step\'s episodes, token by token: click a point of the reward curve in '
                  '<a href="#rollouts">Rollouts</a>.</p>')


def _not_available(what: str) -> str:
    return f'<p class="na">Not available: {escape(what)}.</p>'


def _missing_evals(run: RunFiles) -> str:
    missing = [f"eval/{name}.json" for name, data in ((run.before_name, run.before), (run.after_name, run.after))
               if data is None]
    return _not_available(" and ".join(missing) + " not found") if missing else ""


def _headline(run: RunFiles) -> str:
    if run.before is None and run.after is None:
        return _missing_evals(run)
    cards = [
        _card("Accuracy", Row("", metric(run.before, "accuracy"), metric(run.after, "accuracy"), "rate", +1)),
        _card("Hard accuracy", Row("", metric(run.before, "accuracy", "hard"),
                                   metric(run.after, "accuracy", "hard"), "rate", +1)),
        _card("Easy: tool calls / episode", Row("", metric(run.before, "tool_calls_per_episode", "easy"),
                                                metric(run.after, "tool_calls_per_episode", "easy"), "count")),
    ]
    legend = f'<p class="muted">{escape(run.before_name)} &rarr; {escape(run.after_name)}</p>'
    return _missing_evals(run) + legend + '<div class="cards">' + "".join(cards) + "</div>"


def _card(label: str, row: Row) -> str:
    if row.before is None and row.after is None:
        value = '<span class="na">not available</span>'
    else:
        value = f"{escape(row.before_text)} &rarr; {escape(row.after_text)}"
    return (f'<div class="card"><div class="card-label">{escape(label)}</div><div class="card-value">{value}</div>'
            f'<div class="delta {row.verdict}">{escape(row.change_text)}</div></div>')


def _before_after(run: RunFiles) -> str:
    if run.before is None and run.after is None:
        return _missing_evals(run)
    plot = comparison_plot(run.before, run.after, run.before_name, run.after_name)
    rows = comparison_rows(run.before, run.after) + detail_rows(run.before, run.after)
    return _missing_evals(run) + (_figure(plot) if plot else "") + _table(run, rows)


def _pass_at_k(run: RunFiles) -> str:
    rows = pass_rows(run.before, run.after)
    if not rows:
        return _not_available("no pass_at_k in the eval files")
    note = ('<p class="muted">pass@k: share of tasks solved by at least one of k attempts'
            "; pass^k: solved by all k. Each k averages over the tasks with k scored attempts"
            " (an infrastructure error removes one); \"m of n tasks\" marks a k that covers fewer"
            " than all.</p>")
    return _table(run, rows) + note


def _table(run: RunFiles, rows: list[Row]) -> str:
    head = (f"<tr><th>metric</th><th>before ({escape(run.before_name)})</th>"
            f"<th>after ({escape(run.after_name)})</th><th>change</th></tr>")
    body = "".join(
        f"<tr><td>{escape(r.label)}</td><td>{escape(r.before_text)}</td><td>{escape(r.after_text)}</td>"
        f'<td class="delta {r.verdict}">{escape(r.change_text)}</td></tr>'
        for r in rows
    )
    return f'<table class="compare"><thead>{head}</thead><tbody>{body}</tbody></table>'


def _plots(plots: list[Plot], metrics: list | None, empty: str) -> str:
    if metrics is None:
        return _not_available("metrics.jsonl not found")
    if not plots:
        return _not_available(empty)
    note = (f'<p class="muted">Curves with {SMOOTH_FROM} or more points show per-step values faint '
            "and an exponential moving average in bold.</p>")
    figures = "".join(_figure(p) for p in plots)
    return note + f'<div class="plots">{figures}</div>'


def _figure(plot: Plot) -> str:
    css = "plot wide" if plot.wide else "plot"
    return f'<figure class="{css}"><img src="{plot.data_uri}" alt="{escape(plot.title)}"></figure>'


def _samples(samples: list | None, name: str) -> str:
    if samples is None:
        return _not_available(f"eval/{name}_samples.jsonl not found")
    if not samples:
        return _not_available(f"eval/{name}_samples.jsonl has no episodes")
    picked = pick_samples(samples, SAMPLES_SHOWN)
    note = f'<p class="muted">{len(picked)} of {len(samples)} episodes, a mix of difficulties and outcomes.</p>'
    return note + "".join(render_episode(sample) for sample in picked)


def _config(text: str | None) -> str:
    if text is None:
        return _not_available("config.yaml not found")
    return f"<details><summary>config.yaml (resolved)</summary><pre>{escape(text)}</pre></details>"


CSS = """
body { font: 15px/1.45 -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, sans-serif; color: #1b1b1b;
       max-width: 1180px; margin: 0 auto; padding: 24px; background: #fafafa; }
h1 { margin-bottom: 4px; } h2 { border-bottom: 2px solid #e3e3e3; padding-bottom: 4px; margin-top: 40px; }
nav { position: sticky; top: 0; background: #fafafa; padding: 8px 0; border-bottom: 1px solid #e3e3e3; z-index: 1; }
nav a { margin-right: 14px; color: #1d3557; text-decoration: none; font-weight: 600; }
.muted { color: #666; font-size: 13px; } .na { color: #9a6700; font-style: italic; }
pre { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; white-space: pre-wrap;
      word-break: break-word; margin: 0; max-height: 420px; overflow: auto; }
.cards { display: flex; gap: 16px; flex-wrap: wrap; }
.card { background: #fff; border: 1px solid #e3e3e3; border-radius: 10px; padding: 14px 20px; min-width: 240px; }
.card-label { color: #666; font-size: 13px; text-transform: uppercase; letter-spacing: .04em; }
.card-value { font-size: 26px; font-weight: 700; margin: 4px 0; }
.delta { font-weight: 700; } .delta.better { color: #1a7f37; } .delta.worse { color: #c1121f; }
.delta.same, .delta.neutral { color: #555; }
table.compare { border-collapse: collapse; background: #fff; margin: 12px 0; min-width: 560px; }
table.compare th, table.compare td { border-bottom: 1px solid #eee; padding: 5px 14px; text-align: right; }
table.compare th:first-child, table.compare td:first-child { text-align: left; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 14px; }
figure.plot { margin: 0; background: #fff; border: 1px solid #e3e3e3; border-radius: 8px; padding: 6px; }
figure.plot.wide { grid-column: 1 / -1; } figure.plot img { width: 100%; height: auto; display: block; }
.episode { background: #fff; border: 1px solid #e3e3e3; border-radius: 10px; padding: 12px 16px; margin: 16px 0; }
.episode-head { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; }
.tag { color: #fff; border-radius: 4px; padding: 1px 8px; font-weight: 700; font-size: 13px; }
.verdict { font-weight: 700; } .verdict.ok { color: #1a7f37; } .verdict.no { color: #c1121f; }
.reward { color: #333; font-variant-numeric: tabular-nums; } .task-id { color: #888; font-size: 13px; }
.answer { color: #555; font-size: 13px; margin: 4px 0 10px; }
.chat { display: flex; flex-direction: column; gap: 8px; }
.msg .who { font-size: 12px; color: #777; margin-bottom: 2px; }
.bubble { white-space: pre-wrap; word-break: break-word; border-radius: 12px; padding: 8px 12px;
          display: inline-block; max-width: 85%; }
.msg.user { align-self: flex-end; text-align: right; max-width: 80%; }
.msg.user .bubble { background: #dbeafe; text-align: left; }
.msg.assistant .bubble, .msg.other .bubble { background: #f1f1f1; }
.msg.system summary { color: #777; font-size: 13px; cursor: pointer; }
.msg.system pre { background: #f6f6f6; padding: 8px; border-radius: 6px; }
.call { border: 1px solid #e9b949; background: #fff8e1; border-radius: 8px; padding: 6px 10px; margin: 6px 0;
        max-width: 85%; }
.call-head { font-size: 12px; color: #7a5b00; font-weight: 700; }
.call-head code { font-size: 13px; background: #ffe9a8; padding: 0 4px; border-radius: 3px; }
.msg.tool { border-left: 4px solid #457b9d; background: #eef4f8; border-radius: 6px; padding: 6px 10px;
            max-width: 85%; }
.events { display: flex; gap: 6px; flex-wrap: wrap; margin-top: 4px; }
.badge { border-radius: 10px; padding: 1px 9px; font-size: 12px; font-weight: 700; color: #fff; }
.badge .detail { font-weight: 400; opacity: .9; }
.badge.bad { background: #c1121f; } .badge.warn { background: #d97706; }
.badge.trunc { background: #7c3aed; } .badge.infra { background: #6b7280; }
"""
