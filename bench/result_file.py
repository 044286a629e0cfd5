"""Where every benchmark writes its figures: `write_result` adds the machine they were measured on.

Speed and memory figures hold for one machine: the same step is many times slower in
bfloat16 on a CPU without bfloat16 instructions, so each result file names its CPU and the
flags that decide that (AVX512F, AVX512-BF16, AMX-BF16).
"""

from __future__ import annotations

import json
import os
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any

CPU_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16")


def machine() -> dict[str, Any]:
    """The CPU model, its bfloat16-relevant flags, its cores, and the Python and torch versions."""
    from toolpolicy.model.placement import this_cpu  # here: a driver that only runs benchmarks in subprocesses imports nothing else

    model, flags = this_cpu()
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "cpu_flags": {flag: flag in flags for flag in CPU_FLAGS},
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": version("torch"),
    }


def write_result(path: str | Path, result: Any, indent: int = 2) -> None:
    """`result` as indented JSON at `path`, with this machine's description under "machine"
    (a list of rows is kept under "rows")."""
    body = result if isinstance(result, dict) else {"rows": result}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({**body, "machine": machine()}, indent=indent) + "\n")
