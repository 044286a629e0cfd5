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
from pathlib import Path
from typing import Any

from toolpolicy.atomic import replace_file
from toolpolicy.gate import AuditLog, Ledger


def ledger_file(audit_path: str | Path) -> Path:
    return Path(f"{audit_path}.ledger.json")


def save_ledger(path: Path, ledger: Ledger, audit: AuditLog) -> None:
    """Write `ledger` with the audit log's end as its stamp, atomically, mode 0600."""
    body = {"log_id": audit.log_id, "seq": audit.last_seq, "hash": audit.last_hash, "ledger": ledger.state()}
    replace_file(path, json.dumps(body, separators=(",", ":")), private=True)


def restored_ledger(path: Path, audit: AuditLog) -> tuple[Ledger, str | None]:
    """The ledger the proxy had when it stopped, brought up to the audit log's end; and, when
    it had to be counted from the log alone, the sentence that says so."""
    saved = _saved(path)
    if saved is not None and _stamped_at_end(saved, audit):
        try:  # the usual start: the last stop saved the ledger after the log's last record
            return Ledger.from_state(saved["ledger"]), None
        except (KeyError, TypeError, ValueError):
            pass
    records = _records(audit.path)
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


def _stamped_at_end(saved: dict[str, Any], audit: AuditLog) -> bool:
    """Whether `saved` was written when the audit log ended where it ends now (its head says
    where), so no record of the log is left to count in."""
    return {key: saved.get(key) for key in ("log_id", "seq", "hash")} == audit.state()


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
