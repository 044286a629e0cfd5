"""The audit log: one append-only, hash-chained JSONL record per gate decision.

Each record holds seq (1, 2, ...), time (UTC, ISO 8601), decision_id, policy_hash, tool,
args_digest (SHA-256 of the canonical arguments: the log proves which arguments were
decided on without storing secrets), decision, rule_ids, reason, prev_hash and hash.
`hash` is the SHA-256 of the canonical JSON of the record without `hash` and `sig`, and
`prev_hash` is the previous record's hash (64 zeros for the first), so editing,
deleting, inserting or reordering a record breaks the chain where it happened. With a
signing key each hash is also signed with Ed25519 (`sig`, hex), so that a chain cannot
be rebuilt by someone who can only write the file.

A chain cannot show that records were cut from its end. For that, every append also
updates a sidecar `<log>.head` holding the last seq and hash; `verify` compares. A
durable log replaces the head file (temporary file, fsync, rename: whole after a power
loss); otherwise the head is rewritten in place with one fixed-width `pwrite`, which
a killed process cannot tear and which costs microseconds instead of a rename's
millisecond. Against someone who can
rewrite both files, keep the last head hash somewhere else too (e.g. the run summary).

Durability: each record is one `write` to a file opened O_APPEND, then fsync; the head
follows. A process killed mid-write leaves at most one torn last line, which `verify`
reports as such; reopening the log moves the torn bytes to `<log>.torn` and continues
the chain from the last whole record. One process writes a log at a time (an exclusive
lock, where the platform has one); give each rollout worker its own log.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from toolpolicy.gate.digest import ZERO_HASH, args_digest, canonical_json, sha256_hex
from toolpolicy.types import ToolCall

if TYPE_CHECKING:  # decide.py imports this module; the import is for the annotation only
    from toolpolicy.gate.decide import Decision

try:
    import fcntl
except ImportError:  # Windows: no advisory lock; one writer per log is then up to the caller
    fcntl = None  # type: ignore[assignment]

FIELDS = (
    "seq",
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


class AuditError(RuntimeError):
    """The audit log cannot be written or opened safely."""


@dataclass(frozen=True)
class VerifyResult:
    """What `verify` found. `ok` is False when any problem was found; warnings do not
    fail verification (no head file, a torn last line from an interrupted write)."""

    ok: bool
    records: int
    problems: tuple[str, ...]
    warnings: tuple[str, ...]
    last_seq: int
    last_hash: str
    torn_tail: bool = False
    signatures_checked: bool = False

    def __str__(self) -> str:
        verdict = "OK" if self.ok else "FAILED"
        signed = ", signatures verified" if self.signatures_checked and self.ok else ""
        lines = [f"audit log {verdict}: {self.records} records{signed}, last seq {self.last_seq}"]
        lines += [f"problem: {text}" for text in self.problems]
        lines += [f"warning: {text}" for text in self.warnings]
        return "\n".join(lines)


class AuditLog:
    """Appends decision records to a JSONL file, continuing the chain of an existing one.

    Args:
        path: the log file; `<path>.head` and, after a crash, `<path>.torn` sit beside it.
        signing_key: an Ed25519 private key, or the path of its PEM file, to sign every hash.
        durable: fsync the record and the head on every append (survives power loss).
            False still writes each record before returning (survives a killed process).
    """

    def __init__(
        self, path: str | Path, signing_key: str | Path | Ed25519PrivateKey | None = None, durable: bool = True
    ) -> None:
        self.path = Path(path)
        self.head_path = head_path(self.path)
        self.durable = durable
        self._key = load_private_key(signing_key) if isinstance(signing_key, (str, Path)) else signing_key
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._head = -1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    raise AuditError(f"{self.path}: another process is appending to this audit log") from None
            self._seq, self._prev = self._resume()
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
                "time": datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z"),
                "decision_id": decision.decision_id,
                "policy_hash": policy_hash,
                "tool": call.name if isinstance(call.name, str) else repr(call.name),
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
            try:
                _write_all(self._fd, line)
                if self.durable:
                    os.fsync(self._fd)
                if self.durable:
                    _write_head(self.head_path, record["seq"], record["hash"], durable=True)
                else:
                    os.pwrite(self._head_fd(), head_bytes(record["seq"], record["hash"]), 0)
            except OSError as error:
                self._broken = str(error)
                raise AuditError(f"{self.path}: cannot write the audit record: {error}") from error
            self._seq, self._prev = record["seq"], record["hash"]
            return record

    @staticmethod
    def verify(path: str | Path, public_key: str | Path | Ed25519PublicKey | None = None) -> VerifyResult:
        """Same as the module's `verify`: check a log file (see there)."""
        return verify(path, public_key)

    @property
    def last_seq(self) -> int:
        return self._seq

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

    def _resume(self) -> tuple[int, str]:
        """(last seq, last hash) of the existing log, after moving a torn tail aside.

        Refuses (AuditError) a log that does not end where its head file says, so that a
        truncated or tampered log is never silently extended."""
        seq, digest = 0, ZERO_HASH
        size = os.fstat(self._fd).st_size
        if size:
            last, end = _last_line(self._fd, size)
            if end < size:  # bytes after the last newline: a write that never finished
                os.lseek(self._fd, end, os.SEEK_SET)
                torn = os.read(self._fd, size - end)
                with open(self.path.with_name(self.path.name + ".torn"), "ab") as keep:
                    keep.write(torn + b"\n")
                os.ftruncate(self._fd, end)
                if self.durable:
                    os.fsync(self._fd)
            if last is not None:
                try:
                    record = json.loads(last)
                    seq, digest = record["seq"], record["hash"]
                except (ValueError, KeyError, TypeError):
                    raise AuditError(
                        f"{self.path}: the last record is unreadable; run `toolpolicy audit verify`"
                    ) from None
        head = _read_head(self.head_path)
        if head is not None:
            if head[0] > seq:
                raise AuditError(
                    f"{self.path}: the log ends at seq {seq} but its head says {head[0]}: it was truncated"
                )
            if head[0] == seq and head[1] != digest:
                raise AuditError(f"{self.path}: the last record's hash differs from its head file")
            if head[0] < seq - 1:
                raise AuditError(f"{self.path}: {seq - head[0]} records follow the one its head file names")
        if head != (seq, digest):  # missing, or one behind after a crash between the two writes
            _write_head(self.head_path, seq, digest, self.durable)
        return seq, digest


