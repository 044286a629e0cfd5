"""SFT from a JSONL file against SFT from the demonstrator: the calc cold start both ways.

Exports the calc demonstrator's dialogues (the demo config's SFT set: `sft_examples`
dialogues, its own assistant messages and the observations the engine produced) to
JSONL, checks that they render to the demonstrator's very tokens and loss mask, then
runs `train_sft` twice from the same initial model (built once, so both share its
tokenizer and weights): once with the demonstrator, once with `sft_data` set to the
file. Both final models are scored on the same held-out tasks. Identical tokens give
identical batches, so the two accuracies should agree exactly; the claim checked is
that they agree within 2 points.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python bench/sft_data.py [--steps N] [--examples N] [--eval-tasks N]
    .venv/bin/python bench/sft_data.py --against-shipped --threads 2

The defaults are the shipped cold start's (src/toolpolicy/configs/demo.yaml: 48,000
dialogues, 1,500 steps of 32) and its 300 held-out tasks x 4 samples. Writes
bench/results/sft_data.json (a smaller cold start: sft_data_<steps>.json).

--against-shipped trains from the file only, and scores the shipped cold start
(checkpoints/calc-sft, the demonstrator's run of the same config) on the same held-out
tasks in place of a second run: half the time, and the comparison the figures of docs/experiments/calc.md
rest on. That checkpoint was trained by an earlier version of the code, so float
rounding may differ; the 2-point tolerance is for that.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from toolpolicy.build import build_env, episode_limits, load_policy_model, prepare_run_dir
from toolpolicy.build import load_config
from toolpolicy.config import replaced
from toolpolicy.eval.export import export_episodes
from toolpolicy.eval.run import evaluate
from toolpolicy.trainer.demonstrations import build_embedded, demonstrations, demonstrator_dialogue, demonstrator_scripts
from toolpolicy.trainer.sft import train_sft
from toolpolicy.trainer.sft_data import data_examples

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).parent.parent
SHIPPED = ROOT / "checkpoints" / "calc-sft"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="SFT steps (default: demo.yaml's)")
    parser.add_argument("--examples", type=int, default=None, help="dialogues (default: demo.yaml's)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks (default: demo.yaml's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--against-shipped", action="store_true", help="score checkpoints/calc-sft instead of a second run")
    parser.add_argument("--out", default="runs/bench-sft-data")
    args = parser.parse_args()

    out = ROOT / args.out
    overrides = [f"run.threads={args.threads}", "sft.cold_start="]
    overrides += [f"sft.steps={args.steps}"] if args.steps else []
    overrides += [f"sft.examples={args.examples}"] if args.examples else []
    overrides += [f"eval.tasks={args.eval_tasks}"] if args.eval_tasks else []
    cfg = load_config(ROOT / "src/toolpolicy/configs/demo.yaml", overrides)
    base = out / "model"
    if not (base / "config.json").is_file():
        build_embedded(cfg, base)
    cfg = replaced(cfg, {"model.source": str(base)})

    began = time.perf_counter()
    policy = load_policy_model(cfg.model, base)
    demos = demonstrations(cfg, cfg.sft.examples, policy.chat, policy.encode, policy.decode, "sft")
    env = build_env(cfg.env)
    scripts = demonstrator_scripts(cfg, env, env.tasks("train", cfg.sft.examples, seed=cfg.run.seed), "sft")
    data = out / "demonstrations.jsonl"
    export_episodes(((demonstrator_dialogue(d, s), env.tools.specs()) for d, s in zip(demos, scripts)), data)
    back = data_examples(data, policy.chat, policy.encode, episode_limits(cfg.rollout), env)
    identical = sum(a.token_ids == b.token_ids and a.loss_mask == b.loss_mask for a, b in zip(demos, back))
    export_seconds = time.perf_counter() - began

    results = {"config": "src/toolpolicy/configs/demo.yaml", "overrides": overrides, "against_shipped": args.against_shipped, "dialogues": len(demos),
               "identical_token_sequences": identical, "truncated_dialogues": sum(d.episode.truncated for d in demos),
               "export_and_read_seconds": export_seconds, "runs": {}}
    for name, update in (("demonstrator", {}), ("sft_data", {"sft.data": str(data)})):
        run_cfg = replaced(cfg, {**update, "run.dir": str(out / name)})
        began = time.perf_counter()
        if name == "demonstrator" and args.against_shipped:
            final, trained = SHIPPED, None
        else:
            final, trained = train_sft(run_cfg, prepare_run_dir(run_cfg)), time.perf_counter() - began
        summary = evaluate(run_cfg, final, name, prepare_run_dir(run_cfg))
        results["runs"][name] = {"model": str(final.relative_to(ROOT)) if final.is_relative_to(ROOT) else str(final),
                                 "sft_seconds": trained, "accuracy": summary["accuracy"],
                                 "by_difficulty": {d: s["accuracy"] for d, s in summary["by_difficulty"].items()}}
    gap = abs(results["runs"]["sft_data"]["accuracy"] - results["runs"]["demonstrator"]["accuracy"])
    results["accuracy_gap_points"] = 100 * gap
    results["within_2_points"] = gap <= 0.02
    full = not (args.steps or args.examples or args.eval_tasks)
    path = ROOT / "bench" / "results" / ("sft_data.json" if full else f"sft_data_{cfg.sft.steps}.json")
    write_result(path, results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
