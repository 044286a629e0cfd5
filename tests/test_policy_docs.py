"""docs/policy.md cannot drift: every YAML block on it loads, and the decisions the page
states about each block are made. The deployment example runs behind `gate serve`."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

import toolpolicy
from toolpolicy.gate import Gate, Ledger, Policy, admit, settle
from toolpolicy.types import ToolCall, ToolSpec

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "policy.md"
SOURCE = Path(toolpolicy.__file__).resolve().parents[1]  # the proxy process runs the code under test


def _spec(name: str, **properties: str) -> ToolSpec:
    schema = {
        "type": "object",
        "properties": {key: {"type": kind} for key, kind in properties.items()},
        "required": list(properties),
        "additionalProperties": False,
    }
    return ToolSpec(name, name, schema)


SPECS = [
    _spec("read_file", path="string"),
    _spec("write_file", path="string", content="string"),
    _spec("run_shell", command="string"),
    _spec("send_email", to="string", body="string"),
    _spec("refund", booking="string", amount="integer"),
    _spec("verify", guest="string"),
]


def blocks() -> dict[str, str]:
    """The page's YAML blocks by the name on their first line (`# policy: NAME`)."""
    found = re.findall(r"^```yaml\n(.*?)^```", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)
    named = {}
    for text in found:
        first = text.splitlines()[0]
        assert first.startswith("# policy: "), f"a YAML block on docs/policy.md must start with '# policy: NAME': {first!r}"
        name = first.removeprefix("# policy: ").strip()
        assert name not in named, f"two blocks named {name!r}"
        named[name] = text
    return named


def gate(name: str, **kwargs: Any) -> Gate:
    return Gate(Policy.from_yaml(blocks()[name], f"docs/policy.md#{name}"), SPECS, strict_tool_names=False, **kwargs)


def run(g: Gate, ledger: Ledger, tool: str, ok: bool = True, **arguments: Any) -> tuple[str, ...]:
    """Decide a call and record it as the engine does; the deciding ids ("" when allowed by a rule)."""
    call = ToolCall(tool, arguments)
    admission = admit(g, ledger, call)
    if admission.runs:
        settle(ledger, call, ok)
    return admission.decision.rule_ids if not admission.decision.allowed else ("allowed", *admission.decision.rule_ids)


def test_every_yaml_block_loads_and_is_checked_here() -> None:
    named = blocks()
    for name, text in named.items():
        Policy.from_yaml(text, f"docs/policy.md#{name}")  # raises PolicyError naming the problem
    checked = {"permit", "forbid", "ask", "every-tool", "facts", "functions", "whole-values", "parse", "limits", "session", "redact", "notes"}
    assert set(named) == checked, "a new block on docs/policy.md needs its decisions checked in this file"


def test_permit_forbid_ask_and_every_tool() -> None:
    g, ledger = gate("permit"), Ledger()
    assert run(g, ledger, "read_file", path="/work/a.txt") == ("allowed", "read-work")
    assert run(g, ledger, "read_file", path="/etc/passwd") == ("default:deny",)
    assert run(g, ledger, "write_file", path="/work/a.txt", content="x") == ("default:deny",)

    g = gate("forbid")
    denied = g.decide(ToolCall("run_shell", {"command": "rm -rf /"}))
    assert denied.rule_ids == ("no-rm",)
    assert denied.observation() == (
        "Tool call denied by policy (rule no-rm): deleting files is not allowed. Hint: move the file to trash/ instead."
    )
    assert g.decide(ToolCall("run_shell", {"command": "ls"})).rule_ids == ("shell-allowed",)

    g = gate("ask")
    assert g.decide(ToolCall("send_email", {"to": "ann@example.com", "body": "hi"})).allowed
    outside = ToolCall("send_email", {"to": "x@evil.test", "body": "hi"})
    assert g.evaluate(outside).effect == "ask"
    refused = g.decide(outside)
    assert refused.effect == "deny" and "(needs approval; none is available)" in refused.reason
    assert gate("ask", approver=lambda call, decision: True).decide(outside).allowed

    g, ledger = gate("every-tool"), Ledger()
    ledger.record(ToolCall("verify", {"guest": "G1"}), "denied")
    assert run(g, ledger, "verify", guest="G1") == ("no-repeats",)
    assert run(g, ledger, "verify", guest="G2") == ("allowed", "default:allow")


