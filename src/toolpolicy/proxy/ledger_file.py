"""The proxy's ledger across restarts: kept beside the audit log, rebuilt from it when it must be.

An MCP host restarts the servers it runs whenever it likes, and a ledger that started empty
each time would reset `max_calls`, `max_denials`, lockdown after a denial and `denied_before`
with it. So after every call the proxy writes its ledger to `<audit log>.ledger.json`,
stamped with where the audit log then ended (its id, seq and hash), and on start:

- a stamp that is a record of this log: the saved ledger, and every decision the log holds
  after it counted in (`Ledger.recount`: a proxy killed between a decision and the save);
- no file, or a stamp of another log or of a record the log does not hold (deleted, or the
  log replaced): a ledger counted from the whole log. The log keeps no arguments, outcomes
  or facts, so `history`, `state` and runs of errors start empty; counts, denials and
  `denied_before` are whole. The proxy says so on stderr.

The file holds the arguments of the last calls (the history window) and the facts tools
reported, so it is written readable by its owner only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from toolpolicy.gate import AuditLog, Ledger


def ledger_file(audit_path: str | Path) -> Path:
    return Path(f"{audit_path}.ledger.json")


def save_ledger(path: Path, ledger: Ledger, audit: AuditLog) -> None:
    """Write `ledger` with the audit log's end as its stamp, atomically, mode 0600."""
    body = {"log_id": audit.log_id, "seq": audit.last_seq, "hash": audit.last_hash, "ledger": ledger.state()}
    temporary = path.with_name(path.name + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        json.dump(body, out, separators=(",", ":"))
    os.replace(temporary, path)


def restored_ledger(path: Path, audit: AuditLog) -> tuple[Ledger, str | None]:
    """The ledger the proxy had when it stopped, brought up to the audit log's end; and, when
    it had to be counted from the log alone, the sentence that says so."""
    records = _records(audit.path)
    saved = _saved(path)
    stamp = saved.get("seq") if saved else None
    known = (
        saved is not None and saved.get("log_id") == audit.log_id and isinstance(stamp, int) and 0 <= stamp <= len(records)
        and (stamp == 0 or records[stamp - 1].get("hash") == saved.get("hash"))
    )  # fmt: skip
    note = None
    if known:
        try:
            ledger, later = Ledger.from_state(saved["ledger"]), records[stamp:]
        except (KeyError, TypeError, ValueError):
            known = False
    if not known:
        ledger, later = Ledger(), records
        if records:
            why = "there was none" if saved is None else "it does not belong to this log"
            note = (
                f"the ledger in {path} was not used ({why}): counted {len(records)} decisions from {audit.path}; "
                "calls, denials and repeated denied calls carry over, the call history and facts start empty"
            )
    for record in later:
        ledger.recount(str(record.get("tool")), str(record.get("decision")), str(record.get("args_digest")))
    return ledger, note


def _records(log: Path) -> list[dict[str, Any]]:
    """The audit log's whole records (an unfinished last line is not one)."""
    if not log.exists():
        return []
    with log.open("rb") as lines:
        return [json.loads(line) for line in lines if line.endswith(b"\n")]


def _saved(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
