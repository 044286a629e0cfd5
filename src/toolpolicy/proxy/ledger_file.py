"""The proxy's ledger across restarts: kept beside the audit log, signed with it, rebuilt from it when it must be.

An MCP host restarts the servers it runs whenever it likes, and a ledger that started empty
each time would reset `max_calls`, `max_denials`, lockdown after a denial and `denied_before`
with it. So after every call the proxy writes its ledger to `<audit log>.ledger.json`,
stamped with where the audit log then ended (its id, seq and hash). When the audit log is
signed, the file is signed with the same key (`sig`, over the stamp and the ledger, under
LEDGER_DOMAIN), so whoever can write the file but does not hold the key cannot change a count
without the proxy refusing to start and `toolpolicy audit verify --public-key` failing.

On start:

- a ledger that does not verify (a signed log's ledger with a missing or wrong signature; a
  file that is not a ledger; a field of the wrong type or a negative count): the proxy refuses
  to start (LedgerFileError), saying to move the file aside or start a new log;
- a stamp that is a record of this log: the saved ledger, and every decision the log holds
  after it counted in (`Ledger.recount`: a proxy killed between a decision and the save, or
  an older copy of the file put back);
- no file, or a stamp of another log or of a record the log does not hold (deleted, or the
  log replaced): a ledger counted from the whole log. The log keeps no arguments, outcomes
  or facts, so `history`, `state` and runs of errors start empty; counts, denials and
  `denied_before` are whole. The proxy says so on stderr.

So deleting the file, or putting back an older one, cannot lower a count below what the
audit log holds; what it can lose is what only the file holds (facts, history, runs of errors).

The file holds the arguments of the last calls (the history window) and the facts tools
reported, so it is written readable by its owner only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from toolpolicy.atomic import replace_file
from toolpolicy.gate import AuditError, AuditLog, Ledger
from toolpolicy.gate.audit import domain_signature_valid
from toolpolicy.gate.digest import canonical_json

LEDGER_DOMAIN = "toolpolicy-ledger"
"""The first line of what a ledger file's signature signs (see `AuditLog.sign`)."""
STAMP = ("log_id", "seq", "hash")
UNKNOWN_TOOL = "gate:unknown_tool"


class LedgerFileError(AuditError):
    """A ledger file the proxy must not start on (it is part of what the audit log vouches for)."""


def ledger_file(audit_path: str | Path) -> Path:
    return Path(f"{audit_path}.ledger.json")


def signed_body(saved: Mapping[str, Any]) -> bytes:
    """The bytes a ledger file's signature signs: the canonical JSON of its stamp and ledger."""
    return canonical_json({key: saved.get(key) for key in (*STAMP, "ledger")}).encode("utf-8")


def save_ledger(path: Path, ledger: Ledger, audit: AuditLog) -> None:
    """Write `ledger` with the audit log's end as its stamp, signed with the log's key if it
    has one, atomically, mode 0600."""
    body: dict[str, Any] = {"log_id": audit.log_id, "seq": audit.last_seq, "hash": audit.last_hash, "ledger": ledger.state()}
    signature = audit.sign(LEDGER_DOMAIN, signed_body(body))
    if signature is not None:
        body["sig"] = signature
    replace_file(path, json.dumps(body, separators=(",", ":")), private=True)


def restored_ledger(path: Path, audit: AuditLog) -> tuple[Ledger, str | None]:
    """The ledger the proxy had when it stopped, brought up to the audit log's end; and, when
    it had to be counted from the log alone (or in part), the sentence that says so.
    LedgerFileError for a file that does not verify (see the module docstring)."""
    saved = _saved(path)
    if saved is not None:
        problem = ledger_problem(saved, audit.signed, lambda body, sig: audit.signature_valid(LEDGER_DOMAIN, body, sig))
        if problem is not None:
            raise LedgerFileError(
                f"{path}: the saved ledger does not verify ({problem}): it was changed, or is not this proxy's. "
                f"Move it aside to count calls and denials from the audit log {audit.path} (the call history and facts "
                "then start empty), or start a new audit log"
            )
    if saved is not None and _stamped_at_end(saved, audit):  # the usual start: saved after the log's last record
        return Ledger.from_state(saved["ledger"]), None
    records = _records(audit.path)
    stamp = saved.get("seq") if saved else None
    known = (
        saved is not None and saved.get("log_id") == audit.log_id and isinstance(stamp, int) and 0 <= stamp <= len(records)
        and (stamp == 0 or records[stamp - 1].get("hash") == saved.get("hash"))
    )  # fmt: skip
    note = None
    if known:
        assert saved is not None and isinstance(stamp, int)
        ledger, later = Ledger.from_state(saved["ledger"]), records[stamp:]
        if later:
            note = (
                f"the ledger in {path} was saved at seq {stamp}, the audit log ends at seq {len(records)}: counted the "
                f"{len(later)} later decision{'s' if len(later) > 1 else ''} from {audit.path} (a proxy stopped before saving, "
                "or an older ledger was put back; the facts and the call history are those of the save)"
            )
    else:
        ledger, later = Ledger(), records
        if records:
            why = "there was none" if saved is None else "it does not belong to this log"
            note = (
                f"the ledger in {path} was not used ({why}): counted {len(records)} decisions from {audit.path}; "
                "calls, denials and repeated denied calls carry over, the call history and facts start empty"
            )
    for record in later:
        ledger.recount(
            str(record.get("tool")), str(record.get("decision")), str(record.get("args_digest")),
            unknown=UNKNOWN_TOOL in (record.get("rule_ids") or ()),
        )  # fmt: skip
    return ledger, note


