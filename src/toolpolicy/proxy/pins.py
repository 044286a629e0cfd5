"""Tool definition pins: rug-pull protection for MCP tools (trust on first use, as in ETDI).

An MCP server's tool descriptions go straight into the model's context, so a server
that changes a description after it was reviewed ("rug pull") can instruct the model
to do anything. The proxy pins each tool the first time it sees it: the SHA-256 of the
canonical JSON of its description and input schema. When a later listing differs, the
tool is *changed*: the proxy keeps showing the approved definition, denies every call
to the tool, and records the new definition as pending until someone runs
`toolpolicy gate approve --pins FILE TOOL`.

The pins file is JSON, one entry per tool name:

    {"version": 1, "tools": {"add": {
        "sha256": "...", "first_seen": "2026-11-30T14:00:00.000000Z", "approved": "...",
        "definition": {"description": "...", "inputSchema": {...}},
        "pending": {"sha256": "...", "seen": "...", "definition": {...}}   # only while changed
    }}}

Writers (the proxy, `gate approve`) take an exclusive lock on `<pins>.lock`, re-read
the file, change it and replace it atomically, so an approval made while the proxy
runs is never lost; the proxy notices the new file by its modification time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from toolpolicy.gate.digest import canonical_json, sha256_hex

try:
    import fcntl
except ImportError:  # Windows: no advisory lock; run one writer at a time
    fcntl = None  # type: ignore[assignment]

PINS_VERSION = 1


class PinsError(ValueError):
    """A pins file that cannot be read, or an approval that cannot be made."""


def definition(description: str | None, input_schema: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a tool definition that is pinned: what the model reads about the tool."""
    return {"description": description or "", "inputSchema": dict(input_schema)}


def definition_hash(pinned: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a pinned definition."""
    return sha256_hex(canonical_json(dict(pinned)))


@dataclass(frozen=True)
class Approval:
    """One re-approved tool: the definition it had and the one now approved."""

    tool: str
    before: dict[str, Any]
    after: dict[str, Any]


def reconcile(pins: dict[str, Any], seen: Mapping[str, dict[str, Any]], now: str) -> tuple[set[str], bool]:
    """Compare a server's tools (`seen`: name -> definition) with `pins`, in place.

    A tool never seen before is pinned. A tool whose definition differs from its pin is
    changed: its new definition is recorded as pending. Returns the changed tool names
    and whether `pins` was modified.
    """
    changed: set[str] = set()
    modified = False
    for name, current in seen.items():
        digest = definition_hash(current)
        entry = pins.get(name)
        if entry is None:
            pins[name] = {"sha256": digest, "first_seen": now, "approved": now, "definition": current}
            modified = True
        elif entry["sha256"] != digest:
            changed.add(name)
            pending = entry.get("pending")
            if pending is None or pending.get("sha256") != digest:
                entry["pending"] = {"sha256": digest, "seen": now, "definition": current}
                modified = True
        elif "pending" in entry:  # the server went back to the approved definition
            del entry["pending"]
            modified = True
    return changed, modified


class PinStore:
    """The pins file of one upstream server."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._loaded_mtime: int | None = None

    def check(self, seen: Mapping[str, dict[str, Any]]) -> tuple[set[str], dict[str, Any]]:
        """Pin new tools and record changed ones (see `reconcile`); returns the changed
        names and the pins as now stored."""
        with self._locked():
            pins = self._read()
            changed, modified = reconcile(pins, seen, _now())
            if modified:
                self._write(pins)
            self._loaded_mtime = self._mtime()
        return changed, pins

    def approve(self, names: list[str] | None) -> list[Approval]:
        """Make the pending definitions of `names` (None: of every changed tool) the
        approved ones. PinsError for a name with nothing pending."""
        with self._locked():
            pins = self._read()
            pending = sorted(name for name, entry in pins.items() if "pending" in entry)
            chosen = pending if names is None else names
            problems = [name for name in chosen if name not in pending]
            if problems:
                known = ", ".join(pending) or "none"
                raise PinsError(f"no pending definition change for {', '.join(problems)} (changed tools: {known})")
            approvals = []
            now = _now()
            for name in chosen:
                entry = pins[name]
                new = entry.pop("pending")
                approvals.append(Approval(name, entry["definition"], new["definition"]))
                entry.update(sha256=new["sha256"], approved=now, definition=new["definition"])
            if approvals:
                self._write(pins)
        return approvals

    def pending(self) -> dict[str, dict[str, Any]]:
        """Changed tools awaiting approval: name -> {"before", "after"} definitions."""
        pins = self._read()
        return {
            name: {"before": entry["definition"], "after": entry["pending"]["definition"]}
            for name, entry in sorted(pins.items())
            if "pending" in entry
        }

    def modified_on_disk(self) -> bool:
        """True when the file changed since this store last read it (e.g. an approval)."""
        return self._mtime() != self._loaded_mtime

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as error:
            raise PinsError(f"{self.path}: cannot read the pins file: {error.strerror or error}") from None
        try:
            data = json.loads(text)
            tools = data["tools"]
            if data.get("version") != PINS_VERSION or not isinstance(tools, dict):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            raise PinsError(f"{self.path}: not a pins file (expected {{\"version\": 1, \"tools\": {{...}}}})") from None
        return tools

    def _write(self, pins: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps({"version": PINS_VERSION, "tools": pins}, indent=2, sort_keys=True) + "\n")
        os.replace(temporary, self.path)

    def _mtime(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")
