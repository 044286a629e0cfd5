"""BFCL multi-turn: the ground truth of every entry replayed through toolpolicy's tool path.

Each entry's possible answers become the demonstrator's scripted assistant turns and run
through the real engine, with the shipped policy's gate in shadow mode (a denial is
counted and the call still runs), so one pass gives both figures: BFCL's verdict per
category (target 100%) and every call the policy would deny (each a false positive).
The test suite replays the base category; this covers all four.

    .venv/bin/python bench/bfcl_multi_turn_replay.py
"""

from __future__ import annotations

import json
import random
import resource
import time
from collections import Counter
from pathlib import Path

from toolpolicy.envs.bfcl import CATEGORIES, BfclMultiTurnEnv
from toolpolicy.gate import Gate, Policy
from toolpolicy.model import char_codec, make_template
from toolpolicy.rollout import EpisodeLimits, RolloutEngine, ScriptedBackend

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).parent.parent
POLICY = ROOT / "examples" / "policies" / "bfcl_multi_turn.yaml"
# Wide budgets: the replay must never be cut; long_context posts texts of ~4,000 characters.
LIMITS = EpisodeLimits(max_turns=40, max_tokens=10**7, max_turn_tokens=10**6, max_call_chars=10**5)


def main() -> None:
    env = BfclMultiTurnEnv()
    tasks = [env.task(entry_id) for entry_id in sorted(env.entries)]
    template, (encode, decode) = make_template(compact=True), char_codec()
    scripts = {i: env.expert_turns(task, random.Random(0)) for i, task in enumerate(tasks)}
    gate = Gate(Policy.load(POLICY), env.tools, enforce=False)
    started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_utime
    with RolloutEngine(env, template, encode, decode, ScriptedBackend(scripts, template.render_assistant, encode),
                       LIMITS, gate) as engine:
        episodes = [t.episode for t in engine.run(tasks)]
    wall, cpu = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu
    solved = Counter(e.task.info["category"] for e in episodes if e.outcome.get("goal_reached"))
    result = {
        "entries": len(episodes),
        "solved": sum(solved.values()),
        "solved_by_category": {c: f"{solved[c]}/{sum(e.task.info['category'] == c for e in episodes)}" for c in CATEGORIES},
        "failures": [{"id": e.task.id, "error": e.outcome.get("bfcl_error"), "detail": e.outcome.get("bfcl_detail")}
                     for e in episodes if not e.outcome.get("goal_reached")],
        "calls": sum(e.count("tool_call") for e in episodes),
        "policy_denials": [{"id": e.task.id, "rules": e.denials_by_rule()} for e in episodes if e.denials_by_rule()],
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
    }
    out = ROOT / "bench" / "results" / "bfcl_multi_turn_replay.json"
    write_result(out, result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("failures", "policy_denials")}, indent=2))
    print(f"failures: {len(result['failures'])}, policy denials: {len(result['policy_denials'])} -> {out}")


if __name__ == "__main__":
    main()
