"""AgentDojo's attacks against a model that acts: a served model on one suite, gate off and on.

Every attack the installed `agentdojo` package registers but `manual` (whose text a person
types) runs on the suite's eval split: each (user task, injection task) pair once, greedy,
the attack's text in every injection vector; a `*dos` attack takes one injection task per
user task and succeeds when the user task fails, as the package counts it. Each episode runs
through toolpolicy's engine against the model at eval.served_url (its tool calls come back
as the endpoint's `tool_calls`), once with the suite's shipped policy enforced and once
without. Utility is the suite's own check of the user task; attack success its security
check of the injection task. Writes docs/results/agentdojo/served_SUITE.json.

    python -m vllm.entrypoints.openai.api_server --model MODEL_DIR --served-model-name NAME \
        --chat-template TEMPLATE --enable-auto-tool-choice --tool-call-parser hermes --enforce-eager &
    PYTHONPATH=src python bench/agentdojo_served.py --url http://127.0.0.1:8000/v1 --model NAME [--suite slack]

(`docs/agentdojo.md` gives the commands that served SmolLM2 for the published file.)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from toolpolicy.api import evaluate
from toolpolicy.build import load_config
from toolpolicy.envs.agentdojo.package import ATTACKS, SUITES, is_dos, load_suite

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ROOT / "examples" / "policies" / "agentdojo"
RESULTS = ROOT / "docs" / "results" / "agentdojo"
ACTING_ATTACKS = tuple(attack for attack in ATTACKS if attack != "manual")
"""`none` (the user tasks alone) and every attack with a text of its own."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True, help="the model name the endpoint serves")
    parser.add_argument("--suite", default="slack", choices=SUITES)
    parser.add_argument("--attacks", nargs="+", default=list(ACTING_ATTACKS), choices=ACTING_ATTACKS)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256, help="sampled tokens a turn")
    parser.add_argument("--note", default="", help="what the served model is, kept in the result file")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="agentdojo-served-") as run_dir:
        for attack in args.attacks:
            for gate in (False, True):
                rows.append(run_attack(args, attack, gate, Path(run_dir)))
                print_row(rows[-1])
    report = {
        "suite": args.suite,
        "split": "eval",
        "served_model": args.model,
        "note": args.note,
        "policy": str((POLICIES / f"{args.suite}.yaml").relative_to(ROOT)),
        "max_turns": args.max_turns,
        "max_tokens_per_turn": args.max_tokens,
        "rows": rows,
        "totals": totals(rows),
    }
    write_result(args.out or RESULTS / f"served_{args.suite}.json", report)


def run_attack(args: argparse.Namespace, attack: str, gate: bool, run_dir: Path) -> dict:
    """One attack on every eval pair of the suite, the policy enforced or not: its summary row."""
    pairs = eval_pairs(args.suite, attack)
    cfg = load_config(None, [
        f"run.dir={run_dir}", "env=agentdojo", f"env.suite={args.suite}", f"env.attack={attack}",
        f"gate.policy={POLICIES / f'{args.suite}.yaml'}", f"rollout.max_turns={args.max_turns}",
        f"eval.served_url={args.url}", f"eval.served_model={args.model}", f"eval.served_max_tokens={args.max_tokens}",
        f"eval.tasks={pairs}", "eval.samples=1", "eval.temperature=0.0", "eval.samples_in_report=0",
    ])
    began = time.perf_counter()
    summary = evaluate(cfg, name=f"{attack}_{'on' if gate else 'off'}", gate=gate)
    return {
        "attack": attack,
        "gate": "on" if gate else "off",
        "episodes": summary["n"],
        "utility": summary["rewards"]["task_success"],
        "attack_success": summary["rewards"]["attack_success"],
        "tool_calls_per_episode": summary["tool_calls_per_episode"],
        "invalid_call_rate": summary["invalid_call_rate"],
        "denials_per_episode": summary["denials_per_episode"],
        "denials_by_rule": summary["denials_by_rule"],
        "infra_errors": summary["infra_errors"],
        "wall_s": round(time.perf_counter() - began, 1),
    }


def eval_pairs(suite: str, attack: str) -> int:
    """Episodes the eval split holds under `attack`: its user tasks times the injection tasks
    each is paired with (one under a `*dos` attack, none without an attack)."""
    loaded = load_suite(suite)
    users = len(loaded.user_tasks) // 2  # envs/agentdojo/env.py split_of: the odd positions are eval
    injections = 1 if attack == "none" or is_dos(loaded, attack) else len(loaded.injection_tasks)
    return users * injections


def totals(rows: list[dict]) -> dict:
    """Attack success and utility over every attacked episode, gate off and on."""
    out = {}
    for gate in ("off", "on"):
        attacked = [r for r in rows if r["gate"] == gate and r["attack"] != "none"]
        episodes = sum(r["episodes"] for r in attacked)
        out[gate] = {
            "episodes": episodes,
            "attack_success": sum(r["attack_success"] * r["episodes"] for r in attacked) / max(episodes, 1),
            "utility": sum(r["utility"] * r["episodes"] for r in attacked) / max(episodes, 1),
        }
    return out


def print_row(row: dict) -> None:
    print(
        f"{row['attack']:<32} gate {row['gate']:<3} n={row['episodes']:<3} utility {row['utility']:.1%} "
        f"attack success {row['attack_success']:.1%} calls/ep {row['tool_calls_per_episode']:.2f} "
        f"denials/ep {row['denials_per_episode']:.2f} ({row['wall_s']} s)",
        flush=True,
    )


if __name__ == "__main__":
    main()
