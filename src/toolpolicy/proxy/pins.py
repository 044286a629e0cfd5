"""Tool definition pins: rug-pull protection for MCP tools (trust on first use, as in ETDI).

An MCP server's tool definitions and its `instructions` go straight into the model's
context, so a server that changes one after it was reviewed ("rug pull"), or offers a
new tool in the middle of a session, can instruct the model to do anything. The pins
record, per tool, the SHA-256 of the canonical JSON of everything a client sees about
it (description, title, input and output schemas, annotations, `_meta`, icons: the
whole definition but its name), and the same for the server's instructions.

- Tools listed when the proxy starts and never seen before are pinned (trust on first
  use), unless the proxy runs with `require_approval`.
- A tool that appears later, or whose definition differs from its pin, is *awaiting
  approval*: its definition is recorded as pending, and the proxy neither shows the
  new definition nor runs the tool until an operator has reviewed it
  (`toolpolicy gate approve --pins FILE` shows each pending definition and its SHA-256) and
  approved that very definition by its digest (`toolpolicy gate approve --pins FILE
  TOOL@SHA256`). An approval names what was reviewed, not what the server shows at the
  moment of approving: a definition swapped after the review has another digest, and the
  approval is refused, naming both.
- Changed instructions are held back the same way: the client gets the approved text.

The pins file is JSON:

    {"version": 2,
     "tools": {"add": {
        "sha256": "...", "first_seen": "2026-11-30T14:00:00.000000Z", "approved": "...",
        "definition": {"description": "...", "inputSchema": {...}, ...},
        "pending": {"sha256": "...", "seen": "...", "definition": {...}}   # only while awaiting approval
     }},
     "server": {"instructions": {... the same fields, definition {"instructions": "..."} ...}}}

A tool that was never approved has `first_seen` and `pending` only. Version 1 files
(description and input schema pinned) are read and upgraded: an entry whose description
and schema still match is re-pinned with the full definition, otherwise it is changed.

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
from typing import Any, Literal

import mcp_types as types

from toolpolicy.gate.digest import canonical_json, sha256_hex

try:
    import fcntl
except ImportError:  # Windows: no advisory lock; run one writer at a time
    fcntl = None  # type: ignore[assignment]

PINS_VERSION = 2
READABLE_VERSIONS = (1, 2)
Section = Literal["tools", "server"]
INSTRUCTIONS = "instructions"
"""The name of the server's instructions in the "server" section."""
LEGACY_FIELDS = ("description", "inputSchema")
"""What a version 1 pin holds."""


class PinsError(ValueError):
    """A pins file that cannot be read, or an approval that cannot be made."""


def tool_definition(tool: types.Tool) -> dict[str, Any]:
    """The pinned part of a tool: everything a client sees about it but its name."""
    shown = tool.model_dump(by_alias=True, exclude_none=True, mode="json")
    shown.pop("name", None)
    return shown


def instructions_definition(text: str | None) -> dict[str, Any]:
    """The pinned form of a server's instructions."""
    return {INSTRUCTIONS: text or ""}


