"""Run report: a run folder's files in, a self-contained report.html and a terminal table out.

    from toolpolicy.report import write_report, format_comparison
    write_report(Path("runs/demo"))              # -> runs/demo/report.html
    print(format_comparison(sft_eval, rl_eval))  # before/after table for the terminal

Or from a shell: `python -m toolpolicy.report runs/demo [--before sft --after rl]`.

Reads only files (see run_files.py for the folder layout), so a report can be
rebuilt for any finished or half-finished run without torch or a model.

Modules: run_files (reading), comparison (before/after rows, terminal table),
plots (PNG figures), trajectories (sample episodes), viewer (the stored RL rollouts, token by
token), rollout_view (the same in the terminal), page (the HTML document). The tables the
documentation shows are rendered outside the package, by docs/tables.py.
"""

from toolpolicy.report.comparison import format_comparison, format_summary
from toolpolicy.report.page import write_report
from toolpolicy.report.run_files import RunFileError

__all__ = ["RunFileError", "format_comparison", "format_summary", "write_report"]