def test_what_conditions_read() -> None:
    g, ledger = gate("facts"), Ledger()
    assert run(g, ledger, "refund", booking="B1", amount=50) == ("default:deny",)
    assert run(g, ledger, "verify", guest="G1") == ("allowed", "verify-any-guest")
    ledger.learn({"verified": True})  # what a verify tool records with ToolResult(..., facts=...)
    assert run(g, ledger, "refund", booking="B1", amount=50) == ("allowed", "refunds-after-verification")
    assert run(g, ledger, "refund", booking="B1", amount=50) == ("one-refund",)

    g, ledger = gate("facts"), Ledger()
    for _ in range(3):
        assert run(g, ledger, "refund", booking="B1", amount=50) == ("default:deny",)
    assert run(g, ledger, "refund", booking="B1", amount=50) == ("stop-probing",)

    g, ledger = gate("facts"), Ledger()
    assert run(g, ledger, "write_file", path="a.txt", content="x") == ("read-before-write",)
    assert run(g, ledger, "read_file", path="a.txt") == ("allowed", "files")
    assert run(g, ledger, "write_file", path="a.txt", content="x") == ("allowed", "files")


def test_whole_values() -> None:
    g = gate("whole-values")
    facts = {"request": "Mail ann@example.com the plan", "private": ["hunter22"], "links": ["www.example.com/plan"]}
    decide = lambda **arguments: run(g, Ledger(facts=dict(facts)), "send_email", **arguments)  # noqa: E731
    assert decide(to="ann@example.com", body="the plan: www.example.com/plan") == ("allowed", "mail-named-people")
    assert decide(to="ann@example.co", body="hi") == ("default:deny",)
    assert decide(to="ann@example.com.evil.test", body="hi") == ("default:deny",)
    assert decide(to="ann@example.com", body="H U N T E R 2 2") == ("no-secrets-out",)
    assert decide(to="ann@example.com", body="aHVudGVyMjI=") == ("no-secrets-out",)
    assert decide(to="ann@example.com", body="see www.example.com/plan and www.evil.test") == ("links-we-know",)


def test_functions() -> None:
    g = gate("functions")
    mail = lambda to, body="hi": g.decide(ToolCall("send_email", {"to": to, "body": body})).rule_ids  # noqa: E731
    assert mail("ann@example.com") == ("short-internal-mail",)
    assert mail("ann@example.com", "x" * 201) == ("default:deny",)
    assert mail("ann@example.com.evil.test") == ("default:deny",)
    assert g.decide(ToolCall("refund", {"booking": "2025-06-01", "amount": 5})).rule_ids == ("no-weekend-bookings",)
    assert g.decide(ToolCall("refund", {"booking": "2025-06-02", "amount": 5})).rule_ids == ("refunds",)


def test_parsed_arguments(tmp_path: Path) -> None:
    g = gate("parse", work_folder=tmp_path)
    read = lambda path: g.decide(ToolCall("read_file", {"path": path})).rule_ids  # noqa: E731
    shell = lambda command: g.decide(ToolCall("run_shell", {"command": command})).rule_ids  # noqa: E731
    assert read("notes.txt") == ("files-in-work",)
    assert read("../etc/passwd") == ("default:deny",) and read("docs/%2e%2e/x") == ("default:deny",)
    assert read(".ENV") == ("no-env-files",)
    assert shell("ls -la") == ("known-commands",) and shell("ls; rm -rf /") == ("default:deny",)