def definition_hash(pinned: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a pinned definition."""
    return sha256_hex(canonical_json(dict(pinned)))


@dataclass(frozen=True)
class Approval:
    """One approved change: the definition before (None: a new tool), the one now approved
    and its digest (`definition_hash`), by which an operator approves it."""

    section: Section
    name: str
    before: dict[str, Any] | None
    after: dict[str, Any]
    digest: str = ""

    def describe(self, status: str) -> str:
        """The change field by field, so the operator sees what they accept, and its digest."""
        what = "server instructions" if self.section == "server" else f"tool {self.name}"
        kind = "new" if self.before is None else "changed"
        lines = [f"{what}: {kind}, {status}", f"  sha256: {self.digest}"]
        before = self.before or {}
        for field in sorted(set(before) | set(self.after)):
            was, now = before.get(field), self.after.get(field)
            if was == now:
                continue
            if self.before is not None:
                lines.append(f"  {field} was: {_shown(was)}")
            lines.append(f"  {field} now: {_shown(now)}")
        return "\n".join(lines)


def reconcile(
    pins: dict[str, Any], seen: Mapping[str, dict[str, Any]], now: str, trust_new: bool
) -> tuple[set[str], bool]:
    """Compare what a server offers (`seen`: name -> definition) with `pins`, in place.

    A name never seen before is pinned when `trust_new`, else recorded as pending. A
    name whose definition differs from its approved one, or that was never approved,
    is awaiting approval (its definition recorded as pending). Returns the names
    awaiting approval and whether `pins` was modified.
    """
    awaiting: set[str] = set()
    modified = False
    for name, current in seen.items():
        digest = definition_hash(current)
        entry = pins.get(name)
        if entry is None and trust_new:
            pins[name] = {"sha256": digest, "first_seen": now, "approved": now, "definition": current}
            modified = True
            continue
        if entry is None:
            entry = pins[name] = {"first_seen": now}
            modified = True
        if entry.get("legacy") and _legacy_part(current) == entry["definition"]:
            entry.update(sha256=digest, definition=current)  # the fields version 1 did not pin: first use
            del entry["legacy"]
            modified = True
        if entry.get("sha256") == digest:
            if "pending" in entry:  # the server went back to the approved definition
                del entry["pending"]
                modified = True
            continue
        awaiting.add(name)
        pending = entry.get("pending")
        if pending is None or pending.get("sha256") != digest:
            entry["pending"] = {"sha256": digest, "seen": now, "definition": current}
            modified = True
    return awaiting, modified


def _legacy_part(current: Mapping[str, Any]) -> dict[str, Any]:
    return {"description": current.get("description") or "", "inputSchema": current.get("inputSchema", {})}


class PinStore:
    """The pins file of one upstream server."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._loaded_mtime: int | None = None

    def check(self, section: Section, seen: Mapping[str, dict[str, Any]], trust_new: bool) -> tuple[set[str], dict[str, Any]]:
        """Pin or hold what the server offers in `section` (see `reconcile`); returns the
        names awaiting approval and the section's pins as now stored."""
        with self._locked():
            pins = self._read()
            awaiting, modified = reconcile(pins[section], seen, _now(), trust_new)
            if modified:
                self._write(pins)
            self._loaded_mtime = self._mtime()
        return awaiting, pins[section]

    def approve(self, tools: Mapping[str, str], instructions: str | None = None) -> list[Approval]:
        """Make the pending definitions the operator reviewed the approved ones: `tools` maps each
        tool name to the SHA-256 of the definition reviewed (as `pending` shows it), `instructions`
        is that of the server's instructions. All or nothing, under the pins file's lock: PinsError
        for a name with nothing pending, or whose pending definition has another digest (it
        changed after the review), naming both digests."""
        chosen = [("tools", name, digest) for name, digest in tools.items()]
        if instructions is not None:
            chosen.append(("server", INSTRUCTIONS, instructions))
        with self._locked():
            pins = self._read()
            waiting = {section: sorted(n for n, e in pins[section].items() if "pending" in e) for section in pins}
            absent = [name for section, name, _ in chosen if name not in waiting[section]]
            if absent:
                known = ", ".join(waiting["tools"] + [f"(server {n})" for n in waiting["server"]]) or "none"
                raise PinsError(f"nothing awaits approval for {', '.join(absent)} (awaiting: {known})")
            changed = [
                f"{name}: the pending definition's digest is {pins[section][name]['pending']['sha256']}, not {digest}"
                for section, name, digest in chosen
                if pins[section][name]["pending"].get("sha256") != digest.strip().lower()
            ]
            if changed:
                raise PinsError(
                    "not approved: " + "; ".join(changed) + ". The definition changed after the review, or the digest is "
                    f"mistyped: review it again with `toolpolicy gate approve --pins {self.path}`"
                )
            now = _now()
            approvals = [_approve(section, name, pins[section][name], now) for section, name, _ in chosen]
            if approvals:
                self._write(pins)
        return approvals

    def pending(self) -> list[Approval]:
        """What awaits approval, as the approvals `approve` would make."""
        pins = self._read()
        return [
            Approval(section, name, entry.get("definition"), entry["pending"]["definition"], entry["pending"]["sha256"])
            for section in ("server", "tools")
            for name, entry in sorted(pins[section].items())
            if "pending" in entry
        ]

    def approved(self, section: Section) -> set[str]:
        """The names in `section` that have an approved definition."""
        return {name for name, entry in self._read()[section].items() if "definition" in entry}

    def modified_on_disk(self) -> bool:
        """True when the file changed since this store last read it (e.g. an approval)."""
        return self._mtime() != self._loaded_mtime

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"tools": {}, "server": {}}
        except OSError as error:
            raise PinsError(f"{self.path}: cannot read the pins file: {error.strerror or error}") from None
        try:
            data = json.loads(text)
            version, tools, server = data.get("version"), data["tools"], data.get("server", {})
            if version not in READABLE_VERSIONS or not isinstance(tools, dict) or not isinstance(server, dict):
                raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError):
            raise PinsError(f"{self.path}: not a pins file (expected {{\"version\": 2, \"tools\": {{...}}}})") from None
        if version == 1:
            for entry in tools.values():
                entry["legacy"] = True
        return {"tools": tools, "server": server}

    def _write(self, pins: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps({"version": PINS_VERSION, **pins}, indent=2, sort_keys=True) + "\n")
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


def _approve(section: Section, name: str, entry: dict[str, Any], now: str) -> Approval:
    """Make `entry`'s pending definition its approved one, in place."""
    new = entry.pop("pending")
    approval = Approval(section, name, entry.get("definition"), new["definition"], new["sha256"])
    entry.pop("legacy", None)
    entry.update(sha256=new["sha256"], approved=now, definition=new["definition"])
    return approval


def _shown(value: Any) -> str:
    """A pinned field as one line of JSON (escapes make invisible characters visible)."""
    return "(absent)" if value is None else json.dumps(value, sort_keys=True, ensure_ascii=True)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")
