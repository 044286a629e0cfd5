"""The audit log: one append-only, hash-chained JSONL record per gate decision.

Records. Each holds seq (1, 2, ...), log_id, time (UTC, ISO 8601), decision_id,
policy_hash, tool, args_digest (SHA-256 of the canonical arguments: the log proves which
arguments were decided on without storing secrets), decision, rule_ids, reason,
prev_hash and hash. `hash` is the SHA-256 of the canonical JSON of the record without
`hash` and `sig`, and `prev_hash` is the previous record's hash (64 zeros for the
first), so editing, deleting, inserting, duplicating or reordering a record breaks the
chain where it happened.

The log id names one log for its whole life: chosen by the writer, or made at creation
from the start time and 64 random bits. It is inside every record's hashed body and in
the head, so a record copied in from another log is caught, and so is a whole log
swapped for another one signed with the same key, by a verifier that says which id it
expects (`verify(log_id=...)`, `toolpolicy audit verify --log-id`). Verify always
reports the id it checked.

The head. A chain cannot show that records were cut from its end, so every append also
rewrites a sidecar `<log>.head`: log id, last seq, last hash. A durable log replaces the
head file (temporary file, fsync, rename: whole after a power loss); otherwise it is
rewritten in place with one fixed-width `pwrite`, which a killed process cannot tear
and which costs microseconds instead of a rename's millisecond. A log with no head file
fails verification: where it ends cannot be checked.

Signing. With an Ed25519 key each record's hash is signed (`sig`, hex), and so is the
head, over a message that names it as a head (`Head.message`) so that no record's
signature can stand in for it. Then someone who can write the files but does not hold
the key cannot edit, forge, re-chain, reorder or cut records, nor move the head: verify
with the public key catches each. What no signature can show is a rollback: the log and
its head put back to an earlier state that the key really signed. Against that the
verifier keeps what it saw last, a copy of the head file or just its seq, and passes it
(`saved_head`, `expect_at_least`).

Without a key the log has integrity, not authenticity. It catches accidents and edits
that do not rebuild the chain, but whoever can write both files can re-chain edited
records, delete or append records, or cut the end and rewrite the head so that all of
it verifies; every unsigned report says so. A saved head still pins the log up to its
seq, because its hash covers every record before it.

Durability: each record is one `write` to a file opened O_APPEND, then fsync; the head
follows. A process killed between the two leaves the head one record behind, which
`verify` reports as a warning (the record is whole, and signed if the log is) and
reopening repairs. A write that never finished leaves at most one torn last line, which
`verify` reports as such; reopening the log moves the torn bytes to `<log>.torn` and
continues the chain from the last whole record. One process writes a log at a time (an
exclusive lock, where the platform has one); give each rollout worker its own log.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from toolpolicy.atomic import replace_file, write_all
from toolpolicy.gate.digest import ZERO_HASH, args_digest, canonical_json, sha256_hex
from toolpolicy.gate.ledger import clipped_name
from toolpolicy.types import ToolCall

if TYPE_CHECKING:  # decide.py imports this module; the import is for the annotation only
    from toolpolicy.gate.decide import Decision

try:
    import fcntl
except ImportError:  # Windows: no advisory lock; one writer per log is then up to the caller
    fcntl = None  # type: ignore[assignment]

FIELDS = (
    "seq",
    "log_id",
    "time",
    "decision_id",
    "policy_hash",
    "tool",
    "args_digest",
    "decision",
    "rule_ids",
    "reason",
    "prev_hash",
)
MAX_PROBLEMS_SHOWN = 50
LOG_ID_PATTERN = re.compile(r"[A-Za-z0-9._:@+=/-]{1,128}")
HEAD_DOMAIN = "toolpolicy-audit-head"  # first line of a head's signed message (a record's is a bare hash)
HEAD_WIDTH = 512  # bytes: the longest log id, seq, hash and signature fit, padded with spaces
UNSIGNED_CAVEAT = (
    "integrity only, no authenticity: no signatures were checked, so whoever can write the log and its head "
    "could have edited and re-chained records, deleted or appended some, or cut the end and rewritten the head "
    "undetected; sign the log and verify with --public-key"
)


class AuditError(RuntimeError):
    """The audit log cannot be written or opened safely."""


@dataclass(frozen=True)
class Head:
    """The head file: the log's id, its last seq and that record's hash, and for a signed
    log an Ed25519 signature over the three (hex)."""

    log_id: str
    seq: int
    hash: str
    sig: str | None = None

    def signature_problem(self, key: Ed25519PublicKey) -> str | None:
        if self.sig is None:
            return "not signed, but the log is expected to be signed"
        try:
            key.verify(bytes.fromhex(self.sig), head_message(self.log_id, self.seq, self.hash))
        except (ValueError, InvalidSignature):
            return "its signature does not verify with the given public key"
        return None

    def names(self, log_id: str, seq: int, digest: str) -> bool:
        return (self.log_id, self.seq, self.hash) == (log_id, seq, digest)


def head_message(log_id: str, seq: int, digest: str) -> bytes:
    """What a head signature signs. It starts with HEAD_DOMAIN, so it never equals a
    record's hash: a record's signature cannot pass for a head's."""
    return f"{HEAD_DOMAIN}\n{log_id}\n{seq}\n{digest}".encode("utf-8", "replace")


