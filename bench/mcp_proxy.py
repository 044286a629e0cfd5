"""MCP policy proxy overhead per tool call, versus calling the server directly.

The client is the `mcp` SDK's own (stdio_client + ClientSession); the server is the
test fixture (tests/fixtures/mcp_server.py) and the call is `add`, so the server's
own work is negligible and the difference between rows is what the proxy costs.

- direct:              client -> server
- proxy:               client -> `toolpolicy gate serve` -> server, audit log fsynced
                       per record (the default: a decision survives power loss)
- proxy, no fsync:     the same with --no-fsync (the record is written, not fsynced)
- proxy, recheck:      --no-fsync --recheck-seconds 0: the upstream tools are listed
                       again before every call (pins checked per call)

Each row: one session, `--warmup` calls, then `--calls` timed calls, one at a time.

    .venv/bin/python bench/mcp_proxy.py             # table + bench/results/mcp_proxy.json
    .venv/bin/python bench/mcp_proxy.py --calls 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "mcp_server.py"
POLICY = "default: deny\nrules:\n  - {id: arithmetic, effect: permit, tools: [add]}\nredact: ['AKIA[0-9A-Z]{16}']\n"
MODES: dict[str, list[str] | None] = {
    "direct": None,
    "proxy": [],
    "proxy, no fsync": ["--no-fsync"],
    "proxy, recheck": ["--no-fsync", "--recheck-seconds", "0"],
}


def server_params(mode_flags: list[str] | None, folder: Path) -> StdioServerParameters:
    """The command the client starts: the fixture itself, or the proxy in front of it."""
    upstream = [str(FIXTURE), str(folder)]
    if mode_flags is None:
        return StdioServerParameters(command=sys.executable, args=upstream)
    policy = folder / "policy.yaml"
    policy.write_text(POLICY)
    audit = folder / f"audit-{len(list(folder.glob('audit-*.jsonl')))}.jsonl"
    proxy = ["-m", "toolpolicy.cli", "gate", "serve", "--policy", str(policy), "--audit", str(audit), *mode_flags]
    # The SDK starts servers with a minimal environment; the proxy must import this checkout.
    return StdioServerParameters(command=sys.executable, args=[*proxy, "--", sys.executable, *upstream], env=dict(os.environ))


async def time_calls(params: StdioServerParameters, calls: int, warmup: int) -> list[int]:
    """Nanoseconds per `add` call, one call at a time, after `warmup` calls."""
    samples = []
    clock = time.perf_counter_ns
    async with stdio_client(params) as streams, ClientSession(*streams) as session:
        await session.initialize()
        for k in range(warmup + calls):
            start = clock()
            result = await session.call_tool("add", {"a": k, "b": 1})
            elapsed = clock() - start
            if result.is_error:
                raise AssertionError(f"benchmark call failed: {result.content}")
            if k >= warmup:
                samples.append(elapsed)
    return samples


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """p50/p90/p99/mean in milliseconds."""
    ordered = sorted(samples_ns)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "mean": sum(ordered) / len(ordered) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "mcp_proxy.json"))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for mode, flags in MODES.items():
            samples = anyio.run(time_calls, server_params(flags, Path(folder)), args.calls, args.warmup)
            rows.append({"mode": mode, **percentiles(samples)})
    direct = rows[0]
    for row in rows:
        row["overhead_p50"] = row["p50"] - direct["p50"]
        row["overhead_p99"] = row["p99"] - direct["p99"]
    print(f"MCP tools/call latency, milliseconds ({args.calls} calls after {args.warmup} warm-up, one at a time)")
    print(f"{'mode':<18}{'p50':>8}{'p90':>8}{'p99':>8}{'mean':>8}{'+p50':>8}{'+p99':>8}")
    for row in rows:
        values = (row["p50"], row["p90"], row["p99"], row["mean"], row["overhead_p50"], row["overhead_p99"])
        print(f"{row['mode']:<18}" + "".join(f"{value:>8.2f}" for value in values))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, {"calls": args.calls, "warmup": args.warmup, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