def test_limits_count_per_episode_and_a_forbid_is_named_first() -> None:
    g, ledger = gate("limits"), Ledger()
    assert run(g, ledger, "write_file", path="a", content="x")[0] == "allowed"
    assert run(g, ledger, "read_file", path="secret.txt") == ("no-secrets",)
    assert run(g, ledger, "read_file", path="secret.txt") == ("no-secrets",)
    assert run(g, ledger, "write_file", path="b", content="x")[0] == "allowed"  # denied calls used none of max_calls
    assert run(g, ledger, "write_file", path="c", content="x") == ("limit:max_calls:write_file",)
    assert run(g, ledger, "read_file", path="secret.txt") == ("no-secrets",)
    assert run(g, ledger, "read_file", path="secret.txt") == ("no-secrets",)  # the fifth denial
    assert run(g, ledger, "read_file", path="notes.txt") == ("limit:max_denials:*",)
    assert run(g, ledger, "read_file", path="secret.txt") == ("no-secrets",)  # past every limit, the rule is named
    assert run(g, ledger, "write_file", path="d", content="x") == ("limit:max_calls:write_file", "limit:max_denials:*")


def test_session_totals() -> None:
    g, ledger = gate("session"), Ledger()
    assert run(g, ledger, "refund", booking="B1", amount=300) == ("allowed", "default:allow")
    assert run(g, ledger, "refund", booking="B1", amount=1) == ("one-refund-per-booking",)
    assert run(g, ledger, "refund", booking="B2", amount=300) == ("refunds-per-session",)
    assert run(g, ledger, "refund", booking="B2", amount=200) == ("allowed", "default:allow")
    assert run(g, ledger, "refund", booking="B3", amount=1) == ("refunds-per-session",)
    mails = [run(g, ledger, "send_email", to="ann@example.com", body="hi")[0] for _ in range(4)]
    assert mails == ["allowed", "allowed", "allowed", "mail-rate"]
    for _ in range(7):
        run(g, ledger, "read_file", path="notes.txt")
    assert run(g, ledger, "send_email", to="ann@example.com", body="hi")[0] == "allowed"


def test_redaction_built_in_and_from_the_policy() -> None:
    policy = Policy.from_yaml(blocks()["redact"])
    assert policy.redact("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG") == "[REDACTED]"
    assert policy.redact(f"key internal-{'ab' * 16} ok") == "key [REDACTED] ok"
    assert policy.redact("id AKIAIOSFODNN7EXAMPLE.") == "id [REDACTED]."


CUT = "before [REDACTED]"  # a private key without its END line is redacted to the end of the text
SECRETS = [
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA\n-----END OPENSSH PRIVATE KEY-----", None),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA", CUT),
    ("-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----", None),
    ("AKIAIOSFODNN7EXAMPLE", None),
    ("ASIAIOSFODNN7EXAMPLE", None),
    ("ghp_" + "a1B2" * 9, None),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", None),
    ("sk-proj-abcdefghijklmnopqrstuvwx", None),
    ("sk-ant-api03-abcdefghijklmnopqrstuvwx", None),
    ("xoxb-123456789012-abcdefghijkl", None),
    ("AIza" + "Sy" + "A" * 33, None),
    ("sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", None),
    ("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", None),
    ("authorization: bearer abcdefghijklmnop0123", "before authorization: [REDACTED]\nafter"),
]


@pytest.mark.parametrize(("secret", "expected"), SECRETS, ids=[s[:12] for s, _ in SECRETS])
def test_common_secret_formats_are_redacted_without_a_pattern(secret: str, expected: str | None) -> None:
    policy = Policy.from_yaml("default: allow\n")  # no redact list at all
    assert policy.redact(f"before {secret}\nafter") == (expected or "before [REDACTED]\nafter")


def test_ordinary_text_is_not_redacted() -> None:
    policy = Policy.from_yaml("default: allow\n")
    for text in ("the bearer of this letter", "task-1234", "sk-short", "AKIA lower", "ghp_short", "BEGIN PUBLIC KEY"):
        assert policy.redact(text) == text


