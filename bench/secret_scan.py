"""How long finding a secret takes, at sizes up to the proxy's request cap (256 KiB).

Times `reveals(text, secret)` (the gate's check, gate/canonical.py) and the proxy's check of
one result (`passed_on`: redaction, every assembled reading in every spelling) on ordinary
text and on texts built to cost the most: hex of hex of hex (every layer decodes and
doubles the work), 4-character base64 groups, look-alike letters and invisible characters
between every character (every character goes through the Unicode tables), escapes nested
in escapes. Each figure is the median of `--repeats` runs.

    .venv/bin/python bench/secret_scan.py           # table + bench/results/secret_scan.json
"""

from __future__ import annotations

import argparse
import base64
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import mcp_types

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from result_file import write_result  # noqa: E402  (bench/ is on the path of a script run from it)

from toolpolicy.gate import Decision, Policy  # noqa: E402
from toolpolicy.gate.canonical import reveals  # noqa: E402
from toolpolicy.proxy.results import passed_on  # noqa: E402

SIZES = {"1 kB": 1000, "20 kB": 20_000, "256 KiB": 256 * 1024}
WORDS = ("the meeting is moved to thursday please bring quarterly figures draft agenda room budget review "
         "customer invoice sent paid order shipped tracking number account balance transfer").split()
POLICY = Policy.from_yaml("default: allow\nredact: ['internal-[0-9a-f]{32}']\n")


def prose(size: int) -> str:
    rng = random.Random(0)
    words: list[str] = []
    while sum(map(len, words)) + len(words) < size:
        words.append(rng.choice(WORDS) + ("." if rng.random() < 0.08 else ""))
    return " ".join(words)[:size]


def json_log(size: int) -> str:
    rng = random.Random(1)
    lines: list[str] = []
    while sum(map(len, lines)) < size:
        lines.append(f'{{"ts": "2024-05-{rng.randint(1, 28):02d}T10:00:00Z", "status": 200, "bytes": {rng.randint(100, 99999)}, '
                     f'"path": "/api/v1/items?page={rng.randint(1, 9)}", "id": "{rng.getrandbits(64):016x}"}}')
    return "\n".join(lines)[:size]


def nested_hex(size: int) -> str:
    text = "x"
    while len(text) * 2 <= size:
        text = text.encode().hex()
    return (text * (size // len(text) + 1))[:size]


def base64_groups(size: int) -> str:
    encoded = base64.b64encode(prose(size).encode()).decode()
    return " ".join(encoded[i : i + 4] for i in range(0, len(encoded), 4))[:size]


def look_alikes(size: int) -> str:
    rng = random.Random(2)
    pool = "\u0430\u0435\u043e\u0440\u0441\u0397\u039a\u13aa\U0001d400\u4e00\u0663"
    return "".join(rng.choice(pool) + "\u034f" for _ in range(size // 2))[:size]


def nested_escapes(size: int) -> str:
    return ("%25252541&amp;amp;#65;\\u0041=41" * (size // 31 + 1))[:size]


TEXTS: dict[str, Callable[[int], str]] = {
    "prose": prose, "JSON log": json_log,
    "hex of hex": nested_hex, "base64 in groups": base64_groups, "look-alikes and invisibles": look_alikes,
    "nested escapes": nested_escapes,
}


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "secret_scan.json")
    args = parser.parse_args()
    reveals("warm up the Unicode tables: \u0397\u4e00\u034f", "HGK137803")
    rows = []
    decision = Decision("allow", ("bench",))
    for kind, make in TEXTS.items():
        for size_name, size in SIZES.items():
            text = make(size)
            result = mcp_types.CallToolResult.model_validate({"content": [{"type": "text", "text": text}]})
            reveal_s = median_seconds(lambda: reveals(text, "HGK137803"), args.repeats)
            proxy_s = median_seconds(lambda: passed_on(result, POLICY.redact, decision, max_bytes=1 << 20), args.repeats)
            rows.append({"text": kind, "size": size_name, "chars": len(text), "reveals_ms": round(reveal_s * 1e3, 2),
                         "proxy_result_ms": round(proxy_s * 1e3, 2)})
            print(f"{kind:28s} {size_name:8s} reveals {reveal_s * 1e3:9.2f} ms   proxy result {proxy_s * 1e3:9.2f} ms", flush=True)
    write_result(args.out, {"repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