def rewind(path: str | Path, seq: int) -> Path | None:
    """Cut the log back to its first `seq` records, for a run that resumes from a checkpoint
    taken when the log ended at `seq`: the decisions after it belong to steps the run will
    take again, and must not stand twice in the chain.

    Nothing is lost: the cut records move, whole and in order, to `<log>.replayed` (appended
    to, with a line naming the seq they were cut back to), where `verify` does not look. The
    log and its head file are rewritten atomically. Returns that file, or None when nothing
    followed `seq`. AuditError if the log holds fewer than `seq` records or its record
    `seq` is not where the checkpoint says; run it with no other writer (the caller opens
    the log only afterwards).
    """
    path = Path(path)
    if not path.exists():
        if seq:
            raise AuditError(f"{path}: missing, but the checkpoint was taken at record {seq}")
        return None
    lines = path.read_bytes().splitlines(keepends=True)
    whole = [line for line in lines if line.endswith(b"\n")]
    if len(whole) < seq:
        raise AuditError(f"{path}: {len(whole)} records, but the checkpoint was taken at record {seq}")
    kept, cut = whole[:seq], lines[seq:]
    digest = ZERO_HASH
    if kept:
        last = json.loads(kept[-1])
        if last.get("seq") != seq:
            raise AuditError(f"{path}: record {seq} has seq {last.get('seq')}; run `toolpolicy audit verify`")
        digest = last["hash"]
    if not cut:
        return None
    replayed = path.with_name(path.name + ".replayed")
    with open(replayed, "ab") as keep:
        keep.write(json.dumps({"rewound_to_seq": seq}).encode("ascii") + b"\n" + b"".join(cut))
        keep.flush()
        os.fsync(keep.fileno())
    temporary = path.with_name(path.name + ".rewind")
    temporary.write_bytes(b"".join(kept))
    os.replace(temporary, path)
    _write_head(head_path(path), seq, digest, durable=True)
    return replayed


