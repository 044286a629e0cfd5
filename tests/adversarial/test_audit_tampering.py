"""Every way we know to tamper with an audit log, by someone who can rewrite the log and
its head file but does not hold the signing key, each one its own test case.

Signed logs (verified with the public key): every kind is detected. Two kinds can only be
detected with something the verifier kept from before, because the tampered files are a
state the key really signed: a rollback (caught by `--expect-at-least` or `--head`) and a
whole other log swapped in (caught by `--log-id`); for those the case also shows that
without the pin the log verifies.

Unsigned logs: every kind that the chain and the head can show by construction is
detected; the others (a consistent rebuild of both files) verify, and the case checks
that the report says "integrity only, no authenticity" and that docs/audit.md lists the
kind as undetectable.

Each detected case runs `toolpolicy audit verify` and checks that it exits 1 with a
message naming the record (line and seq) or the head, and the problem. Honest logs,
interrupted by a crash or a resume, must verify: `test_honest_logs_verify`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from toolpolicy.cli import main
from toolpolicy.gate import AuditLog, Decision, generate_keypair, rewind_audit_log
from toolpolicy.gate.audit import HEAD_DOMAIN, load_private_key, record_hash
from toolpolicy.gate.digest import ZERO_HASH
from toolpolicy.types import ToolCall

RECORDS = 6  # records in each log; the earlier state the attacker rolls back to holds 4
EARLIER = 4
DOCS = Path(__file__).resolve().parents[2] / "docs" / "audit.md"
INTEGRITY_ONLY = "integrity only, no authenticity"


@dataclass
class World:
    """A log as its writer left it, and what an attacker (or a verifier) has besides."""

    log: Path
    key: Ed25519PrivateKey | None  # the writer's key; None: an unsigned log
    public: Path | None
    other: Path  # another log, written with the same key
    earlier_log: bytes  # the files as they were when the log held EARLIER records
    earlier_head: bytes
    saved_head: Path  # a copy of the final head, kept by the verifier
    log_id: str
    attacker_key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)

    @property
    def head(self) -> Path:
        return Path(f"{self.log}.head")


def append(log: AuditLog, count: int, offset: int = 0) -> None:
    for i in range(offset, offset + count):
        log.append(
            Decision("allow" if i % 2 else "deny", (f"rule-{i}",), f"reason {i}"),
            ToolCall("read_file", {"path": f"/work/{i}"}),
            "ab" * 32,
        )


def build_world(folder: Path, signed: bool) -> World:
    private, public = folder / "audit.key", folder / "audit.pub"
    generate_keypair(private, public)
    key = load_private_key(private) if signed else None
    log, other = folder / "audit.jsonl", folder / "other.jsonl"
    with AuditLog(log, signing_key=key, durable=False) as writer:
        append(writer, EARLIER)
        earlier_log, earlier_head = log.read_bytes(), Path(f"{log}.head").read_bytes()
        append(writer, RECORDS - EARLIER, EARLIER)
        log_id = writer.log_id
    with AuditLog(other, signing_key=key, durable=False) as writer:
        append(writer, RECORDS)
    saved = folder / "saved.head"
    saved.write_bytes(Path(f"{log}.head").read_bytes())
    return World(log, key, public if signed else None, other, earlier_log, earlier_head, saved, log_id)


# What the attacker does with the files.


def records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def write_records(log: Path, items: list[dict]) -> None:
    log.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in items))


def edit_records(world: World, change: Callable[[list[dict]], list[dict]]) -> None:
    write_records(world.log, change(records(world.log)))


def rechain(items: list[dict], start: int = 0, signer: Ed25519PrivateKey | None = None) -> list[dict]:
    """Recompute seq, prev_hash and hash from `start` on: what anyone can do to a chain. The
    old signatures stay, unless a key is given to sign with."""
    previous = items[start - 1]["hash"] if start else ZERO_HASH
    for number, record in enumerate(items[start:], start=start + 1):
        record["seq"], record["prev_hash"] = number, previous
        record["hash"] = previous = record_hash(record)
        if signer is not None:
            record["sig"] = signer.sign(previous.encode("ascii")).hex()
    return items


def write_head(world: World, items: list[dict], sig: str | None = None, signer: Ed25519PrivateKey | None = None) -> None:
    """A head naming the end of `items`, unsigned, or with a given or attacker-made signature."""
    seq, digest = (items[-1]["seq"], items[-1]["hash"]) if items else (0, ZERO_HASH)
    head: dict = {"log_id": world.log_id, "seq": seq, "hash": digest}
    if signer is not None:
        sig = signer.sign(f"{HEAD_DOMAIN}\n{world.log_id}\n{seq}\n{digest}".encode("ascii")).hex()
    if sig is not None:
        head["sig"] = sig
    world.head.write_text(json.dumps(head))


def edited(record: dict) -> dict:
    return {**record, "decision": "allow" if record["decision"] == "deny" else "deny"}


def edit_field(world: World) -> None:
    edit_records(world, lambda r: [*r[:2], edited(r[2]), *r[3:]])


def edit_field_and_its_hash(world: World) -> None:
    def change(items: list[dict]) -> list[dict]:
        items[2] = edited(items[2])
        items[2]["hash"] = record_hash(items[2])
        return items

    edit_records(world, change)


def rechain_after_edit(world: World) -> None:
    items = records(world.log)
    items[2] = edited(items[2])
    write_records(world.log, rechain(items, 2))
    write_head(world, items)


def resign_with_own_key(world: World) -> None:
    items = rechain([edited(r) if r["seq"] == 3 else r for r in records(world.log)], 0, world.attacker_key)
    write_records(world.log, items)
    write_head(world, items, signer=world.attacker_key)


def delete_at(index: int) -> Callable[[World], None]:
    return lambda world: edit_records(world, lambda r: r[:index] + r[index + 1 :])


def reorder(world: World) -> None:
    edit_records(world, lambda r: [r[0], r[3], r[2], r[1], *r[4:]])


def duplicate(world: World) -> None:
    edit_records(world, lambda r: [*r[:3], r[2], *r[3:]])


def cut_tail(k: int) -> Callable[[World], None]:
    return lambda world: edit_records(world, lambda r: r[:-k])


def cut_tail_and_write_head(world: World) -> None:
    items = records(world.log)[:-2]
    write_records(world.log, items)
    write_head(world, items)


def cut_tail_and_borrow_a_record_signature(world: World) -> None:
    items = records(world.log)[:-2]
    write_records(world.log, items)
    write_head(world, items, sig=items[-1]["sig"])


def empty_the_log_and_delete_its_head(world: World) -> None:
    world.log.write_text("")
    world.head.unlink()


def empty_the_log_and_write_its_head(world: World) -> None:
    world.log.write_text("")
    write_head(world, [])


def cut_start(k: int) -> Callable[[World], None]:
    return lambda world: edit_records(world, lambda r: r[k:])


def cut_start_and_renumber(world: World) -> None:
    items = rechain(records(world.log)[2:])
    write_records(world.log, items)
    write_head(world, items)


def delete_head_file(world: World) -> None:
    world.head.unlink()


def older_head(world: World) -> None:
    world.head.write_bytes(world.earlier_head)


def rollback(world: World) -> None:
    world.log.write_bytes(world.earlier_log)
    world.head.write_bytes(world.earlier_head)


def forge_head_hash(world: World) -> None:
    world.head.write_text(json.dumps({"log_id": world.log_id, "seq": RECORDS, "hash": "f" * 64}))


def strip_head_signature(world: World) -> None:
    write_head(world, records(world.log))


def swap_in_other_log(world: World) -> None:
    world.log.write_bytes(world.other.read_bytes())
    world.head.write_bytes(Path(f"{world.other}.head").read_bytes())


def splice_from_other_log(world: World) -> None:
    foreign = records(world.other)[2]
    edit_records(world, lambda r: [*r[:2], foreign, *r[3:]])


def strip_one_signature(world: World) -> None:
    edit_records(world, lambda r: [*r[:2], {k: v for k, v in r[2].items() if k != "sig"}, *r[3:]])


def strip_all_signatures(world: World) -> None:
    items = [{k: v for k, v in r.items() if k != "sig"} for r in records(world.log)]
    write_records(world.log, items)
    write_head(world, items)


def forged_append(world: World) -> None:
    items = records(world.log)
    items.append({**items[-1], "decision_id": "forged", "reason": "forged"})
    items = rechain(items, len(items) - 1, world.attacker_key if world.key else None)
    write_records(world.log, items)
    write_head(world, items, signer=world.attacker_key if world.key else None)


def forged_append_keeping_the_head(world: World) -> None:
    """Like a writer killed between a record and its head, but the record is forged."""
    items = records(world.log)
    items.append({**items[-1], "decision_id": "forged", "reason": "forged"})
    write_records(world.log, rechain(items, len(items) - 1, world.attacker_key if world.key else None))


def torn_line_in_the_middle(world: World) -> None:
    lines = world.log.read_text().splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2] + "\n"
    world.log.write_text("".join(lines))


def torn_line_joined_to_the_next(world: World) -> None:
    lines = world.log.read_text().splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2]
    world.log.write_text("".join(lines))


def nothing(world: World) -> None:
    """The files are left alone: the attack is in what the verifier is handed (another key)."""


# The table. unsigned: "detected", "undetectable" (a consistent rebuild; documented) or
# None (the kind is about signatures). pin: what the verifier must have kept to catch it.

DETECTED, UNDETECTABLE = "detected", "undetectable"


@dataclass(frozen=True)
class Attack:
    name: str
    tamper: Callable[[World], None]
    unsigned: str | None
    message: str  # a regex the report must match: where (record or head) and what
    pin: str | None = None  # "count", "saved_head" or "log_id"
    wrong_key: bool = False


ATTACKS = (
    Attack("edit-field", edit_field, DETECTED, r"record at line 3 \(seq 3\): hash does not match the record's content"),
    Attack("edit-field-and-its-hash", edit_field_and_its_hash, DETECTED, r"record at line 4 \(seq 4\): prev_hash is not the hash"),
    Attack("rechain-after-edit", rechain_after_edit, UNDETECTABLE, r"record at line 3 \(seq 3\): the signature does not verify"),
    Attack("resign-with-own-key", resign_with_own_key, None, r"record at line 1 \(seq 1\): the signature does not verify"),
    Attack("delete-first", delete_at(0), DETECTED, r"record at line 1 \(seq 2\): expected seq 1"),
    Attack("delete-middle", delete_at(2), DETECTED, r"record at line 3 \(seq 4\): expected seq 3"),
    Attack("delete-last", delete_at(RECORDS - 1), DETECTED, r"the log was truncated: record seq 6 is missing"),
    Attack("reorder", reorder, DETECTED, r"record at line 2 \(seq 4\): expected seq 2"),
    Attack("duplicate", duplicate, DETECTED, r"record at line 4 \(seq 3\): expected seq 4"),
    Attack("cut-tail-1", cut_tail(1), DETECTED, r"the log was truncated: record seq 6 is missing"),
    Attack("cut-tail-3", cut_tail(3), DETECTED, r"the log was truncated: records seq 4 to 6 are missing"),
    Attack("cut-tail-and-write-head", cut_tail_and_write_head, UNDETECTABLE, r"the head file is not signed"),
    Attack("cut-tail-and-borrow-a-record-signature", cut_tail_and_borrow_a_record_signature, None,
           r"the head file: its signature does not verify"),
    Attack("empty-the-log-and-delete-its-head", empty_the_log_and_delete_its_head, DETECTED, r"no readable head file"),
    Attack("empty-the-log-and-write-its-head", empty_the_log_and_write_its_head, UNDETECTABLE, r"the head file is not signed"),
    Attack("cut-start-1", cut_start(1), DETECTED, r"record at line 1 \(seq 2\): expected seq 1"),
    Attack("cut-start-3", cut_start(3), DETECTED, r"record at line 1 \(seq 4\): expected seq 1"),
    Attack("cut-start-and-renumber", cut_start_and_renumber, UNDETECTABLE,
           r"record at line 1 \(seq 1\): the signature does not verify"),
    Attack("delete-head-file", delete_head_file, DETECTED, r"no readable head file audit.jsonl.head"),
    Attack("older-head", older_head, DETECTED, r"records seq 5 to 6 are after the one the head file names"),
    Attack("rollback-caught-by-count", rollback, DETECTED, r"the log ends at seq 4, but at least 6 records were expected", "count"),
    Attack("rollback-caught-by-saved-head", rollback, DETECTED, r"the log ends at seq 4, but the saved head saw seq 6", "saved_head"),
    Attack("forge-head-hash", forge_head_hash, DETECTED, r"record seq 6: its hash differs from the head file's"),
    Attack("strip-head-signature", strip_head_signature, None, r"the head file is not signed"),
    Attack("swap-in-other-log", swap_in_other_log, DETECTED, r"this is log '[^']+', not '[^']+': another log was put in its place", "log_id"),
    Attack("splice-from-other-log", splice_from_other_log, DETECTED,
           r"record at line 3 \(seq 3\): it belongs to log '[^']+', not '[^']+': it was copied from another log"),
    Attack("strip-one-signature", strip_one_signature, None, r"record at line 3 \(seq 3\): no signature"),
    Attack("strip-all-signatures", strip_all_signatures, None, r"record at line 1 \(seq 1\): no signature"),
    Attack("forged-append", forged_append, UNDETECTABLE, r"record at line 7 \(seq 7\): the signature does not verify"),
    Attack("forged-append-keeping-the-head", forged_append_keeping_the_head, UNDETECTABLE,
           r"record at line 7 \(seq 7\): the signature does not verify"),
    Attack("torn-line-in-the-middle", torn_line_in_the_middle, DETECTED, r"line 3: not a JSON record"),
    Attack("torn-line-joined-to-the-next", torn_line_joined_to_the_next, DETECTED, r"line 3: not a JSON record"),
    Attack("key-swap", nothing, None, r"record at line 1 \(seq 1\): the signature does not verify", wrong_key=True),
)

CASES = [
    pytest.param(attack, signed, id=f"{'signed' if signed else 'unsigned'}-{attack.name}")
    for attack in ATTACKS
    for signed in (True, False)
    if signed or attack.unsigned is not None
]


def command(world: World, attack: Attack, pinned: bool = True) -> list[str]:
    """`toolpolicy audit verify` as the verifier runs it: with the public key of a signed
    log (or another one, for key-swap) and the pin the attack needs."""
    args = ["audit", "verify", str(world.log)]
    if world.public is not None:
        public = world.public
        if attack.wrong_key:
            public = world.public.with_name("wrong.pub")
            generate_keypair(world.public.with_name("wrong.key"), public)
        args += ["--public-key", str(public)]
    if pinned and attack.pin == "count":
        args += ["--expect-at-least", str(RECORDS)]
    if pinned and attack.pin == "saved_head":
        args += ["--head", str(world.saved_head)]
    if pinned and attack.pin == "log_id":
        args += ["--log-id", world.log_id]
    return args


@pytest.mark.parametrize(("attack", "signed"), CASES)
def test_tampering(attack: Attack, signed: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    world = build_world(tmp_path, signed)
    assert main(command(world, replace(attack, wrong_key=False))) == 0, capsys.readouterr().out  # honest first
    capsys.readouterr()
    attack.tamper(world)
    code = main(command(world, attack))
    out = capsys.readouterr().out
    if signed or attack.unsigned == DETECTED:
        assert code == 1 and "FAILED" in out, out
        assert re.search(rf"problem: .*{attack.message}", out), out
        if attack.pin is not None:  # a state the key really signed: only the pin tells
            assert main(command(world, attack, pinned=False)) == 0
    else:
        assert code == 0 and INTEGRITY_ONLY in out, out
        assert f"`{attack.name}`" in DOCS.read_text(), f"docs/audit.md must list {attack.name} as undetectable unsigned"


# Honest logs: interrupted by a crash or a resume, they must verify (a false alarm here
# would train operators to ignore the verifier).


def torn_last_line(log: Path, key: Ed25519PrivateKey | None) -> None:
    with open(log, "a") as handle:
        handle.write('{"seq":7,"log_id":"')  # the writer died mid-record


def torn_then_reopened(log: Path, key: Ed25519PrivateKey | None) -> None:
    torn_last_line(log, key)
    with AuditLog(log, signing_key=key, durable=False) as writer:
        append(writer, 2)


def killed_before_the_head(log: Path, key: Ed25519PrivateKey | None) -> None:
    head = Path(f"{log}.head").read_bytes()
    with AuditLog(log, signing_key=key, durable=False) as writer:
        append(writer, 1)
    Path(f"{log}.head").write_bytes(head)


def killed_before_the_head_then_reopened(log: Path, key: Ed25519PrivateKey | None) -> None:
    killed_before_the_head(log, key)
    with AuditLog(log, signing_key=key, durable=False) as writer:
        append(writer, 1)


def resumed(log: Path, key: Ed25519PrivateKey | None) -> None:
    rewind_audit_log(log, EARLIER, signing_key=key)
    with AuditLog(log, signing_key=key, durable=False) as writer:
        append(writer, 3)


def resumed_twice_after_an_interrupted_rewind(log: Path, key: Ed25519PrivateKey | None) -> None:
    head = Path(f"{log}.head").read_bytes()
    rewind_audit_log(log, EARLIER, signing_key=key)
    Path(f"{log}.head").write_bytes(head)  # killed between the log and its head
    resumed(log, key)


def killed_while_creating(log: Path, key: Ed25519PrivateKey | None) -> None:
    """A new log's head is written before the log file: a kill between leaves only the head."""
    log.unlink()
    Path(f"{log}.head").unlink()
    with AuditLog(log, signing_key=key, durable=False, log_id="created"):
        pass
    log.unlink()