def domain_message(domain: str, body: bytes) -> bytes:
    """What a signature of a file beside the log signs: its domain, a line end, its bytes. A
    record's signed message is a bare hash and a head's starts with HEAD_DOMAIN, so a domain
    other than HEAD_DOMAIN keeps the three apart."""
    if domain == HEAD_DOMAIN or "\n" in domain:
        raise ValueError(f"{domain!r} cannot name what a signature signs")
    return domain.encode("utf-8") + b"\n" + body


def domain_signature_valid(key: Ed25519PublicKey, domain: str, body: bytes, signature: object) -> bool:
    """Whether `signature` (hex) signs `body` under `domain` with `key`."""
    if not isinstance(signature, str):
        return False
    try:
        key.verify(bytes.fromhex(signature), domain_message(domain, body))
    except (ValueError, InvalidSignature):
        return False
    return True


def head_bytes(log_id: str, seq: int, digest: str, key: Ed25519PrivateKey | None) -> bytes:
    """The head file's content, signed with `key` if given, always HEAD_WIDTH bytes so an
    in-place rewrite leaves no stale tail. Formatted directly, not through a dict: this
    runs on every append."""
    signature = "" if key is None else f',"sig":"{key.sign(head_message(log_id, seq, digest)).hex()}"'
    text = f'{{"log_id":{json.dumps(log_id)},"seq":{seq},"hash":{json.dumps(digest)}{signature}}}'
    return (text.ljust(HEAD_WIDTH - 1) + "\n").encode("ascii")


