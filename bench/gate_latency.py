"""Gate decision latency at 1, 10, 100 and 1,000 rules (issue 3: p99 <= 50 us at 100 rules).

Two layouts per size, because the gate indexes rules by tool name:
- spread: the rules are spread over 20 tools (plus a few `*` rules that apply to
  every tool), as in a real policy; a decision reads only its tool's rules.
- one-tool: every rule names the called tool, the worst case for a single decision.

Each call is one the policy allows, so every forbid, ask and permit condition of the
tool is evaluated (the slowest path; a denial can stop at the first forbid). Timing
is `Gate.evaluate` (the policy's answer; `decide` adds the approver and the optional
audit log, measured separately at 100 rules spread: written per decision, and written
and fsynced, the default, which survives power loss). Conditions read `args` and `state`, with
a short `history`.

The last row times a fixed pure-Python loop of about the gate's length in the same way: the
machine's own spread between p50 and p99 (timer interrupts, a virtual CPU's stolen time), which
no code of that length avoids.

    .venv/bin/python bench/gate_latency.py            # table + bench/results/gate_latency.json
    .venv/bin/python bench/gate_latency.py --decisions 20000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from toolpolicy.gate import AuditLog, Gate, Ledger, Policy
from toolpolicy.types import ToolCall, ToolSpec

from result_file import write_result  # bench/ is on the path of a script run from it

SIZES = (1, 10, 100, 1000)
TOOLS = [f"tool_{i}" for i in range(20)]
SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "size": {"type": "integer"}, "mode": {"type": "string"}},
    "required": ["path"],
}
CONDITIONS = (
    'args.path.startsWith("/etc/{i}")',
    "has(args.size) && args.size > {big}",
    '"level" in state && state.level == {i}',
    'args.path.contains("../{i}")',
    'has(args.mode) && args.mode == "w{i}" && !args.path.startsWith("/work/")',
)


def make_policy(rules: int, layout: str) -> Policy:
    items: list[dict[str, Any]] = []
    for i in range(rules):
        tools: Any = ["tool_0"] if layout == "one-tool" else ("*" if i % 25 == 24 else [TOOLS[i % len(TOOLS)]])
        effect = "permit" if i % 10 == 9 else "forbid"
        when = CONDITIONS[i % len(CONDITIONS)].format(i=i, big=10_000 + i)
        if effect == "permit":
            when = f'args.path.startsWith("/never/{i}")'
        items.append({"id": f"r{i}", "effect": effect, "tools": tools, "when": when, "reason": f"rule {i}"})
    return Policy.from_dict({"default": "allow", "rules": items}, f"bench-{layout}-{rules}")


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "p99.9": at(0.999), "mean": sum(ordered) / len(ordered) / 1000}


def time_decisions(decide: Any, decisions: int, warmup: int) -> dict[str, float]:
    """Latency in microseconds of `decide(call, ledger)` over varied allowed calls."""
    ledger = Ledger(facts={"level": -1, "user_verified": True})
    for k in range(5):
        ledger.record(ToolCall("tool_1", {"path": f"/work/f{k}"}), "ok")
    calls = [ToolCall("tool_0", {"path": f"/work/file_{k}.txt", "size": k % 500, "mode": "r"}) for k in range(64)]
    for k in range(warmup):
        decide(calls[k % 64], ledger)
    samples = []
    clock = time.perf_counter_ns
    for k in range(decisions):
        call = calls[k % 64]
        start = clock()
        decision = decide(call, ledger)
        samples.append(clock() - start)
        if not decision.allowed:
            raise AssertionError(f"benchmark call was denied: {decision.reason}")
    return percentiles(samples)


def reference_loop(call: Any, ledger: Any) -> Any:
    """Fixed work of about 35 us: the noise floor's yardstick, shaped like a decision for time_decisions."""
    total = 0
    for i in range(700):
        total += i
    return ALLOWED


class _Allowed:
    allowed = True


ALLOWED = _Allowed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "gate_latency.json"))
    args = parser.parse_args()
    specs = [ToolSpec(name, name, SCHEMA) for name in TOOLS]
    rows = []
    for layout in ("spread", "one-tool"):
        for size in SIZES:
            gate = Gate(make_policy(size, layout), specs)
            rows.append({"layout": layout, "rules": size, **time_decisions(gate.evaluate, args.decisions, args.warmup)})
    for durable in (False, True):
        with tempfile.TemporaryDirectory() as folder:
            audit = AuditLog(Path(folder) / "audit.jsonl", durable=durable)
            gate = Gate(make_policy(100, "spread"), specs, audit=audit)
            row = time_decisions(gate.decide, args.decisions, args.warmup)
            rows.append({"layout": f"+ audit{', fsync' if durable else ''}", "rules": 100, **row})
            audit.close()
    rows.append({"layout": "reference loop", "rules": 0, **time_decisions(reference_loop, args.decisions, args.warmup)})
    print(f"gate decision latency, microseconds ({args.decisions:,} allowed decisions after {args.warmup:,} warm-up)")
    print(f"{'layout':<20}{'rules':>6}{'p50':>9}{'p90':>9}{'p99':>9}{'p99.9':>9}")
    for row in rows:
        print(f"{row['layout']:<20}{row['rules']:>6}" + "".join(f"{row[q]:>9.1f}" for q in ("p50", "p90", "p99", "p99.9")))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, {"decisions": args.decisions, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