def killed_while_creating_then_reopened(log: Path, key: Ed25519PrivateKey | None) -> None:
    killed_while_creating(log, key)
    with AuditLog(log, signing_key=key, durable=False) as writer:
        append(writer, 2)


HONEST = {
    "as-written": (lambda log, key: None, None),
    "torn-last-line": (torn_last_line, "line 7 is torn"),
    "torn-last-line-then-reopened": (torn_then_reopened, None),
    "killed-between-record-and-head": (killed_before_the_head, "one record behind"),
    "killed-between-record-and-head-then-reopened": (killed_before_the_head_then_reopened, None),
    "resumed-rewind-and-continue": (resumed, None),
    "resumed-after-an-interrupted-rewind_audit_log": (resumed_twice_after_an_interrupted_rewind, None),
    "killed-while-creating": (killed_while_creating, None),
    "killed-while-creating-then-reopened": (killed_while_creating_then_reopened, None),
}


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
@pytest.mark.parametrize("history", list(HONEST))
def test_honest_logs_verify(history: str, signed: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    world = build_world(tmp_path, signed)
    happen, warning = HONEST[history]
    happen(world.log, world.key)
    log_id = "created" if history.startswith("killed-while-creating") else world.log_id
    args = ["audit", "verify", str(world.log), "--log-id", log_id]
    assert main(args + (["--public-key", str(world.public)] if world.public else [])) == 0
    out = capsys.readouterr().out
    assert "problem:" not in out, out
    assert (warning in out) if warning else ("warning:" not in out), out
