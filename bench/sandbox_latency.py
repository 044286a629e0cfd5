"""Python sandbox call latency, warm (issue: p50 <= 10 ms), and the cold start of a worker.

Timing is `PythonSandbox.run` as a caller sees it: the request to a warm worker, the
code sent to the call's child (forked and confined while the worker was idle), the
code itself, the kill and reap of the call's processes, and the reply. Where the CPU
limit holds per call (`Isolation.cpu`), a call also reads its cgroup's CPU time at its
start and end and kills and waits for the cgroup (about 0.1 ms), and the next child is
forked into the cgroup after the reply (two cgroup moves: about 0.07 ms when calls follow
each other, but 10 to 20 ms of the worker's time, an RCU grace period of the kernel's,
once the worker has been idle for 100 ms; a call that arrives on the same worker within
that time waits for it). Rows:
- print: `print(1 + 1)`, back to back, the floor of a call; the worker is still
  preparing the next child (a fresh tmpfs, a fork) when the next request arrives;
- print, 20 ms apart: the same with a pause between calls, as when a model generates
  between them, so the preparation is done before each call;
- compute: a small computation (sum of squares of 100,000 numbers, a few ms of CPU);
- print, no namespaces: `isolate=False`, to show what isolation costs.
Calls run one at a time after a warm-up. Cold start is constructing a one-worker
sandbox until the worker has isolated itself and reported, then closing it.

On a shared machine the percentiles move with the load (the load average is recorded):
every call wakes three processes in turn, and each wake-up waits for a free CPU.

    .venv/bin/python bench/sandbox_latency.py            # table + bench/results/sandbox_latency.json
    .venv/bin/python bench/sandbox_latency.py --calls 2000
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from toolpolicy.tools import PythonSandbox, SandboxLimits

from result_file import write_result  # bench/ is on the path of a script run from it

PRINT = "print(1 + 1)"
COMPUTE = "print(sum(i * i for i in range(100_000)))"
GOAL_P50_MS = 10.0


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": ordered[-1], "mean": sum(ordered) / len(ordered)}


def time_calls(sandbox: PythonSandbox, code: str, calls: int, warmup: int, gap: float = 0.0) -> dict[str, float]:
    """Latency in milliseconds of `sandbox.run(code)`, which must succeed every time; `gap` seconds between calls."""
    for _ in range(warmup):
        sandbox.run(code)
    samples = []
    for _ in range(calls):
        time.sleep(gap)
        start = time.perf_counter()
        run = sandbox.run(code)
        samples.append((time.perf_counter() - start) * 1000)
        if run.status != "ok":
            raise AssertionError(f"benchmark call failed: {run.observation()}")
    return percentiles(samples)


def time_cold_starts(starts: int, isolate: bool) -> dict[str, float]:
    samples = []
    for _ in range(starts):
        start = time.perf_counter()
        sandbox = PythonSandbox(SandboxLimits(workers=1), isolate=isolate)
        samples.append((time.perf_counter() - start) * 1000)
        sandbox.close()
    return percentiles(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--cold-starts", type=int, default=10)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "sandbox_latency.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    with PythonSandbox() as sandbox:
        isolation = sandbox.isolation
        rows.append({"case": "print", **time_calls(sandbox, PRINT, args.calls, args.warmup)})
        rows.append({"case": "print, 20 ms apart", **time_calls(sandbox, PRINT, args.calls, args.warmup, gap=0.02)})
        rows.append({"case": "compute", **time_calls(sandbox, COMPUTE, args.calls, args.warmup)})
    with PythonSandbox(isolate=False) as sandbox:
        rows.append({"case": "print, no namespaces", **time_calls(sandbox, PRINT, args.calls, args.warmup)})
    rows.append({"case": "cold start (1 worker)", **time_cold_starts(args.cold_starts, isolate=True)})
    rows.append({"case": "cold start, no namespaces", **time_cold_starts(args.cold_starts, isolate=False)})
    load_after = os.getloadavg()

    print(f"python sandbox latency, ms ({args.calls:,} warm calls after {args.warmup} warm-up; "
          f"{args.cold_starts} cold starts); isolation: {isolation.method}")  # fmt: skip
    print(f"{'case':<28}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}")
    for row in rows:
        print(f"{row['case']:<28}" + "".join(f"{row[q]:>8.2f}" for q in ("p50", "p90", "p99", "max")))
    verdict = "met" if rows[0]["p50"] <= GOAL_P50_MS else "NOT met"
    print(f"goal: warm p50 <= {GOAL_P50_MS:g} ms: {verdict}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    report = {"calls": args.calls, "goal_p50_ms": GOAL_P50_MS, "isolation": isolation.__dict__, "machine": machine, "rows": rows}
    write_result(out, report)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
