"""The proxy's ledger across restarts (proxy/ledger_file.py), on a real audit log written by a real gate."""

from __future__ import annotations

import json
from pathlib import Path

from toolpolicy.gate import AuditLog, Gate, Ledger, Policy, admit, settle
from toolpolicy.proxy.ledger_file import restored_ledger, save_ledger
from toolpolicy.types import ToolCall, ToolSpec

ECHO = ToolSpec("echo", "echo", {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
POLICY = Policy.from_yaml("""
default: allow
rules:
  - {id: no-secrets, effect: forbid, tools: [echo], when: "args.text == 'secret'", reason: no.}
limits:
  max_calls: {echo: 3}
""")


def session(log: Path, ledger: Ledger, texts: list[str]) -> Ledger:
    """Calls of echo through an audited gate, each settled as the proxy does."""
    with AuditLog(log, durable=False) as audit:
        gate = Gate(POLICY, [ECHO], audit=audit)
        for text in texts:
            call = ToolCall("echo", {"text": text})
            if admit(gate, ledger, call).runs:
                settle(ledger, call, ok=True)
    return ledger


def test_a_saved_ledger_comes_back_whole_and_catches_up_with_the_log(tmp_path: Path) -> None:
    log, saved = tmp_path / "audit.jsonl", tmp_path / "audit.jsonl.ledger.json"
    ledger = session(log, Ledger(), ["a", "secret"])
    with AuditLog(log, durable=False) as audit:
        save_ledger(saved, ledger, audit)
        back, note = restored_ledger(saved, audit)
    assert note is None and back.state() == ledger.state()
    session(log, Ledger(), ["b"])  # decided after the save (a proxy killed before saving again)
    with AuditLog(log, durable=False) as audit:
        caught_up, note = restored_ledger(saved, audit)
    assert note is not None and "counted the 1 later decision from" in note
    assert caught_up.counts == {"echo": 2} and caught_up.denials == {"echo": 1}
    assert caught_up.history[-1]["args"] == {"text": "secret"}  # the saved window; later decisions keep no arguments


def test_without_a_ledger_file_the_log_is_counted(tmp_path: Path) -> None:
    log, saved = tmp_path / "audit.jsonl", tmp_path / "audit.jsonl.ledger.json"
    session(log, Ledger(), ["a", "secret", "b"])
    with AuditLog(log, durable=False) as audit:
        rebuilt, note = restored_ledger(saved, audit)
        assert note is not None and "counted 3 decisions" in note
        assert rebuilt.counts == {"echo": 2} and rebuilt.denials == {"echo": 1}
        assert rebuilt.denied_before("echo", {"text": "secret"}) and not rebuilt.denied_before("echo", {"text": "a"})
        gate = Gate(POLICY, [ECHO], audit=audit)
        assert gate.decide(ToolCall("echo", {"text": "c"}), rebuilt).allowed  # the third of three
        settle(rebuilt, ToolCall("echo", {"text": "c"}), ok=True)
        assert gate.decide(ToolCall("echo", {"text": "d"}), rebuilt).rule_ids == ("limit:max_calls:echo",)


def test_a_ledger_of_another_log_is_not_used(tmp_path: Path) -> None:
    log, saved = tmp_path / "audit.jsonl", tmp_path / "audit.jsonl.ledger.json"
    other = session(tmp_path / "other.jsonl", Ledger(), ["x", "y", "z"])
    with AuditLog(tmp_path / "other.jsonl", durable=False) as audit:
        save_ledger(saved, other, audit)
    session(log, Ledger(), ["a"])
    with AuditLog(log, durable=False) as audit:
        rebuilt, note = restored_ledger(saved, audit)
    assert note is not None and "does not belong to this log" in note and rebuilt.counts == {"echo": 1}
    body = json.loads(saved.read_text())
    body["seq"] = 99  # a stamp past the log's end: records were cut
    saved.write_text(json.dumps(body))
    with AuditLog(log, durable=False) as audit:
        assert restored_ledger(saved, audit)[0].counts == {"echo": 1}


def test_a_ledger_saved_at_the_logs_end_is_taken_without_reading_the_log(tmp_path: Path, monkeypatch) -> None:
    """The usual start (the last stop saved after the last record): a long log is not read."""
    import toolpolicy.proxy.ledger_file as ledger_file

    log, saved = tmp_path / "audit.jsonl", tmp_path / "audit.jsonl.ledger.json"
    ledger = session(log, Ledger(), ["a", "secret"])
    with AuditLog(log, durable=False) as audit:
        save_ledger(saved, ledger, audit)
    read: list[Path] = []
    monkeypatch.setattr(ledger_file, "_records", lambda path: read.append(path) or [])
    with AuditLog(log, durable=False) as audit:
        back, note = restored_ledger(saved, audit)
    assert read == [] and note is None and back.state() == ledger.state()
    session(log, Ledger(), ["b"])  # a record after the stamp: now the log must be read
    with AuditLog(log, durable=False) as audit:
        restored_ledger(saved, audit)
    assert read == [log]
