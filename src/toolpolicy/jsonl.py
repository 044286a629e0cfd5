"""JSON Lines files (one JSON object per line), read with errors that name the file and the line.

Run logs, BFCL question and answer files and search corpora are all JSONL; they
share this reader so that a broken line reads the same everywhere:
`runs/demo/metrics.jsonl:12: not valid JSON (Expecting value at column 50)`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def read_objects(path: Path, error: type[Exception]) -> Iterator[tuple[str, dict[str, Any]]]:
    """("path:line", object) for each non-blank line of `path`, in order.

    A line that is not valid JSON, or not a JSON object, raises `error` with its
    location. The caller checks that the file exists, with its own message.
    """
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            # Without its line end: a line cut short is then reported where it stops, not at
            # "column 1" of a line after it.
            yield where, json_object(json_value(line.rstrip("\r\n"), where, error), where, error)


def json_value(text: str, where: str, error: type[Exception]) -> Any:
    """`text` parsed as JSON; `error` names `where` and the parser's complaint if it is not."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None


def json_object(value: Any, where: str, error: type[Exception]) -> dict[str, Any]:
    """`value` if it is a JSON object; else `error` saying what `where` held instead."""
    if not isinstance(value, dict):
        raise error(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value
