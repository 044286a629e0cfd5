"""The AgentDojo gate replay: every suite's ground-truth calls through its shipped policy.

For each suite (workspace, travel, banking, slack) and its policy in
examples/policies/agentdojo/, replays every user task's ground-truth calls (utility kept;
each denial is a false positive) and every (user task, injection task) pair with the
injection's ground-truth calls after the user's, the attack's text in every injection
vector (attacks blocked, attack success by the suite's own security check), gate off and on,
and on with every question the policy asks (`ask`) approved: what a user who confirms keeps,
and which attacks only the user's refusal stops.
See toolpolicy/envs/agentdojo/replay.py. Writes docs/results/agentdojo/gate.json (the
package's default benchmark version), or with --versions, docs/results/agentdojo/versions.json:
the same replays on each benchmark version the package registers (v1 to v1.2.2), whose
tasks the policies were not written from (they were written reading v1.2.2's replays).

    PYTHONPATH=src python bench/agentdojo_gate.py [--suites banking slack]
    PYTHONPATH=src python bench/agentdojo_gate.py --versions v1 v1.1 v1.1.1 v1.1.2 v1.2 v1.2.1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from toolpolicy.envs.agentdojo.package import BENCHMARK_VERSION, SUITES, VERSIONS
from toolpolicy.envs.agentdojo.replay import REPLAY_ATTACK, replay_suite
from toolpolicy.gate import Policy

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ROOT / "examples" / "policies" / "agentdojo"
OUT = ROOT / "docs" / "results" / "agentdojo" / "gate.json"
VERSIONS_OUT = ROOT / "docs" / "results" / "agentdojo" / "versions.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=SUITES)
    parser.add_argument("--versions", nargs="+", choices=VERSIONS, help="replay these benchmark versions (versions.json)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.versions:
        by_version = {version: replay_all(args.suites, version) for version in args.versions}
        report = {"attack": REPLAY_ATTACK, "policies_written_from": BENCHMARK_VERSION, "versions": by_version}
        write_report(args.out or VERSIONS_OUT, report)
    else:
        report = {"benchmark_version": BENCHMARK_VERSION, "attack": REPLAY_ATTACK, "suites": replay_all(args.suites)}
        write_report(args.out or OUT, report)


def replay_all(suites: list[str], version: str = BENCHMARK_VERSION) -> dict[str, dict]:
    """Each suite's replay on benchmark `version`, with its wall time; one line printed per suite."""
    results = {}
    for suite in suites:
        started = time.perf_counter()
        replay = replay_suite(suite, Policy.load(POLICIES / f"{suite}.yaml"), version)
        results[suite] = {**replay.to_dict(), "seconds": round(time.perf_counter() - started, 2)}
        print(
            f"{version:7s} {suite:10s} utility kept {replay.utility_kept:6.1%}  attack success {replay.attack_success_off:6.1%} -> "
            f"{replay.attack_success_on:5.1%}  blocked {replay.attacks_blocked:6.1%}  "
            f"false positives {len(replay.false_positives)}  every question approved: utility "
            f"{replay.utility_if_approved:6.1%}, attack success {replay.attack_success_if_approved:5.1%}  "
            f"({results[suite]['seconds']} s)",
            flush=True,
        )
    return results


def write_report(out: Path, report: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, report, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