def ledger_problem(saved: Mapping[str, Any], signed: bool, valid: Any) -> str | None:
    """What makes `saved` (a ledger file's content) one the proxy must not start on, or None.
    `signed`: the audit log is signed, so the file must be too; `valid(body, sig)` checks a
    signature with the log's key."""
    if signed and "sig" not in saved:
        return "it is not signed, but the audit log is"
    if "sig" in saved and not (signed and valid(signed_body(saved), saved["sig"])):
        return "its signature does not verify with the audit log's key" if signed else "it is signed, but the audit log is not"
    return state_problem(saved)


def state_problem(saved: Mapping[str, Any]) -> str | None:
    """Whether the stamp and the ledger have the shape `save_ledger` writes: every field present
    and of its type, every count a whole number not below zero. Checked on a signed file too, so
    a bug can never start the proxy on a ledger it would misread."""
    if not isinstance(saved.get("log_id"), str) or type(saved.get("seq")) is not int or not isinstance(saved.get("hash"), str):
        return "its stamp (log_id, seq, hash) is missing or of the wrong type"
    state = saved.get("ledger")
    if not isinstance(state, dict):
        return "it holds no ledger"
    for table in ("counts", "denials", "consecutive_errors"):
        counts = state.get(table)
        if not isinstance(counts, dict) or not all(isinstance(k, str) and _count(v) for k, v in counts.items()):
            return f"ledger.{table} is not a map of tool names to counts"
    for total in ("total_calls", "total_attempts", "total_denials"):
        if not _count(state.get(total)):
            return f"ledger.{total} is not a count"
    if not isinstance(state.get("facts"), dict) or not isinstance(state.get("history"), list):
        return "ledger.facts or ledger.history is missing"
    denied = state.get("denied")
    if not isinstance(denied, list) or not all(isinstance(d, str) and len(d) == 32 for d in denied):
        return "ledger.denied is not a list of call digests"
    try:
        Ledger.from_state(state)
    except (KeyError, TypeError, ValueError) as error:
        return f"the ledger cannot be read ({type(error).__name__})"
    return None


def ledger_file_report(log: Path, public_key: Ed25519PublicKey | None) -> tuple[list[str], list[str]]:
    """Problems and warnings about the ledger file beside the audit log `log` (none when there is
    no file), for `toolpolicy audit verify`: its signature (with `public_key`; a signed log's
    ledger must be signed), its shape, and its stamp, which must be a record of the log."""
    path = ledger_file(log)
    if not path.exists():
        return [], []
    saved = _saved(path) or {}
    records = _records(log) if log.exists() else []
    signed = bool(records) and "sig" in records[-1]
    if public_key is not None:
        problem = ledger_problem(saved, True, lambda body, sig: domain_signature_valid(public_key, LEDGER_DOMAIN, body, sig))
    else:
        problem = "it is not signed, but the audit log is" if signed and "sig" not in saved else state_problem(saved)
    if problem is not None:
        return [f"{path.name}: {problem}"], []
    stamp, head_id = saved["seq"], records[0].get("log_id") if records else None
    if head_id is not None and saved["log_id"] != head_id:
        return [], [f"{path.name} belongs to log {saved['log_id']!r}: the proxy will count this log's ledger from its records"]
    if stamp > len(records) or (stamp and records[stamp - 1].get("hash") != saved["hash"]):
        return [], [f"{path.name} is stamped at seq {stamp}, which this log does not hold: the proxy will count from the records"]
    if stamp < len(records):
        return [], [
            f"{path.name} was saved at seq {stamp}, the log ends at seq {len(records)}: the proxy counts the later decisions "
            "from the log (a proxy stopped before saving, or an older ledger put back; facts and history are those of the save)"
        ]
    return [], []


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _stamped_at_end(saved: dict[str, Any], audit: AuditLog) -> bool:
    """Whether `saved` was written when the audit log ended where it ends now (its head says
    where), so no record of the log is left to count in."""
    return {key: saved.get(key) for key in STAMP} == audit.state()


def _records(log: Path) -> list[dict[str, Any]]:
    """The audit log's whole records (an unfinished last line is not one)."""
    if not log.exists():
        return []
    with log.open("rb") as lines:
        return [json.loads(line) for line in lines if line.endswith(b"\n")]


def _saved(path: Path) -> dict[str, Any] | None:
    """The file's JSON object; None when there is no file. A file that is there but is not a
    JSON object is kept as {} so that `ledger_problem` refuses it rather than ignoring it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
