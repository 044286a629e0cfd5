"""The main job end to end: build the embedded model, SFT it, evaluate, RL, evaluate, report.

    toolpolicy demo [--config FILE] [--set key=value ...]

Every phase writes into one run folder (default runs/demo): config.yaml,
model/ (tokenizer + initial weights), sft/ and rl/ (checkpoints, final model),
metrics.jsonl, eval/ (before = sft, after = rl) and report.html.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from toolpolicy.build import prepare_run_dir
from toolpolicy.eval.run import evaluate
from toolpolicy.report import format_comparison, write_report
from toolpolicy.config import Config, replaced
from toolpolicy.trainer.rl import train_rl
from toolpolicy.trainer.sft import train_sft


def say(message: str) -> None:
    print(f"[toolpolicy] {message}", flush=True)


def sft_source(cfg: Config) -> str:
    """What the demo's SFT step trains which model on, as it announces it."""
    model = "building the embedded model and " if cfg.model.source == "embedded" else f"{cfg.model.source}: "
    data = f"the conversations of {cfg.sft.data}" if cfg.sft.data else f"the {cfg.env.name} demonstrator's episodes"
    return f"{model}SFT cold start on {data}"


def run_demo(cfg: Config) -> dict:
    began = time.perf_counter()
    run_dir = prepare_run_dir(cfg)
    say(f"run folder: {run_dir}")

    if cfg.sft.cold_start:
        say(f"1/5 cold start: the SFT checkpoint {cfg.sft.cold_start} (run it yourself with sft.cold_start='')")
        sft_final = Path(cfg.sft.cold_start)
    else:
        say(f"1/5 {sft_source(cfg)}")
        sft_final = train_sft(cfg, run_dir)

    say("2/5 evaluating the SFT model on held-out tasks")
    before = evaluate(cfg, sft_final, "sft", run_dir)

    say("3/5 RL from the SFT checkpoint")
    cfg = replaced(cfg, {"rl.init_from": str(sft_final)})
    prepare_run_dir(cfg)  # the resolved config now names the RL starting point
    rl_final = train_rl(cfg, run_dir)

    say("4/5 evaluating the RL model on the same held-out tasks")
    after = evaluate(cfg, rl_final, "rl", run_dir)

    say("5/5 writing the report")
    report = write_report(run_dir)
    minutes = (time.perf_counter() - began) / 60
    (run_dir / "summary.json").write_text(json.dumps({"before": before, "after": after, "minutes": minutes}, indent=2))
    print()
    print(format_comparison(before, after))
    print()
    say(f"report: {report}   ({minutes:.1f} min)")
    return {"before": before, "after": after, "report": str(report)}


def default_config_path() -> Path:
    return Path(__file__).parent / "configs" / "demo.yaml"