# ---- deployment: examples/mcp behind `toolpolicy gate serve` ---------------------------------

NOTES = ROOT / "examples" / "mcp"


def test_the_notes_policy_on_the_page_is_the_example_file() -> None:
    assert blocks()["notes"] == (NOTES / "notes_policy.yaml").read_text(encoding="utf-8")
    shown = re.search(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)
    assert shown is not None and "from mcp.server.mcpserver import MCPServer" in shown.group(1)
    server = (NOTES / "notes_server.py").read_text(encoding="utf-8")
    assert "from mcp.server.mcpserver import MCPServer" in server and 'server.run("stdio")' in server


def test_the_notes_server_runs_behind_gate_serve(tmp_path: Path) -> None:
    """What docs/policy.md says of the example, through the real proxy and the SDK's client:
    the session is the episode, a forbid rule is named however often it is tried (issue 33:
    the third call was refused with "may run at most 2 times"), and the key id is redacted
    by the built-in formats although the policy lists no pattern."""
    command = ["-m", "toolpolicy.cli", "gate", "serve", "--policy", str(NOTES / "notes_policy.yaml"),
               "--audit", str(tmp_path / "audit.jsonl"), "--no-fsync", "--", sys.executable, str(NOTES / "notes_server.py")]
    params = StdioServerParameters(command=sys.executable, args=command, env={**os.environ, "PYTHONPATH": str(SOURCE)})

    async def session_script() -> dict[str, Any]:
        async with stdio_client(params) as streams, ClientSession(*streams) as session:
            await session.initialize()
            listed = await session.list_tools()
            seen: dict[str, Any] = {"tools": sorted(tool.name for tool in listed.tools)}
            seen["deploy"] = await session.call_tool("read_note", {"name": "deploy"})
            names = ("a", "deploy", "deploy", "b", "c", "deploy")
            seen["writes"] = [await session.call_tool("write_note", {"name": name, "text": "x"}) for name in names]
            return seen

    seen = anyio.run(session_script)
    text = lambda result: "\n".join(block.text for block in result.content)  # noqa: E731
    assert seen["tools"] == ["list_notes", "read_note", "write_note"]
    assert not seen["deploy"].is_error and "AKIA" not in text(seen["deploy"]) and "[REDACTED]" in text(seen["deploy"])
    decided = [tuple(result.meta["toolpolicy/decision"]["rule_ids"]) for result in seen["writes"]]
    assert decided == [
        ("write-notes",),
        ("deploy-note-is-managed",),
        ("deploy-note-is-managed",),
        ("write-notes",),
        ("limit:max_calls:write_note",),
        ("deploy-note-is-managed",),
    ]
    assert "the deploy note is managed by the operators" in text(seen["writes"][2])


def test_the_tutorial_policy_on_the_page_is_the_file_and_holds_other_spellings_of_two_digits() -> None:
    """docs/environments.md shows examples/adder/policy.yaml whole; its two-digit rule denies
    what is not two digits on either side of the range, and the schema what is not an integer."""
    text = (ROOT / "examples" / "adder" / "policy.yaml").read_text(encoding="utf-8")
    assert f"```yaml\n{text}```" in (ROOT / "docs" / "environments.md").read_text(encoding="utf-8")
    g = Gate(Policy.from_yaml(text, "examples/adder/policy.yaml"), [_spec("add", a="integer", b="integer")])
    for a, b in [(120, 3), (-500, 30), (5, 30), (30, 100), (30, 9), (0, 0), (-10, 10)]:
        assert g.decide(ToolCall("add", {"a": a, "b": b})).rule_ids == ("two-digits",), (a, b)
    for a in ["12", 12.5, True, None]:
        assert not g.decide(ToolCall("add", {"a": a, "b": 30})).allowed, a
    assert g.decide(ToolCall("add", {"a": 10, "b": 99})).allowed
