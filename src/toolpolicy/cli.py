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

    audit = commands.add_parser("audit", help="audit logs of gate decisions").add_subparsers(dest="audit_command", required=True)
    verify_log = audit.add_parser("verify", help="check a log's hash chain, head file and signatures")
    verify_log.add_argument("log")
    verify_log.add_argument("--public-key", default=None, help="Ed25519 public key (PEM) to check signatures")

    gate = commands.add_parser("gate", help="policy gate tools").add_subparsers(dest="gate_command", required=True)
    check = gate.add_parser("check", help="print the gate's decision for one call")
    check.add_argument("policy")
    check.add_argument("--tool", required=True)
    check.add_argument("--args", default="{}", help="the call's arguments as a JSON object")
    check.add_argument("--state", default="{}", help="episode ledger facts as a JSON object")
    check.add_argument("--tools", default=None, help="JSON file of tool specs (name, description, parameters)")
    check.add_argument("--env", default="calc", help="take the tool specs from this environment when --tools is not given")
    return parser


def _audit_verify(args: argparse.Namespace) -> int:
    from toolpolicy.gate import verify

    result = verify(args.log, args.public_key)
    for warning in result.warnings:
        print(f"warning: {warning}")
    for problem in result.problems:
        print(f"problem: {problem}")
    signed = ", signatures checked" if result.signatures_checked else ""
    print(f"{args.log}: {'OK' if result.ok else 'FAILED'}: {result.records} records{signed}")
    return 0 if result.ok else 1


def _gate_check(args: argparse.Namespace) -> int:
    import json

    from toolpolicy.gate import Gate, Ledger, Policy
    from toolpolicy.types import ToolCall, ToolSpec

    try:
        call_args, facts = json.loads(args.args), json.loads(args.state)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--args/--state must be JSON objects: {exc}") from None
    if not isinstance(call_args, dict) or not isinstance(facts, dict):
        raise ValueError("--args/--state must be JSON objects, such as '{\"path\": \"notes.txt\"}'")
    if args.tools:
        specs = [ToolSpec(s["name"], s.get("description", ""), s["parameters"]) for s in json.loads(Path(args.tools).read_text())]
    else:
        from toolpolicy.envs import make_env

        specs = make_env(args.env).tools.specs()
    ledger = Ledger()
    ledger.facts.update(facts)
    decision = Gate(Policy.load(args.policy), specs).evaluate(ToolCall(args.tool, call_args), ledger)
    print(json.dumps({"effect": decision.effect, "rule_ids": list(decision.rule_ids), "reason": decision.reason, "hint": decision.hint}, indent=2))
    if not decision.allowed:
        print(decision.observation())
    return 0 if decision.allowed else 1


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


def _quiet_libraries() -> None:
    """Our own progress bars show every phase; the per-file ones of transformers add only noise."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("demo", "sft", "train", "eval"):
        _quiet_libraries()
    try:
        if args.command == "config":
            print(describe_fields())
        elif args.command == "audit":
            return _audit_verify(args)
        elif args.command == "gate":
            return _gate_check(args)
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
