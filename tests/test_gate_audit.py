"""The audit log: the verifier catches an edited, deleted, reordered or truncated record
and a bad signature; a torn last line from a killed writer is reported and repaired."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolpolicy.gate import AuditError, AuditLog, Decision, generate_keypair, verify
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
    assert json.loads((tmp_path / "audit.jsonl.head").read_text()) == {"seq": 5, "hash": records[-1]["hash"]}


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


def test_without_a_head_file_truncation_is_a_warning(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log)
    (tmp_path / "audit.jsonl.head").unlink()
    result = verify(log)
    assert result.ok and any("no readable head file" in w for w in result.warnings)


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
    (tmp_path / "audit.jsonl.head").write_text(json.dumps({"seq": 5, "hash": previous}))
    assert verify(log).ok  # the chain alone cannot tell...
    result = verify(log, public_key=public)
    assert not result.ok and all("signature does not verify" in p for p in result.problems), str(result)

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


def test_a_killed_writer_leaves_a_verifiable_log(tmp_path: Path) -> None:
    """A real process appending in a loop, killed with SIGKILL: whatever it managed to
    write verifies (at most a torn last line) and the log can be reopened."""
    log = tmp_path / "audit.jsonl"
    script = f"""
import sys
from toolpolicy.gate import AuditLog, Decision
from toolpolicy.types import ToolCall
log = AuditLog({str(log)!r})
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
    result = verify(log)
    assert result.ok and result.records > 10, str(result)
    with AuditLog(log) as reopened:
        reopened.append(Decision("deny"), ToolCall("t", {}), "0" * 64)
    assert verify(log).ok


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
