"""The `toolpolicy` command. Thin: parse arguments, load the config, call one function."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolpolicy.trainer.config import Config, ConfigError, describe_fields, load_config


def _with_config(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("config", nargs=None if required else "?", help="YAML config file (see `toolpolicy config`)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override one config field")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolpolicy", description="Train tool-using LLM agents with RL and govern their tool calls.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="build the tiny model, SFT, RL and evaluate on `calc`; write a report")
    demo.add_argument("--config", default=None, help="YAML config (default: the shipped demo.yaml)")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override one config field")

    for name, text in (("sft", "SFT cold start on generated demonstrations"), ("train", "RL from `init_from`")):
        sub = commands.add_parser(name, help=text)
        _with_config(sub, required=False)
        sub.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")

    evaluate = commands.add_parser("eval", help="score a checkpoint on held-out tasks")
    _with_config(evaluate, required=True)
    evaluate.add_argument("--name", default="eval", help="name of the result files under RUN_DIR/eval/")

    report = commands.add_parser("report", help="write RUN_DIR/report.html from a run folder's files")
    report.add_argument("run_dir")
    report.add_argument("--before", default="sft")
    report.add_argument("--after", default="rl")

    commands.add_parser("config", help="list every config field with its default and meaning")
    return parser


def _resolve(args: argparse.Namespace) -> Config:
    """The config file, or with --resume and no file, the run's own resolved config."""
    resume = getattr(args, "resume", None)
    path = args.config
    if path is None and resume:
        path = Path(resume) / "config.yaml"
    overrides = list(args.overrides)
    if resume:
        overrides.append(f"run_dir={resume}")
    return load_config(path, overrides)


def _newest_model(run_dir: Path) -> Path:
    for candidate in (run_dir / "rl" / "final", run_dir / "sft" / "final", run_dir / "model"):
        if (candidate / "config.json").is_file():
            return candidate
    raise FileNotFoundError(f"{run_dir}: no model found (looked in rl/final, sft/final, model); set eval_checkpoint")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "config":
            print(describe_fields())
        elif args.command == "report":
            from toolpolicy.report.__main__ import main as report_main

            return report_main([args.run_dir, "--before", args.before, "--after", args.after])
        elif args.command == "demo":
            from toolpolicy.demo import default_config_path, run_demo

            run_demo(load_config(args.config or default_config_path(), args.overrides))
        elif args.command == "sft":
            from toolpolicy.trainer.setup import prepare_run_dir
            from toolpolicy.trainer.sft import train_sft

            cfg = _resolve(args)
            print(train_sft(cfg, prepare_run_dir(cfg), resume=bool(args.resume)))
        elif args.command == "train":
            from toolpolicy.trainer.rl import train_rl
            from toolpolicy.trainer.setup import prepare_run_dir

            cfg = _resolve(args)
            print(train_rl(cfg, prepare_run_dir(cfg), resume=bool(args.resume)))
        elif args.command == "eval":
            import json

            from toolpolicy.eval.run import evaluate

            cfg = _resolve(args)
            run_dir = Path(cfg.run_dir)
            checkpoint = Path(cfg.eval_checkpoint) if cfg.eval_checkpoint else _newest_model(run_dir)
            print(json.dumps(evaluate(cfg, checkpoint, args.name, run_dir), indent=2))
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"toolpolicy {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
