"""`toolpolicy gate check` and `toolpolicy audit verify` through the real command."""

from __future__ import annotations

import json
from pathlib import Path

from toolpolicy.cli import main
from toolpolicy.gate import AuditLog, Gate, Ledger, Policy
from toolpolicy.envs import CalcEnv
from toolpolicy.types import ToolCall

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ROOT / "examples" / "policies"


def test_gate_check_prints_the_decision_and_exits_by_effect(capsys):
    base = ["gate", "check", str(POLICIES / "workspace.yaml"), "--tools", str(POLICIES / "workspace_tools.json")]
    assert main([*base, "--tool", "read_file", "--args", '{"path": "../../etc/shadow"}']) == 1
    out = capsys.readouterr().out
    assert '"effect": "deny"' in out and "no-path-traversal" in out
    assert main([*base, "--tool", "read_file", "--args", '{"path": "notes.txt"}']) == 0
    assert '"effect": "allow"' in capsys.readouterr().out
    assert main([*base, "--tool", "read_file", "--args", "{not json"]) == 2
    assert "--args" in capsys.readouterr().err


def test_gate_check_of_another_environments_tool_says_to_give_env_or_tools(capsys):
    hotel = ROOT / "src" / "toolpolicy" / "envs" / "hotel" / "policy.yaml"
    call = ["--tool", "cancel", "--args", '{"booking_id": "B1"}']
    assert main(["gate", "check", str(POLICIES / "workspace.yaml"), *call]) == 2  # calc's tools, the default
    err = capsys.readouterr().err
    assert "--tool cancel: environment 'calc' (--env, default calc) has no tool of that name" in err
    assert "give --env ENV" in err and "--tools FILE" in err
    calculator = ["--tool", "calculator", "--args", '{"expression": "1+1"}']
    assert main(["gate", "check", str(hotel), *calculator]) == 2  # the policy names hotel's tools: calc has none
    assert "the tools came from environment 'calc'" in capsys.readouterr().err
    assert main(["gate", "check", str(hotel), "--env", "hotel", *call]) in (0, 1)
    assert '"effect"' in capsys.readouterr().out


def test_gate_check_resolves_symlinks_in_the_work_folder_it_is_given(tmp_path: Path, capsys):
    """A name that is a symlink out of the folder passes a check by spelling alone; with
    --work-folder the check sees the folder on disk as the tools would, and denies it."""
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "secret.txt").write_text("not the agent's")
    (work / "notes.txt").symlink_to(tmp_path / "secret.txt")
    base = ["gate", "check", str(POLICIES / "workspace.yaml"), "--tools", str(POLICIES / "workspace_tools.json")]
    call = ["--tool", "read_file", "--args", '{"path": "notes.txt"}']
    assert main([*base, *call]) == 0
    capsys.readouterr()
    assert main([*base, "--work-folder", str(work), *call]) == 1
    assert '"effect": "deny"' in capsys.readouterr().out
    assert main([*base, "--work-folder", str(tmp_path / "missing"), *call]) == 2
    assert "--work-folder" in capsys.readouterr().err


def test_audit_verify_catches_an_edited_record(tmp_path: Path, capsys):
    log = tmp_path / "audit.jsonl"
    gate = Gate(Policy.from_dict({"default": "allow"}, "p"), CalcEnv().tools, audit=AuditLog(log))
    for expression in ("1 + 1", "2 * 3", "4 - 1"):
        gate.decide(ToolCall("calculator", {"expression": expression}), Ledger())
    assert main(["audit", "verify", str(log)]) == 0
    assert "OK: 3 records" in capsys.readouterr().out
    lines = log.read_text().splitlines()
    record = json.loads(lines[1])
    record["decision"] = "deny"
    lines[1] = json.dumps(record)
    log.write_text("\n".join(lines) + "\n")
    assert main(["audit", "verify", str(log)]) == 1
    assert "FAILED" in capsys.readouterr().out
