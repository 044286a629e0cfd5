"""The audit log: the verifier catches an edited, deleted, reordered or truncated record,
a bad signature, a forged or missing head, a log or record from another log, and (given
what the verifier saw before) a rollback; a killed writer or an interrupted rewind leaves
a log that verifies or says what happened, and reopening or rewinding again repairs it.
Every kind of tampering, one by one: tests/adversarial/test_audit_tampering.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolpolicy.cli import main
from toolpolicy.gate import AuditError, AuditLog, Decision, generate_keypair, rewind_audit_log, verify
from toolpolicy.gate.audit import record_hash
from toolpolicy.gate.digest import ZERO_HASH, args_digest
from toolpolicy.types import ToolCall

POLICY_HASH = "ab" * 32


def write_log(path: Path, count: int = 5, **kwargs: object) -> list[dict]:
    with AuditLog(path, durable=False, **kwargs) as log:  # type: ignore[arg-type]
        return [
            log.append(
                Decision("allow" if i % 2 else "deny", (f"rule-{i}",), f"reason {i}"),
                ToolCall("read_file", {"path": f"/work/{i}"}),
                POLICY_HASH,
            )
            for i in range(count)
        ]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def rewrite(path: Path, new_lines: list[str]) -> None:
    path.write_text("".join(new_lines))


def test_a_clean_log_verifies_and_records_have_the_promised_fields(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    records = write_log(log)
    result = verify(log)
    assert result.ok and result.records == 5 and result.last_seq == 5 and not result.warnings, str(result)
    first = json.loads(lines(log)[0])
    assert list(first) == [
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
        "hash",
    ]
    assert first["prev_hash"] == ZERO_HASH and first["seq"] == 1
    assert first["args_digest"] == args_digest({"path": "/work/0"})
    assert records[1]["prev_hash"] == records[0]["hash"] == record_hash(first)
    head = json.loads((tmp_path / "audit.jsonl.head").read_text())
    assert head == {"log_id": first["log_id"], "seq": 5, "hash": records[-1]["hash"]}
    assert {r["log_id"] for r in records} == {result.log_id} and re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{16}", first["log_id"])


def test_an_edited_record_is_caught(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log)
    content = lines(log)
    assert '"decision":"deny"' in content[2]
    content[2] = content[2].replace('"decision":"deny"', '"decision":"allow"')
    rewrite(log, content)
    result = verify(log)
    assert not result.ok and any("line 3" in p and "edited" in p for p in result.problems), str(result)


def test_an_edited_record_with_a_recomputed_hash_breaks_the_next_link(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log)
    content = lines(log)
    record = json.loads(content[1])
    record["reason"] = "nothing to see"
    record["hash"] = record_hash(record)
    content[1] = json.dumps(record) + "\n"
    rewrite(log, content)
    result = verify(log)
    assert not result.ok and any("line 3" in p and "prev_hash" in p for p in result.problems), str(result)


def test_a_deleted_record_is_caught(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log)
    content = lines(log)
    del content[2]
    rewrite(log, content)
    result = verify(log)
    assert not result.ok and any("expected seq 3" in p for p in result.problems), str(result)


def test_a_deleted_first_record_is_caught(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log)
    rewrite(log, lines(log)[1:])
    assert not verify(log).ok


def test_reordered_records_are_caught(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log)
    content = lines(log)
    content[1], content[3] = content[3], content[1]
    rewrite(log, content)
    result = verify(log)
    assert not result.ok and any("reordered" in p for p in result.problems), str(result)


def test_truncation_is_caught_through_the_head_file(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log)
    rewrite(log, lines(log)[:3])
    result = verify(log)
    assert not result.ok and any("truncated" in p for p in result.problems), str(result)
    with pytest.raises(AuditError, match="truncated"):
        AuditLog(log)  # and the writer refuses to continue it


def test_a_missing_head_file_is_a_problem_and_the_writer_refuses_to_continue(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log)
    (tmp_path / "audit.jsonl.head").unlink()
    result = verify(log)
    assert not result.ok and any("no readable head file" in p for p in result.problems), str(result)
    with pytest.raises(AuditError, match="no head file"):
        AuditLog(log)


def test_signatures_verify_and_a_bad_one_is_caught(tmp_path: Path) -> None:
    private, public = tmp_path / "key.pem", tmp_path / "key.pub.pem"
    generate_keypair(private, public)
    assert oct(private.stat().st_mode & 0o777) == "0o600"
    log = tmp_path / "audit.jsonl"
    write_log(log, signing_key=private)
    result = verify(log, public_key=public)
    assert result.ok and result.signatures_checked, str(result)

    other_private, other_public = tmp_path / "other.pem", tmp_path / "other.pub.pem"
    generate_keypair(other_private, other_public)
    assert not verify(log, public_key=other_public).ok  # the wrong key

    # an attacker rebuilds the whole chain consistently but cannot sign it
    content = [json.loads(line) for line in lines(log)]
    previous = ZERO_HASH
    for record in content:
        record["reason"] = "rewritten"
        record["prev_hash"] = previous
        record["hash"] = previous = record_hash(record)
    rewrite(log, [json.dumps(r) + "\n" for r in content])
    (tmp_path / "audit.jsonl.head").write_text(json.dumps({"log_id": content[0]["log_id"], "seq": 5, "hash": previous}))
    assert verify(log).ok  # the chain alone cannot tell...
    result = verify(log, public_key=public)
    assert not result.ok and all("signature does not verify" in p or "head file is not signed" in p for p in result.problems)
    assert sum("signature does not verify" in p for p in result.problems) == 5, str(result)

    unsigned = tmp_path / "unsigned.jsonl"
    write_log(unsigned)
    assert any("no signature" in p for p in verify(unsigned, public_key=public).problems)


def test_reopening_continues_the_chain(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, 3)
    write_log(log, 2)
    result = verify(log)
    assert result.ok and result.records == 5, str(result)


def test_a_torn_last_line_is_reported_and_repaired_on_reopen(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, 3)
    with open(log, "a") as handle:
        handle.write('{"seq":4,"time":"2025-')  # the writer died mid-record
    result = verify(log)
    assert result.ok and result.torn_tail and result.records == 3
    assert any("line 4 is torn" in w for w in result.warnings), str(result)

    write_log(log, 1)  # reopening moves the torn bytes aside and continues from seq 3
    assert (tmp_path / "audit.jsonl.torn").read_text().startswith('{"seq":4,"time":"2025-')
    result = verify(log)
    assert result.ok and not result.torn_tail and result.records == 4, str(result)


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    with AuditLog(log), pytest.raises(AuditError, match="another process"):
        AuditLog(log)


def test_garbage_lines_are_problems_not_crashes(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, 3)
    content = lines(log)
    content.insert(1, "not json\n")
    content.insert(2, "[1, 2]\n")
    content.insert(3, "\n")
    rewrite(log, content)
    result = verify(log)
    assert not result.ok and len(result.problems) >= 3, str(result)
    assert not verify(tmp_path / "missing.jsonl").ok


def test_a_log_that_lost_everything_but_its_head_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, 2)
    log.write_text('{"seq":1,"ti')  # only a torn fragment left
    with pytest.raises(AuditError, match="truncated"):
        AuditLog(log)
    assert not verify(log).ok


# Signed heads, pins and log ids: what a writer of the files without the key cannot fake.


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    private, public = tmp_path / "audit.key", tmp_path / "audit.pub"
    generate_keypair(private, public)
    return private, public


def head_of(log: Path) -> dict:
    return json.loads(Path(f"{log}.head").read_text())


def test_an_emptied_signed_log_without_its_head_fails(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, signing_key=keys[0])
    log.write_text("")
    Path(f"{log}.head").unlink()
    result = verify(log, public_key=keys[1])
    assert not result.ok and any("no readable head file" in p for p in result.problems), str(result)


def test_a_cut_end_with_a_consistent_unsigned_head_fails_on_a_signed_log(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log = tmp_path / "audit.jsonl"
    records = write_log(log, signing_key=keys[0])
    rewrite(log, lines(log)[:3])
    forged = {"log_id": records[2].get("log_id"), "seq": 3, "hash": records[2]["hash"]}
    Path(f"{log}.head").write_text(json.dumps(forged))
    result = verify(log, public_key=keys[1])
    assert not result.ok and any("head file is not signed" in p for p in result.problems), str(result)
    forged["sig"] = records[2]["sig"]  # the last remaining record's signature, offered as the head's
    Path(f"{log}.head").write_text(json.dumps(forged))
    result = verify(log, public_key=keys[1])
    assert not result.ok and any("head file: its signature does not verify" in p for p in result.problems), str(result)
    with pytest.raises(AuditError, match="head file"):
        AuditLog(log, signing_key=keys[0])


def test_the_head_is_signed_and_verifies(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log = tmp_path / "audit.jsonl"
    records = write_log(log, signing_key=keys[0])
    head = head_of(log)
    assert head["seq"] == 5 and head["hash"] == records[-1]["hash"] and head["sig"] != records[-1]["sig"]
    result = verify(log, public_key=keys[1])
    assert result.ok and result.signatures_checked and not result.warnings, str(result)


def test_a_rollback_to_an_earlier_signed_state_is_caught_by_a_pin(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """A log and head put back to a state the key really signed verify on their own (no
    signature can tell); what the verifier saw before catches it."""
    log = tmp_path / "audit.jsonl"
    write_log(log, 3, signing_key=keys[0])
    earlier_log, earlier_head = log.read_bytes(), Path(f"{log}.head").read_bytes()
    write_log(log, 2, signing_key=keys[0])
    saved = tmp_path / "saved.head"
    saved.write_bytes(Path(f"{log}.head").read_bytes())
    assert verify(log, public_key=keys[1], expect_at_least=5, saved_head=saved).ok

    log.write_bytes(earlier_log)
    Path(f"{log}.head").write_bytes(earlier_head)
    assert verify(log, public_key=keys[1]).ok  # a genuine earlier state
    by_count = verify(log, public_key=keys[1], expect_at_least=5)
    assert not by_count.ok and any("at least 5 records were expected" in p for p in by_count.problems), str(by_count)
    by_head = verify(log, public_key=keys[1], saved_head=saved)
    assert not by_head.ok and any("the saved head saw seq 5" in p for p in by_head.problems), str(by_head)


def test_a_saved_head_pins_an_unsigned_log_up_to_its_seq(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, 4)
    saved = tmp_path / "saved.head"
    saved.write_bytes(Path(f"{log}.head").read_bytes())
    content = [json.loads(line) for line in lines(log)]
    previous = ZERO_HASH
    for record in content:  # edit record 2 and rebuild the whole chain and the head
        record["reason"] = "rewritten" if record["seq"] == 2 else record["reason"]
        record["prev_hash"] = previous
        record["hash"] = previous = record_hash(record)
    rewrite(log, [json.dumps(r) + "\n" for r in content])
    Path(f"{log}.head").write_text(json.dumps({"log_id": content[0]["log_id"], "seq": 4, "hash": previous}))
    assert verify(log).ok  # integrity only: a consistent rebuild passes
    result = verify(log, saved_head=saved)
    assert not result.ok and any("record seq 4: its hash differs from the saved head's" in p for p in result.problems)


def test_unsigned_reports_say_integrity_only(tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    unsigned, signed = tmp_path / "unsigned.jsonl", tmp_path / "signed.jsonl"
    write_log(unsigned)
    write_log(signed, signing_key=keys[0])
    assert "integrity only, no authenticity" in str(verify(unsigned))
    assert "integrity only, no authenticity" in str(verify(signed))  # no key given: nothing was authenticated
    assert "integrity only" not in str(verify(signed, public_key=keys[1]))
    assert main(["audit", "verify", str(unsigned)]) == 0
    out = capsys.readouterr().out
    assert "OK: 5 records, last seq 5, log id" in out and "integrity only, no authenticity" in out


def test_a_log_swapped_for_another_signed_with_the_same_key_fails_against_its_id(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log, other = tmp_path / "audit.jsonl", tmp_path / "other.jsonl"
    log_id = write_log(log, signing_key=keys[0])[0]["log_id"]
    write_log(other, signing_key=keys[0])
    assert verify(log, public_key=keys[1], log_id=log_id).ok
    log.write_bytes(other.read_bytes())
    Path(f"{log}.head").write_bytes(Path(f"{other}.head").read_bytes())
    result = verify(log, public_key=keys[1], log_id=log_id)
    assert not result.ok and result.log_id != log_id, str(result)
    assert result.problems == (f"this is log {result.log_id!r}, not {log_id!r}: another log was put in its place",)


def test_a_record_spliced_from_another_log_is_named(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log, other = tmp_path / "audit.jsonl", tmp_path / "other.jsonl"
    write_log(log, signing_key=keys[0])
    write_log(other, signing_key=keys[0])
    content = lines(log)
    content[2] = lines(other)[2]  # same seq, validly signed, another log
    rewrite(log, content)
    result = verify(log, public_key=keys[1])
    assert not result.ok and any("line 3" in p and "copied from another log" in p for p in result.problems), str(result)


def test_reopening_keeps_the_id_and_refuses_another(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, 2, log_id="run-7")
    write_log(log, 2)  # no id given: the log keeps its own
    assert verify(log, log_id="run-7").ok and verify(log).log_id == "run-7"
    with pytest.raises(AuditError, match="it is log 'run-7', not 'run-8'"):
        AuditLog(log, log_id="run-8")
    with pytest.raises(ValueError, match="log id"):
        AuditLog(tmp_path / "new.jsonl", log_id='bad"id')


def test_a_signed_log_is_continued_only_with_its_key(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    signed, unsigned = tmp_path / "signed.jsonl", tmp_path / "unsigned.jsonl"
    write_log(signed, 2, signing_key=keys[0])
    write_log(unsigned, 2)
    with pytest.raises(AuditError, match="the log is signed"):
        AuditLog(signed)
    with pytest.raises(AuditError, match="not signed"):
        AuditLog(unsigned, signing_key=keys[0])
    other = tmp_path / "other.key"
    generate_keypair(other, tmp_path / "other.pub")
    with pytest.raises(AuditError, match="signature does not verify"):
        AuditLog(signed, signing_key=other)


# Crash safety: an honest log interrupted anywhere still verifies, or says what happened.


def test_a_writer_killed_between_record_and_head_warns_and_reopening_repairs(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, 3, signing_key=keys[0])
    head_before = Path(f"{log}.head").read_bytes()
    write_log(log, 1, signing_key=keys[0])
    Path(f"{log}.head").write_bytes(head_before)  # the fourth record is whole, its head was never written
    result = verify(log, public_key=keys[1])
    assert result.ok and any("one record behind" in w for w in result.warnings), str(result)
    write_log(log, 1, signing_key=keys[0])
    result = verify(log, public_key=keys[1])
    assert result.ok and result.records == 5 and not result.warnings, str(result)


def test_a_writer_killed_while_creating_a_log_leaves_one_that_verifies(
    tmp_path: Path, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head of a new log is written before the log file is created."""
    log = tmp_path / "audit.jsonl"

    real_open = os.open

    def killed(path: object, *args: object, **kwargs: object) -> int:
        if Path(str(path)) == log:
            raise SystemExit("killed as the log file was being created")
        return real_open(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", killed)
        with pytest.raises(SystemExit):
            AuditLog(log, signing_key=keys[0], durable=False, log_id="new")
    assert not log.exists()
    result = verify(log, public_key=keys[1], log_id="new")
    assert result.ok and result.records == 0, str(result)
    write_log(log, 2, signing_key=keys[0])
    assert verify(log, public_key=keys[1], log_id="new").ok


def test_a_signed_log_rewound_and_continued_verifies(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log = tmp_path / "audit.jsonl"
    kept = write_log(log, 3, signing_key=keys[0])
    saved = tmp_path / "saved.head"
    write_log(log, 2, signing_key=keys[0])
    saved.write_bytes(Path(f"{log}.head").read_bytes())
    replayed = rewind_audit_log(log, 3, signing_key=keys[0])
    assert replayed is not None and len(replayed.read_text().splitlines()) == 3
    result = verify(log, public_key=keys[1])
    assert result.ok and result.records == 3 and result.last_hash == kept[-1]["hash"], str(result)
    write_log(log, 2, signing_key=keys[0])
    result = verify(log, public_key=keys[1], expect_at_least=5)
    assert result.ok and result.records == 5 and not result.warnings, str(result)
    assert not verify(log, public_key=keys[1], saved_head=saved).ok  # a rewind is a rollback: the pin says so


def test_rewinding_a_signed_log_needs_its_key(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, 4, signing_key=keys[0])
    with pytest.raises(AuditError, match="the log is signed"):
        rewind_audit_log(log, 2)
    assert verify(log, public_key=keys[1]).records == 4  # refused before anything moved


def test_an_interrupted_rewind_is_reported_as_such_and_rewinding_again_finishes_it(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, 5, signing_key=keys[0])
    head_before = Path(f"{log}.head").read_bytes()
    rewind_audit_log(log, 2, signing_key=keys[0])
    Path(f"{log}.head").write_bytes(head_before)  # killed after the log was replaced, before its head
    result = verify(log, public_key=keys[1])
    assert not result.ok and any("a rewind to seq 2 was interrupted" in p for p in result.problems), str(result)
    assert rewind_audit_log(log, 2, signing_key=keys[0]) is None  # nothing left to cut; the head is finished
    result = verify(log, public_key=keys[1])
    assert result.ok and result.records == 2, str(result)
    write_log(log, 1, signing_key=keys[0])
    assert verify(log, public_key=keys[1]).ok


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_a_killed_writer_leaves_a_verifiable_log(signed: bool, tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """A real process appending (durable) in a loop, killed with SIGKILL: whatever it managed
    to write verifies (at most a torn last line or a head one behind) and can be reopened."""
    log = tmp_path / "audit.jsonl"
    key = str(keys[0]) if signed else None
    script = f"""
from toolpolicy.gate import AuditLog, Decision
from toolpolicy.types import ToolCall
log = AuditLog({str(log)!r}, signing_key={key!r})
print("ready", flush=True)
i = 0
while True:
    log.append(Decision("allow", ("r",), "x" * 5000), ToolCall("t", {{"i": i}}), "0" * 64)
    i += 1
"""
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env={**os.environ})
    assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
    deadline = time.monotonic() + 60
    while (not log.exists() or log.stat().st_size < 200_000) and time.monotonic() < deadline:
        time.sleep(0.01)
    child.kill()
    child.wait()
    public = keys[1] if signed else None
    result = verify(log, public_key=public)
    assert result.ok and result.records > 10, str(result)
    with AuditLog(log, signing_key=key) as reopened:
        reopened.append(Decision("deny"), ToolCall("t", {}), "0" * 64)
    result = verify(log, public_key=public)
    assert result.ok and not result.warnings, str(result)


# The command: exit codes, pins, key generation.


def test_audit_verify_command_pins_and_exit_codes(tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "audit.jsonl"
    log_id = write_log(log, signing_key=keys[0])[0]["log_id"]
    saved = tmp_path / "saved.head"
    saved.write_bytes(Path(f"{log}.head").read_bytes())
    signed = ["audit", "verify", str(log), "--public-key", str(keys[1])]
    assert main([*signed, "--log-id", log_id, "--expect-at-least", "5", "--head", str(saved)]) == 0
    out = capsys.readouterr().out
    assert f"OK: 5 records, signatures checked, last seq 5, log id {log_id}" in out and "integrity only" not in out
    assert main([*signed, "--log-id", "another"]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert main([*signed, "--expect-at-least", "6"]) == 1
    assert "at least 6 records were expected" in capsys.readouterr().out
    content = lines(log)
    content[3] = content[3].replace('"reason":"reason 3"', '"reason":"reason 33"')
    rewrite(log, content)
    assert main(signed) == 1
    assert "problem: record at line 4 (seq 4): hash does not match the record's content" in capsys.readouterr().out
    assert main([*signed, "--head", str(tmp_path / "nope.head")]) == 1
    assert "cannot read the saved head" in capsys.readouterr().out


def test_audit_keygen_writes_a_usable_pair_and_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    assert main(["audit", "keygen", str(private), str(public)]) == 0
    assert oct(private.stat().st_mode & 0o777) == "0o600"
    log = tmp_path / "audit.jsonl"
    write_log(log, 2, signing_key=private)
    assert verify(log, public_key=public).ok
    before = private.read_bytes()
    assert main(["audit", "keygen", str(private), str(public)]) == 2
    assert "exists" in capsys.readouterr().err and private.read_bytes() == before


def test_a_log_restores_its_own_state_and_refuses_another_logs(tmp_path: Path) -> None:
    """A checkpoint keeps `AuditLog.state()`; `restore` cuts the log back to it, and refuses a
    log at that path that is not the one the state was taken of (another id, or the record
    at that seq rewritten by another chain)."""
    log = tmp_path / "audit.jsonl"
    write_log(log, 3)
    with AuditLog(log, durable=False) as opened:
        state = opened.state()
    assert state == {"seq": 3, "log_id": opened.log_id, "hash": opened.last_hash}
    write_log(log, 4)  # steps after the checkpoint
    assert AuditLog.restore(log, state) is not None
    result = verify(log)
    assert result.ok and result.records == 3 and result.last_hash == state["hash"], str(result)

    other = tmp_path / "other.jsonl"
    write_log(other, 5)
    with pytest.raises(AuditError, match="the checkpoint was taken of log"):
        AuditLog.restore(other, state)
    with pytest.raises(AuditError, match="its hash differs"):
        AuditLog.restore(other, {**state, "log_id": None})
    assert verify(other).records == 5  # refused before anything moved
