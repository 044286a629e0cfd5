"""SFT from a JSONL file against SFT from the demonstrator: the calc cold start both ways.

Exports the calc demonstrator's dialogues (the demo config's SFT set: `sft_examples`
dialogues, its own assistant messages and the observations the engine produced) to
JSONL, checks that they render to the demonstrator's very tokens and loss mask, then
runs `train_sft` twice from the same initial model (built once, so both share its
tokenizer and weights): once with the demonstrator, once with `sft_data` set to the
file. Both final models are scored on the same held-out tasks. Identical tokens give
identical batches, so the two accuracies should agree exactly; the claim checked is
that they agree within 2 points.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python bench/sft_data.py [--steps N] [--eval-tasks N]

The defaults are the shipped cold start's (src/toolpolicy/configs/demo.yaml: 48,000
dialogues, 1,500 steps of 32) and its 300 held-out tasks x 4 samples. Writes
bench/results/sft_data.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from toolpolicy.build import build_env, episode_limits, load_policy_model, prepare_run_dir
from toolpolicy.config import load_config
from toolpolicy.eval.export import export_episodes
from toolpolicy.eval.run import evaluate
from toolpolicy.trainer.demonstrations import build_embedded, demonstrations, demonstrator_dialogue, demonstrator_scripts
from toolpolicy.trainer.sft import train_sft
from toolpolicy.trainer.sft_data import data_examples

ROOT = Path(__file__).parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="SFT steps (default: demo.yaml's)")
    parser.add_argument("--examples", type=int, default=None, help="dialogues (default: demo.yaml's)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks (default: demo.yaml's)")
    parser.add_argument("--out", default="runs/bench-sft-data")
    args = parser.parse_args()

    out = ROOT / args.out
    overrides = ["threads=1", "cold_start="]
    overrides += [f"sft_steps={args.steps}"] if args.steps else []
    overrides += [f"sft_examples={args.examples}"] if args.examples else []
    overrides += [f"eval_tasks={args.eval_tasks}"] if args.eval_tasks else []
    cfg = load_config(ROOT / "src/toolpolicy/configs/demo.yaml", overrides)
    base = out / "model"
    if not (base / "config.json").is_file():
        build_embedded(cfg, base)
    cfg = cfg.model_copy(update={"model": str(base)})

    began = time.perf_counter()
    policy = load_policy_model(cfg, base)
    demos = demonstrations(cfg, cfg.sft_examples, policy.chat, policy.encode, policy.decode, "sft")
    env = build_env(cfg)
    scripts = demonstrator_scripts(cfg, env.tasks("train", cfg.sft_examples, seed=cfg.seed), "sft")
    data = out / "demonstrations.jsonl"
    export_episodes(((demonstrator_dialogue(d, s), env.tools.specs()) for d, s in zip(demos, scripts)), data)
    back = data_examples(data, policy.chat, policy.encode, episode_limits(cfg))
    identical = sum(a.token_ids == b.token_ids and a.loss_mask == b.loss_mask for a, b in zip(demos, back))
    export_seconds = time.perf_counter() - began

    results = {"config": "src/toolpolicy/configs/demo.yaml", "overrides": overrides, "dialogues": len(demos),
               "identical_token_sequences": identical, "truncated_dialogues": sum(d.episode.truncated for d in demos),
               "export_and_read_seconds": export_seconds, "runs": {}}
    for name, update in (("demonstrator", {}), ("sft_data", {"sft_data": str(data)})):
        run_cfg = cfg.model_copy(update={**update, "run_dir": str(out / name)})
        began = time.perf_counter()
        final = train_sft(run_cfg, prepare_run_dir(run_cfg))
        trained = time.perf_counter() - began
        summary = evaluate(run_cfg, final, name, out / name)
        results["runs"][name] = {"sft_seconds": trained, "accuracy": summary["accuracy"],
                                 "by_difficulty": {d: s["accuracy"] for d, s in summary["by_difficulty"].items()}}
    gap = abs(results["runs"]["sft_data"]["accuracy"] - results["runs"]["demonstrator"]["accuracy"])
    results["accuracy_gap_points"] = 100 * gap
    results["within_2_points"] = gap <= 0.02
    path = ROOT / "bench" / "results" / "sft_data.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