@dataclass(frozen=True)
class VerifyResult:
    """What `verify` found. `ok` is False when any problem was found; warnings do not
    fail verification (a torn last line or a head one record behind, from a killed writer)."""

    ok: bool
    records: int
    problems: tuple[str, ...]
    warnings: tuple[str, ...]
    last_seq: int
    last_hash: str
    torn_tail: bool = False
    signatures_checked: bool = False
    log_id: str | None = None

    def summary(self) -> str:
        verdict = "OK" if self.ok else "FAILED"
        signed = ", signatures checked" if self.signatures_checked else ""
        return f"{verdict}: {self.records} records{signed}, last seq {self.last_seq}, log id {self.log_id or '(unknown)'}"

    def report(self, name: str = "audit log") -> str:
        """Problems, warnings, the summary line and, for a log whose signatures were not
        checked, what that leaves unproven."""
        lines = [f"problem: {text}" for text in self.problems] + [f"warning: {text}" for text in self.warnings]
        lines.append(f"{name}: {self.summary()}")
        if not self.signatures_checked:
            lines.append(f"note: {UNSIGNED_CAVEAT}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


class AuditLog:
    """Appends decision records to a JSONL file, continuing the chain of an existing one.

    Args:
        path: the log file; `<path>.head` and, after a crash, `<path>.torn` sit beside it.
        signing_key: an Ed25519 private key, or the path of its PEM file, to sign every hash
            and the head. A log is signed from its first record to its last, or not at all.
        durable: fsync the record and the head on every append (survives power loss).
            False still writes each record before returning (survives a killed process).
        log_id: the log's id (letters, digits and `._:@+=/-`, at most 128). A new log takes
            it, or a fresh one from `new_log_id` when None; an existing log must have it.
    """

    def __init__(
        self,
        path: str | Path,
        signing_key: str | Path | Ed25519PrivateKey | None = None,
        durable: bool = True,
        log_id: str | None = None,
    ) -> None:
        if log_id is not None and not LOG_ID_PATTERN.fullmatch(log_id):
            raise ValueError(f"log id {log_id!r}: use 1 to 128 letters, digits or ._:@+=/-")
        self.path = Path(path)
        self.head_path = head_path(self.path)
        self.durable = durable
        self._key = load_private_key(signing_key) if isinstance(signing_key, (str, Path)) else signing_key
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._head = -1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists() and read_head(self.head_path) is None:
            # A new log gets its head first, so that a writer killed while creating it leaves
            # a head for 0 records (which verifies), never records or an empty file without one.
            replace_file(self.head_path, head_bytes(log_id or new_log_id(), 0, ZERO_HASH, self._key), durable=durable)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    raise AuditError(f"{self.path}: another process is appending to this audit log") from None
            self._seq, self._prev, self.log_id = self._resume(log_id)
        except BaseException:
            os.close(self._fd)
            raise

    def append(self, decision: Decision, call: ToolCall, policy_hash: str) -> dict[str, Any]:
        """Write one record for `decision` about `call`; returns the record. AuditError if it
        cannot be written, and on every later append (reopen the log to repair it)."""
        with self._lock:
            if self._broken is not None:
                raise AuditError(f"{self.path}: an earlier write failed ({self._broken}); reopen the log")
            record: dict[str, Any] = {
                "seq": self._seq + 1,
                "log_id": self.log_id,
                "time": datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z"),
                "decision_id": decision.decision_id,
                "policy_hash": policy_hash,
                "tool": clipped_name(call.name),
                "args_digest": args_digest(call.arguments),
                "decision": decision.effect,
                "rule_ids": list(decision.rule_ids),
                "reason": decision.reason,
                "prev_hash": self._prev,
            }
            record["hash"] = record_hash(record)
            if self._key is not None:
                record["sig"] = self._key.sign(record["hash"].encode("ascii")).hex()
            line = (json.dumps(record, separators=(",", ":"), ensure_ascii=True) + "\n").encode("ascii")
            head = head_bytes(self.log_id, record["seq"], record["hash"], self._key)
            try:
                write_all(self._fd, line)
                if self.durable:
                    os.fsync(self._fd)
                    replace_file(self.head_path, head, durable=True)
                else:
                    os.pwrite(self._head_fd(), head, 0)
            except OSError as error:
                self._broken = str(error)
                raise AuditError(f"{self.path}: cannot write the audit record: {error}") from error
            self._seq, self._prev = record["seq"], record["hash"]
            return record

    @staticmethod
    def verify(path: str | Path, public_key: str | Path | Ed25519PublicKey | None = None, **pins: Any) -> VerifyResult:
        """Same as the module's `verify`: check a log file (see there)."""
        return verify(path, public_key, **pins)

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def signed(self) -> bool:
        """Whether this log signs its records (and so what else it signs, see `sign`)."""
        return self._key is not None

    def sign(self, domain: str, body: bytes) -> str | None:
        """The Ed25519 signature (hex) of `body` under `domain` with the log's key (None for an
        unsigned log), for files kept beside the log that must be as trustworthy as it, such as
        the proxy's ledger. The domain starts the signed message, so no such signature can pass
        for a record's or the head's (`domain_message`)."""
        return None if self._key is None else self._key.sign(domain_message(domain, body)).hex()

    def signature_valid(self, domain: str, body: bytes, signature: object) -> bool:
        """Whether `signature` is this log's key's signature of `body` under `domain`."""
        return self._key is not None and domain_signature_valid(self._key.public_key(), domain, body, signature)

    def state(self) -> dict[str, Any]:
        """Where the log ends now, for a checkpoint: {"seq", "log_id", "hash"} (plain values).
        `AuditLog.restore(path, state)` cuts the log back to it before a resumed run reopens it."""
        return {"seq": self._seq, "log_id": self.log_id, "hash": self._prev}

    @staticmethod
    def restore(path: str | Path, state: dict[str, Any], signing_key: str | Path | Ed25519PrivateKey | None = None) -> Path | None:
        """Cut the log at `path` back to `state` (from `state()`): the records after it belong
        to steps a resumed run takes again (see `rewind_audit_log`, which this is, checking also
        that the log is the one the state was taken from: its id and the hash at that record).
        Call it while no process has the log open. Returns the `.replayed` file, or None."""
        return rewind_audit_log(path, int(state["seq"]), signing_key, log_id=state.get("log_id"), last_hash=state.get("hash"))

    @property
    def last_hash(self) -> str:
        return self._prev

    def close(self) -> None:
        if self._head >= 0:
            os.close(self._head)
            self._head = -1
        if self._fd >= 0:
            os.close(self._fd)  # also releases the lock
            self._fd = -1

    def _head_fd(self) -> int:
        if self._head < 0:
            self._head = os.open(self.head_path, os.O_WRONLY | os.O_CREAT, 0o644)
        return self._head

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _resume(self, wanted_id: str | None) -> tuple[int, str, str]:
        """(last seq, last hash, log id) of the existing log, after moving a torn tail aside.

        Refuses (AuditError) a log that does not end where its head file says, or whose end
        this writer could not have written, so that a truncated or tampered log is never
        silently extended."""
        size = os.fstat(self._fd).st_size
        last = self._last_record(size) if size else None
        head = read_head(self.head_path)
        problem = _resume_problem(last, head, wanted_id, self._key)
        if problem:
            raise AuditError(f"{self.path}: {problem}; run `toolpolicy audit verify`")
        if last is not None:
            seq, digest, log_id = last["seq"], last["hash"], last["log_id"]
        elif head is not None:
            seq, digest, log_id = 0, ZERO_HASH, head.log_id
        else:
            seq, digest, log_id = 0, ZERO_HASH, wanted_id or new_log_id()
        if head is None or not head.names(log_id, seq, digest):  # new, or one behind after a crash
            replace_file(self.head_path, head_bytes(log_id, seq, digest, self._key), durable=self.durable)
        return seq, digest, log_id

    def _last_record(self, size: int) -> dict[str, Any] | None:
        """The last whole record, after moving a torn last line (a write that never
        finished) to `<log>.torn`. AuditError if it is not a JSON object."""
        last, end = _last_line(self._fd, size)
        if end < size:
            os.lseek(self._fd, end, os.SEEK_SET)
            torn = os.read(self._fd, size - end)
            with open(self.path.with_name(self.path.name + ".torn"), "ab") as keep:
                keep.write(torn + b"\n")
            os.ftruncate(self._fd, end)
            if self.durable:
                os.fsync(self._fd)
        if last is None:
            return None
        try:
            record = json.loads(last)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            raise AuditError(f"{self.path}: the last record is unreadable; run `toolpolicy audit verify`")
        return record


def _resume_problem(
    last: dict[str, Any] | None, head: Head | None, wanted_id: str | None, key: Ed25519PrivateKey | None
) -> str | None:
    """Why a writer holding `key` must not continue a log whose last record is `last` and
    whose head file says `head` (None: a new log, or one it may continue)."""
    if last is None and head is None:
        return None
    if last is not None:
        missing = [name for name in (*FIELDS, "hash") if name not in last]
        if missing:
            return f"the last record has no {', '.join(missing)} (not an audit record, or an older format)"
        if type(last["seq"]) is not int or not isinstance(last["log_id"], str) or not LOG_ID_PATTERN.fullmatch(last["log_id"]):
            return "the last record's seq or log id is not valid: it was edited"
        if record_hash(last) != last["hash"]:
            return "the last record's hash does not match its content: it was edited"
        if head is None:
            return "it has records but no head file, so where it ends cannot be checked"
    assert head is not None
    seq, digest, log_id = (last["seq"], last["hash"], last["log_id"]) if last else (0, ZERO_HASH, head.log_id)
    if wanted_id is not None and log_id != wanted_id:
        return f"it is log {log_id!r}, not {wanted_id!r}"
    problem = _signing_problem("sig" in last if last else head.sig is not None, key)
    if problem:
        return problem
    if key is not None:
        record_problem = _signature_problem(key.public_key(), last) if last else None
        if record_problem:
            return f"its last record: {record_problem}"
        head_problem = head.signature_problem(key.public_key())
        if head_problem:
            return f"its head file: {head_problem}"
    if head.log_id != log_id:
        return f"its head file belongs to log {head.log_id!r}"
    if head.seq > seq:
        return f"the log ends at seq {seq} but its head says {head.seq}: it was truncated"
    if head.seq == seq and head.hash != digest:
        return "the last record's hash differs from its head file"
    if head.seq == seq - 1 and last is not None and last["prev_hash"] != head.hash:
        return "the last record does not follow the one its head file names"
    if head.seq < seq - 1:
        return f"{seq - head.seq} records follow the one its head file names"
    return None


def _signing_problem(signed: bool, key: object | None) -> str | None:
    """A log is signed throughout or not at all: why `key` (or its absence) does not fit."""
    if signed and key is None:
        return "the log is signed; give its signing key"
    if not signed and key is not None:
        return "the log is not signed, and a signed log must be signed from its first record; start a new log"
    return None


def rewind_audit_log(
    path: str | Path,
    seq: int,
    signing_key: str | Path | Ed25519PrivateKey | None = None,
    *,
    log_id: str | None = None,
    last_hash: str | None = None,
) -> Path | None:
    """Cut the log back to its first `seq` records, for a run that resumes from a checkpoint
    taken when the log ended at `seq`: the decisions after it belong to steps the run will
    take again, and must not stand twice in the chain.

    Nothing is lost: the cut records move, whole and in order, to `<log>.replayed` (appended
    to, with a line naming the seq they were cut back to), where `verify` does not look. The
    log and its head file (signed with `signing_key`, which a signed log needs) are each
    replaced atomically, the log first. A run killed between the two leaves a head ahead of
    the log, which `verify` reports as an interrupted rewind; calling `rewind_audit_log` again with the
    same seq (the resume does) finishes it. Returns the `.replayed` file, or None when nothing
    followed `seq`. AuditError if the log holds fewer than `seq` records or its record `seq`
    is not where the checkpoint says; run it with no other writer (the caller opens the log
    only afterwards).

    A rewind is a rollback: a saved head (see `verify`) taken after `seq` reports it.
    `log_id` and `last_hash`, when given, must be the log's id and the hash of its record
    `seq` (AuditError otherwise: another log stands at `path`).
    """
    path = Path(path)
    key = load_private_key(signing_key) if isinstance(signing_key, (str, Path)) else signing_key
    if not path.exists():
        if seq:
            raise AuditError(f"{path}: missing, but the checkpoint was taken at record {seq}")
        return None
    head = read_head(head_path(path))
    lines = path.read_bytes().splitlines(keepends=True)
    whole = [line for line in lines if line.endswith(b"\n")]
    if len(whole) < seq:
        raise AuditError(f"{path}: {len(whole)} records, but the checkpoint was taken at record {seq}")
    kept, cut = whole[:seq], lines[seq:]
    last = json.loads(kept[-1]) if kept else None
    if last is not None and last.get("seq") != seq:
        raise AuditError(f"{path}: record {seq} has seq {last.get('seq')}; run `toolpolicy audit verify`")
    first_cut = json.loads(cut[0]) if cut and cut[0].endswith(b"\n") else {}
    expected_id, log_id = log_id, last.get("log_id") if last else head.log_id if head else first_cut.get("log_id")
    if log_id is None and (kept or first_cut):
        raise AuditError(f"{path}: its records have no log id (an older format); start a new log")
    if expected_id is not None and log_id is not None and log_id != expected_id:
        raise AuditError(f"{path}: log id {log_id}, but the checkpoint was taken of log {expected_id}")
    if last_hash is not None and (last["hash"] if last else ZERO_HASH) != last_hash:
        raise AuditError(f"{path}: record {seq} is not the one the checkpoint saw (its hash differs)")
    if log_id is None:  # nothing was ever logged
        return None
    signed = "sig" in last if last else head.sig is not None if head else "sig" in first_cut
    problem = _signing_problem(signed, key)
    if problem:
        raise AuditError(f"{path}: cannot rewind: {problem}")
    replayed = path.with_name(path.name + ".replayed")
    if cut:
        with open(replayed, "ab") as keep:
            keep.write(json.dumps({"rewound_to_seq": seq}).encode("ascii") + b"\n" + b"".join(cut))
            keep.flush()
            os.fsync(keep.fileno())
        replace_file(path, b"".join(kept))
    replace_file(head_path(path), head_bytes(log_id, seq, last["hash"] if last else ZERO_HASH, key), durable=True)
    return replayed if cut else None


@dataclass
class _Scan:
    """What one pass over the records found."""

    log_id: str | None = None  # the first record's
    records: int = 0
    last_seq: int = 0
    last_hash: str = ZERO_HASH
    before_last_hash: str = ZERO_HASH  # the hash of the record before the last one
    pinned_hash: str | None = None  # the hash of the record whose seq a saved head names
    torn: bool = False


def verify(
    path: str | Path,
    public_key: str | Path | Ed25519PublicKey | None = None,
    *,
    log_id: str | None = None,
    expect_at_least: int = 0,
    saved_head: str | Path | Head | None = None,
) -> VerifyResult:
    """Check a log's hash chain, sequence, log id, head file and (given a public key) the
    signatures of every record and of the head.

    Finds an edited record (its hash no longer matches), a deleted, inserted, duplicated or
    reordered one (seq out of order, prev_hash mismatch), a record from another log (its
    log id), records cut from the end (the head file is ahead of the log), and a missing or
    forged head. Without a public key a consistent rebuild of both files cannot be told from
    the real thing (the report says so). The pins catch what needs an earlier observation:
    `log_id`, the id the log must have (another log swapped in); `expect_at_least`, the
    number of records seen before; `saved_head`, a copy of the head file taken before (or
    its path): the log must still hold that record, unchanged. Reads the file once.
    """
    path = Path(path)
    key = load_public_key(public_key) if isinstance(public_key, (str, Path)) else public_key
    pin = read_head(Path(saved_head)) if isinstance(saved_head, (str, Path)) else saved_head
    problems: list[str] = []
    warnings: list[str] = []
    head = read_head(head_path(path))
    scan = _Scan()
    try:
        handle = open(path, "rb")
    except OSError as error:
        if not (isinstance(error, FileNotFoundError) and head is not None and head.seq == 0):
            problems.append(f"cannot read {path}: {error}")  # else: created, killed before its first record
    else:
        with handle:
            _scan_records(handle, scan, key, pin.seq if pin else None, problems, warnings)
    if scan.log_id is None and head is not None:  # an empty log names itself in its head alone
        scan.log_id = head.log_id
    if log_id is not None and scan.log_id != log_id:
        problems.append(f"this is log {scan.log_id!r}, not {log_id!r}: another log was put in its place")
    problems += _head_problems(head, scan, key, path)
    if head is not None and head.seq == scan.last_seq - 1 and head.hash == scan.before_last_hash:
        warnings.append(
            f"the head file names seq {head.seq}, one record behind: the writer stopped between record "
            f"{scan.last_seq} and its head (reopening the log repairs it)"
        )
    problems += _pin_problems(scan, expect_at_least, saved_head, pin, key)
    if len(problems) > MAX_PROBLEMS_SHOWN:
        problems = [*problems[:MAX_PROBLEMS_SHOWN], f"... and {len(problems) - MAX_PROBLEMS_SHOWN} more problems"]
    return VerifyResult(
        not problems, scan.records, tuple(problems), tuple(warnings), scan.last_seq, scan.last_hash, scan.torn,
        key is not None, scan.log_id,
    )


def _scan_records(
    handle: IO[bytes], scan: _Scan, key: Ed25519PublicKey | None, pin_seq: int | None, problems: list[str], warnings: list[str]
) -> None:
    """Check each line of the log in order, updating `scan`; a torn last line ends the scan."""
    if pin_seq == 0:
        scan.pinned_hash = ZERO_HASH
    for number, raw in enumerate(handle, start=1):
        if not raw.endswith(b"\n"):
            scan.torn = True
            warnings.append(
                f"line {number} is torn (a write was interrupted: the process was killed or the disk filled); "
                "it is not a record. Reopening the log with AuditLog moves it to the .torn file."
            )
            return
        try:
            record = json.loads(raw)
        except ValueError:
            problems.append(f"line {number}: not a JSON record (edited, corrupted or torn)")
            continue
        missing = [name for name in (*FIELDS, "hash") if not isinstance(record, dict) or name not in record]
        if missing:
            problems.append(f"line {number}: not an audit record (missing {', '.join(missing)})")
            continue
        scan.records += 1
        if scan.log_id is None:
            scan.log_id = str(record["log_id"])
        where = f"record at line {number} (seq {record['seq']!r})"
        problems += [f"{where}: {text}" for text in _record_problems(record, scan, key)]
        if record["seq"] == pin_seq and scan.pinned_hash is None:
            scan.pinned_hash = str(record["hash"])
        scan.last_seq = record["seq"] if type(record["seq"]) is int else scan.last_seq + 1
        scan.before_last_hash, scan.last_hash = scan.last_hash, str(record["hash"])


def _record_problems(record: dict[str, Any], scan: _Scan, key: Ed25519PublicKey | None) -> list[str]:
    """What is wrong with `record` as the one that follows `scan`'s last record."""
    found = []
    if type(record["seq"]) is not int or record["seq"] != scan.last_seq + 1:
        found.append(f"expected seq {scan.last_seq + 1}: a record was deleted, inserted, duplicated or reordered")
    if record["log_id"] != scan.log_id:
        found.append(f"it belongs to log {record['log_id']!r}, not {scan.log_id!r}: it was copied from another log")
    if record["prev_hash"] != scan.last_hash:
        found.append("prev_hash is not the hash of the record before it")
    if record_hash(record) != record["hash"]:
        found.append("hash does not match the record's content: the record was edited")
    if key is not None:
        problem = _signature_problem(key, record)
        if problem:
            found.append(problem)
    return found


def _head_problems(head: Head | None, scan: _Scan, key: Ed25519PublicKey | None, path: Path) -> list[str]:
    """How the head file disagrees with the records (a head one record behind is not a
    problem: `verify` warns about it)."""
    if head is None:
        return [f"no readable head file {head_path(path).name}: where the log ends cannot be checked"]
    found = []
    if key is not None:
        problem = head.signature_problem(key)
        if problem:
            found.append(f"the head file is {problem}" if problem.startswith("not") else f"the head file: {problem}")
    if head.log_id != scan.log_id:
        found.append(f"the head file belongs to log {head.log_id!r}, the records to {scan.log_id!r}")
    last = scan.last_seq
    if head.seq > last:
        found.append(
            f"the head file says the log ends at seq {head.seq}, but its last record is seq {last}: "
            f"the log was truncated: {_seqs(last + 1, head.seq)} missing" + _interrupted_rewind(path, last)
        )
    elif head.seq == last and head.hash != scan.last_hash:
        found.append(f"record seq {last}: its hash differs from the head file's: the end was rewritten")
    elif head.seq == last - 1 and head.hash != scan.before_last_hash:
        found.append(f"record seq {head.seq}: its hash differs from the head file's: the end was rewritten")
    elif head.seq < last - 1:
        found.append(
            f"{_seqs(head.seq + 1, last)} after the one the head file names: they were not written by AuditLog"
        )
    return found


def _seqs(first: int, last: int) -> str:
    return f"record seq {first} is" if first == last else f"records seq {first} to {last} are"


def _interrupted_rewind(path: Path, seq: int) -> str:
    """A note for a head ahead of the log when `<log>.replayed` ends with a rewind to `seq`:
    a resume killed inside `rewind_audit_log`, which resuming again finishes (it is still a problem:
    an honest rewind also rewrites the head)."""
    replayed = path.with_name(path.name + ".replayed")
    marker = json.dumps({"rewound_to_seq": seq}).encode("ascii")
    try:
        with open(replayed, "rb") as handle:
            markers = [line.rstrip(b"\n") for line in handle if line.startswith(b'{"rewound_to_seq"')]
    except OSError:
        return ""
    if markers and markers[-1] == marker:
        return f" (or a rewind to seq {seq} was interrupted: {replayed.name} holds them; resuming the run again finishes it)"
    return ""


def _pin_problems(
    scan: _Scan, expect_at_least: int, saved_head: object, pin: Head | None, key: Ed25519PublicKey | None
) -> list[str]:
    """How the log falls short of what the verifier saw before."""
    found = []
    if scan.last_seq < expect_at_least:
        found.append(
            f"the log ends at seq {scan.last_seq}, but at least {expect_at_least} records were expected: "
            "records were cut from the end or the log was rolled back"
        )
    if saved_head is None:
        return found
    if pin is None:
        return [*found, f"cannot read the saved head {saved_head}"]
    problem = pin.signature_problem(key) if key is not None and pin.sig is not None else None
    if problem:
        found.append(f"the saved head: {problem}")
    if pin.log_id != scan.log_id:
        found.append(f"the saved head is of log {pin.log_id!r}, this log is {scan.log_id!r}: it was replaced by another log")
    elif scan.last_seq < pin.seq:
        found.append(
            f"the log ends at seq {scan.last_seq}, but the saved head saw seq {pin.seq}: "
            "records were cut from the end or the log was rolled back"
        )
    elif scan.pinned_hash != pin.hash:
        found.append(f"record seq {pin.seq}: its hash differs from the saved head's: the log was rewritten up to there")
    return found


def record_hash(record: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of `record` without its `hash` and `sig`."""
    body = {name: value for name, value in record.items() if name not in ("hash", "sig")}
    try:
        return sha256_hex(canonical_json(body))
    except (TypeError, ValueError):
        return "unhashable"


def new_log_id() -> str:
    """A fresh log id: the UTC start time and 64 random bits, e.g. 20250101T120000Z-1f2e3d4c5b6a7980."""
    return f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(8)}"


def head_path(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def generate_keypair(private_path: str | Path, public_path: str | Path) -> None:
    """Write a new Ed25519 key pair as PEM files (the private one readable by its owner only)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private)
    Path(public_path).write_bytes(public)


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(Path(path).read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return key


def _signature_problem(key: Ed25519PublicKey, record: dict[str, Any]) -> str | None:
    sig = record.get("sig")
    if not isinstance(sig, str):
        return "no signature, but the log is expected to be signed"
    try:
        key.verify(bytes.fromhex(sig), str(record["hash"]).encode("ascii", "replace"))
    except (ValueError, InvalidSignature):
        return "the signature does not verify with the given public key"
    return None


def read_head(path: Path) -> Head | None:
    """The head file at `path`, or None if it is missing or not a head."""
    try:
        data = json.loads(path.read_text(encoding="ascii"))
        log_id, seq, digest, sig = data["log_id"], data["seq"], data["hash"], data.get("sig")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if type(seq) is not int or seq < 0 or not all(isinstance(text, str) for text in (log_id, digest)):
        return None
    return Head(log_id, seq, digest, sig if isinstance(sig, str) else None)


def _last_line(fd: int, size: int, chunk: int = 65536) -> tuple[bytes | None, int]:
    """The last newline-terminated line (without its newline) and the offset just after
    it, reading backwards from the end so that opening a long log stays cheap."""
    buffer, position = b"", size  # buffer holds the file's bytes from `position` to the end
    while True:
        last = buffer.rfind(b"\n")
        if last >= 0:
            before = buffer.rfind(b"\n", 0, last)
            if before >= 0 or position == 0:
                return buffer[before + 1 : last], position + last + 1
        if position == 0:
            return None, 0
        step = min(chunk, position)
        position -= step
        os.lseek(fd, position, os.SEEK_SET)
        buffer = os.read(fd, step) + buffer
