"""The whole-value functions of policy conditions (gate/values.py) on long text: is each linear?

Every function a condition may call (`VALUE_FUNCTIONS`) is timed on ordinary text and on
text built to make a backtracking pattern or a parser slow (long runs of `a.a.`, `a@a@`,
`www.www.`, digits with separators, quote marks that never close, thousands of web
addresses and host names), at 1 kB, 20 kB and 256 KiB (the MCP proxy's cap on a call's
arguments), on one CPU, caches cleared before each call. Then the decision the shipped
Slack policy makes on a message carrying that text (`no-unknown-links` reads every web
address and host in it). A linear function takes about 256 times its 1 kB time at 256 KiB;
the report gives that ratio for each.

    PYTHONPATH=src python bench/value_functions.py [--sizes 1000 20000 262144] [--out PATH]

Writes bench/results/value_functions.json.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolpolicy.gate import Ledger, Policy, values
from toolpolicy.gate.values import VALUE_FUNCTIONS
from toolpolicy.types import ToolCall

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "value_functions.json"
SIZES = (1000, 20_000, 256 * 1024)
ORDINARY = (
    "Hi Alice, the summary is posted at www.our-company.com/news and the report went to "
    "bob.smith@bluesparrowtech.com on 2024-05-14; the 12 500 figure is final. Thanks! "
)
TEXTS: dict[str, Callable[[int], str]] = {
    "ordinary": lambda n: ORDINARY * (n // len(ORDINARY) + 1),
    "a.a.a.": lambda n: "a." * n,
    "a@a@a@": lambda n: "a@" * n,
    "www.www.": lambda n: "www." * n,
    "digits 1-1-1-": lambda n: "1-" * n,
    "digits 1,1.1 ": lambda n: "1,1.1 " * n,
    "open quotes \u201ca\u201ca": lambda n: "\u201ca" * n,
    "web addresses x.co/a@b.c,": lambda n: "x.co/a@b.c, " * n,
    "schemes https://https://": lambda n: "https://" * n,
    "distinct hosts": lambda n: " ".join(f"h{i}.example.co" for i in range(n // 10 + 1)),
    "e-mail addresses": lambda n: " ".join(f"u{i}@h{i}.co" for i in range(n // 8 + 1)),
}
VALUE = {"mentions": "www.our-company.com/news", "reveals": "1j1l-2k3j"}
"""The second argument of the functions that take one."""
PHRASE = "a.a.a.a.a.a.a.a.a.a.a.b"
"""A phrase that begins as several of the texts do over and over (a search from every
position of them would be quadratic)."""
SLACK_FACTS = {
    "request": "Post the summary to www.our-company.com/news.", "trusted": ["Alice", "general"], "private": [],
    "links": ["www.our-company.com/news", "https://www.informations.com"], "contacts": {},
}


KEPT = ("_public_suffixes", "_format_characters")
"""Loaded once per process, not per input: the Public Suffix List, the format characters."""


def clear_caches() -> None:
    for name, item in vars(values).items():
        if hasattr(item, "cache_clear") and name not in KEPT:
            item.cache_clear()


def seconds(call: Callable[[], Any], repeat: int) -> float:
    """The fastest of `repeat` cold runs of `call`."""
    best = float("inf")
    for _ in range(repeat):
        clear_caches()
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def slack_gate() -> Any:
    from toolpolicy.envs.agentdojo.replay import suite_gates

    _, enforcing, _ = suite_gates("slack", Policy.load(ROOT / "examples" / "policies" / "agentdojo" / "slack.yaml"))
    return enforcing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one CPU
    gate = slack_gate()
    rows = []
    for kind, make in TEXTS.items():
        for size in args.sizes:
            text = make(size)[:size]
            repeat = 3 if size <= 20_000 else 1
            row: dict[str, Any] = {"text": kind, "chars": size}
            for name, function in VALUE_FUNCTIONS.items():
                call = (lambda f=function: f(text, VALUE[name])) if name in VALUE else (lambda f=function: f(text))
                row[name] = round(seconds(call, repeat) * 1000, 3)
            row["mentions (a phrase)"] = round(seconds(lambda: values.mentions(text, PHRASE), repeat) * 1000, 3)
            message = ToolCall("send_channel_message", {"channel": "general", "body": text})
            row["slack decision"] = round(seconds(lambda: gate.decide(message, Ledger(facts=dict(SLACK_FACTS))), repeat) * 1000, 3)
            rows.append(row)
            slowest = max((k for k in row if k not in ("text", "chars")), key=lambda k: row[k])
            print(f"{kind:28s} {size:7d} chars  slowest {slowest} {row[slowest]:9.2f} ms  decision {row['slack decision']:9.2f} ms", flush=True)
    worst = {
        name: max((r for r in rows if r["chars"] == max(args.sizes)), key=lambda r: r[name])
        for name in [*VALUE_FUNCTIONS, "mentions (a phrase)", "slack decision"]
    }
    report = {
        "unit": "milliseconds, fastest of 3 cold runs (1 at 256 KiB), one CPU",
        "rows": rows,
        "worst_at_largest": {name: {"text": row["text"], "ms": row[name]} for name, row in worst.items()},
    }
    write_result(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
