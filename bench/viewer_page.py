"""How large report.html gets with the rollout viewer, and docs/runs.md's screenshot of it.

    python bench/viewer_page.py RUN_DIR [--screenshot docs/viewer.png]

RUN_DIR is a run folder with a rollout store, e.g. three RL steps of the hotel job:

    toolpolicy train src/toolpolicy/configs/hotel.yaml --set run.dir=runs/hotel-viewer \\
        --set rl.init_from=checkpoints/hotel-sft --set rl.steps=3

Writes the report three ways and measures each page: no viewer (0 steps), the default
limits, and everything the store holds; the viewer's JSON per embedded episode and per
1,000 embedded tokens, against the store's own Parquet bytes and its rows as plain JSON. With --screenshot, opens the
default page in headless Chromium (tests/browser.py), shows the first group of the last
step side by side with a token's tooltip, and saves the Rollouts section as a PNG.
Writes bench/results/viewer_page_RUNNAME.json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser import chromium, missing_browser  # noqa: E402
from toolpolicy.report.page import write_report  # noqa: E402
from toolpolicy.report.viewer import VIEWER_EPISODES, VIEWER_STEPS  # noqa: E402
from toolpolicy.rollout.store import step_file, stored_steps  # noqa: E402

from result_file import write_result  # noqa: E402  (bench/ is on the path of a script run from it)

DATA = re.compile(r'<script type="application/json" id="viewer-data">(.*?)</script>', re.DOTALL)


def page_figures(run_dir: Path, steps: int, episodes: int) -> dict:
    page = write_report(run_dir, viewer_steps=steps, viewer_episodes=episodes).read_text(encoding="utf-8")
    match = DATA.search(page)
    payload = match.group(1) if match else ""
    data = json.loads(payload) if payload else {"steps": []}
    embedded = [e for s in data["steps"] for e in s["episodes"]]
    tokens = sum(len(e["ids"]) for e in embedded)
    return {
        "viewer_steps": steps, "viewer_episodes": episodes,
        "page_bytes": len(page.encode()), "viewer_json_bytes": len(payload.encode()),
        "embedded_steps": len(data["steps"]), "embedded_episodes": len(embedded), "embedded_tokens": tokens,
        "json_bytes_per_episode": round(len(payload.encode()) / len(embedded)) if embedded else None,
        "json_bytes_per_1000_tokens": round(1000 * len(payload.encode()) / tokens) if tokens else None,
    }


def screenshot(run_dir: Path, out: Path) -> None:
    """The Rollouts section of the default page: a group with a gate denial if the last step
    has one, side by side, with one sampled token's tooltip open."""
    with chromium(width=1400, height=1100) as context:
        page = context.new_page()
        page.goto((run_dir / "report.html").as_uri())
        page.wait_for_selector("#viewer-list tbody tr")
        page.add_style_tag(content="nav { position: static; }")  # not over the section's top
        page.check("#viewer-denied")
        if not page.locator("#viewer-list tbody tr").count():
            page.uncheck("#viewer-denied")
        page.click("#viewer-tab-group")
        section = page.locator("#rollouts")
        section.scroll_into_view_if_needed()
        sampled = page.locator(".group-column.selected .tok.sampled")
        sampled.nth(sampled.count() // 3).hover()
        box = section.evaluate("s => { const r = s.getBoundingClientRect();"
                               " return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}; }")
        page.screenshot(path=str(out), full_page=True, clip=box)  # page coordinates: no scroll, the hover stays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--screenshot", type=Path, help="where to save the PNG (e.g. docs/viewer.png)")
    args = parser.parse_args()
    folder = args.run_dir / "rl" / "rollouts"
    steps = stored_steps(folder)
    if not steps:
        sys.exit(f"{folder}: no stored steps (run RL with store_rollouts: true)")
    everything = (len(steps), 10**9)  # every step, every episode
    result = {
        "run": args.run_dir.name, "stored_steps": len(steps),
        "store_parquet_bytes": sum(step_file(folder, s).stat().st_size for s in steps),
        # the same rows as plain JSON, to set against the page's "everything" JSON
        "store_rows_json_bytes": sum(len(json.dumps(row, default=str).encode())
                                     for s in steps for row in pq.read_table(step_file(folder, s)).to_pylist()),
        # the default page last, so RUN_DIR/report.html is left as `toolpolicy report` writes it
        "pages": [page_figures(args.run_dir, *limits) for limits in ((0, 0), everything, (VIEWER_STEPS, VIEWER_EPISODES))],
    }
    out = ROOT / "bench" / "results" / f"viewer_page_{args.run_dir.name}.json"
    write_result(out, result)
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")
    if args.screenshot:
        reason = missing_browser()
        if reason:
            sys.exit(f"no screenshot: {reason}")
        screenshot(args.run_dir, args.screenshot)
        print(f"wrote {args.screenshot}")


if __name__ == "__main__":
    main()