def verify(path: str | Path, public_key: str | Path | Ed25519PublicKey | None = None) -> VerifyResult:
    """Check a log's hash chain, sequence, head file and (given a public key) signatures.

    Finds an edited record (its hash no longer matches), a deleted, inserted or reordered
    one (seq out of order, prev_hash mismatch), and records cut from the end (the head
    file is ahead of the log). Reads the file once, line by line.
    """
    path = Path(path)
    key = load_public_key(public_key) if isinstance(public_key, (str, Path)) else public_key
    problems: list[str] = []
    warnings: list[str] = []
    seq, last_hash, records, torn = 0, ZERO_HASH, 0, False
    try:
        handle = open(path, "rb")
    except OSError as error:
        return VerifyResult(False, 0, (f"cannot read {path}: {error}",), (), 0, ZERO_HASH)
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n"):
                torn = True
                warnings.append(
                    f"line {number} is torn (a write was interrupted: the process was killed or the disk filled); "
                    "it is not a record. Reopening the log with AuditLog moves it to the .torn file."
                )
                break
            where = f"line {number}"
            try:
                record = json.loads(raw)
            except ValueError:
                problems.append(f"{where}: not a JSON record (edited or corrupted)")
                continue
            missing = [name for name in (*FIELDS, "hash") if not isinstance(record, dict) or name not in record]
            if missing:
                problems.append(f"{where}: not an audit record (missing {', '.join(missing)})")
                continue
            records += 1
            where = f"line {number} (seq {record['seq']!r})"
            if record["seq"] != seq + 1:
                problems.append(f"{where}: expected seq {seq + 1}: a record was deleted, inserted or reordered")
            if record["prev_hash"] != last_hash:
                problems.append(f"{where}: prev_hash is not the hash of the record before it")
            if record_hash(record) != record["hash"]:
                problems.append(f"{where}: hash does not match the record's content: the record was edited")
            if key is not None:
                problem = _signature_problem(key, record)
                if problem:
                    problems.append(f"{where}: {problem}")
            seq = record["seq"] if isinstance(record["seq"], int) else seq + 1
            last_hash = str(record["hash"])

    head = _read_head(head_path(path))
    if head is None:
        warnings.append(f"no readable head file {head_path(path).name}: records cut from the end would not be noticed")
    elif head[0] > seq:
        problems.append(
            f"the head file says {head[0]} records were written but the log ends at seq {seq}: the log was truncated"
        )
    elif head[0] == seq and head[1] != last_hash:
        problems.append(f"the head file's hash for seq {seq} differs from the last record's: the end was rewritten")
    elif head[0] == seq - 1:
        warnings.append("the head file is one record behind (the writer stopped between the record and the head)")
    elif head[0] < seq:
        problems.append(
            f"the log has {seq - head[0]} records after the one its head file names: they were not written by AuditLog"
        )
    if len(problems) > MAX_PROBLEMS_SHOWN:
        problems = [*problems[:MAX_PROBLEMS_SHOWN], f"... and {len(problems) - MAX_PROBLEMS_SHOWN} more problems"]
    return VerifyResult(not problems, records, tuple(problems), tuple(warnings), seq, last_hash, torn, key is not None)


def record_hash(record: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of `record` without its `hash` and `sig`."""
    body = {name: value for name, value in record.items() if name not in ("hash", "sig")}
    try:
        return sha256_hex(canonical_json(body))
    except (TypeError, ValueError):
        return "unhashable"


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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


HEAD_WIDTH = 120  # bytes; seq and a 64-hex hash fit with room to spare, padded with spaces


def head_bytes(seq: int, digest: str) -> bytes:
    """The head file's content, always HEAD_WIDTH bytes so an in-place rewrite leaves no stale tail."""
    return (json.dumps({"seq": seq, "hash": digest}).ljust(HEAD_WIDTH - 1) + "\n").encode("ascii")


def _write_head(path: Path, seq: int, digest: str, durable: bool) -> None:
    """Replace the head file atomically: write a temporary file, fsync, rename."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        handle.write(head_bytes(seq, digest))
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(temporary, path)
    if durable and hasattr(os, "O_DIRECTORY"):
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def _read_head(path: Path) -> tuple[int, str] | None:
    try:
        data = json.loads(path.read_text(encoding="ascii"))
        seq, digest = data["seq"], data["hash"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(seq, bool) or not isinstance(seq, int) or not isinstance(digest, str):
        return None
    return seq, digest


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
