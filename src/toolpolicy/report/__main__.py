"""`python -m toolpolicy.report RUN_DIR`: write RUN_DIR/report.html and print the before/after table.

`--viewer-steps N --viewer-episodes M` set how much of the rollout store the page embeds."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolpolicy.report.comparison import format_comparison
from toolpolicy.report.page import write_report
from toolpolicy.report.run_files import RunFileError, read_eval
from toolpolicy.report.viewer import VIEWER_EPISODES, VIEWER_STEPS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolpolicy.report", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--before", default="sft", help="eval name of the 'before' column (eval/<name>.json)")
    parser.add_argument("--after", default="rl", help="eval name of the 'after' column")
    parser.add_argument("--viewer-steps", type=int, default=VIEWER_STEPS,
                        help="stored RL steps the rollout viewer embeds, the last ones")
    parser.add_argument("--viewer-episodes", type=int, default=VIEWER_EPISODES,
                        help="episodes embedded per step, as whole groups (a larger group is kept whole)")
    args = parser.parse_args(argv)
    if args.viewer_steps < 0 or args.viewer_episodes < 0:
        parser.error("--viewer-steps and --viewer-episodes must be 0 or more")
    try:
        path = write_report(args.run_dir, args.before, args.after, args.viewer_steps, args.viewer_episodes)
        before = read_eval(args.run_dir / "eval" / f"{args.before}.json")
        after = read_eval(args.run_dir / "eval" / f"{args.after}.json")
    except RunFileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if before is not None or after is not None:
        print(format_comparison(before or {"name": args.before}, after or {"name": args.after}))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
