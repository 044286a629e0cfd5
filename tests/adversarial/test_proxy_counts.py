"""Counts, records and deadlines through a real `toolpolicy gate serve` process in front of
the hostile MCP server (tests/fixtures/hostile_mcp_server.py), spoken to in raw JSON-RPC lines
so that calls can be sent together, cancelled, or named as no client would.

Each test is one way to dodge a count, a record or the deadline: calls sent together under
`max_calls`, a call cancelled after the upstream started it, invented tool names by the
hundred, a name of half a megabyte, a call while the upstream cannot list its tools, a
decision built to take seconds. The same attacks on the gate in process:
tests/adversarial/test_counts_and_records.py.
"""

from __future__ import annotations

import json
import os
import select
import time
from pathlib import Path
from typing import Any

import pytest
from test_proxy_attacks import Proxy, denied, rule_ids, text

POLICY = """
default: allow
rules:
  - {id: no-wipe, effect: forbid, tools: [wipe], reason: wiping is never allowed}
"""


def calls_at_once(proxy: Proxy, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Send every call before reading any reply; the results in the order the calls were sent."""
    ids = []
    for name, arguments in calls:
        proxy.next_id += 1
        ids.append(proxy.next_id)
        proxy.send_json({"jsonrpc": "2.0", "id": proxy.next_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
    replies = {answer["id"]: answer for answer in read_lines(proxy, len(ids))}
    return [replies[i]["result"] for i in ids]


def read_lines(proxy: Proxy, count: int, timeout: float = 120.0) -> list[dict[str, Any]]:
    """The proxy's next `count` messages, read from its stdout's file descriptor: the buffered
    reader of `Proxy.reply` would take several at once and leave `select` waiting for none."""
    assert proxy.process.stdout is not None
    fd, buffer, lines = proxy.process.stdout.fileno(), b"", []
    deadline = time.monotonic() + timeout
    while len(lines) < count:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 1 << 20) if ready else b""
        assert chunk, f"{len(lines)} of {count} replies within {timeout}s; the proxy's stderr:\n{proxy.errors()}"
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        lines += [json.loads(line) for line in complete if line]
    assert not buffer, "more than the expected replies"
    return lines


@pytest.mark.parametrize("limit", ["{stall: 2}", "{'*': 2}"])
def test_calls_sent_together_cannot_all_pass_max_calls(tmp_path: Path, limit: str) -> None:
    session = Proxy(tmp_path, rules=POLICY + f"limits:\n  max_calls: {limit}\n")
    try:
        results = calls_at_once(session, [("stall", {"seconds": 1})] * 6)
        ran = [r for r in results if not r["isError"]]
        assert len(ran) == 2 and all(text(r) == "late" for r in ran), [text(r) for r in results]
        key = "stall" if "stall" in limit else "*"
        assert all(denied(r, f"limit:max_calls:{key}") for r in results if r["isError"])
        assert [record["decision"] for record in session.audit()].count("allow") == 2
    finally:
        session.close()


def test_a_call_cancelled_after_the_upstream_started_it_still_counts(tmp_path: Path) -> None:
    rules = POLICY + "limits:\n  max_calls: {stall: 1}\n"
    session = Proxy(tmp_path, rules=rules)
    try:
        session.next_id += 1
        cancelled = session.next_id
        session.send_json({"jsonrpc": "2.0", "id": cancelled, "method": "tools/call", "params": {"name": "stall", "arguments": {"seconds": 5}}})
        deadline = time.monotonic() + 30
        while not [r for r in session.audit() if r["tool"] == "stall"] and time.monotonic() < deadline:
            time.sleep(0.05)  # admitted (its record is written before it is sent upstream)
        time.sleep(0.5)  # and in the upstream's hands
        session.send_json({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": cancelled, "reason": "timeout"}})
        assert denied(session.call("stall", {"seconds": 0}), "limit:max_calls:stall")
        assert session.serves()
    finally:
        session.close()
    again = Proxy(tmp_path, rules=rules)  # and after a restart, from the saved ledger
    try:
        assert denied(again.call("stall", {"seconds": 0}), "limit:max_calls:stall")
    finally:
        again.close()


PROBING = POLICY + """
  - {id: no-secret, effect: forbid, tools: [echo], when: "args.text == 'secret'", reason: no secrets}
  - {id: stop-probing, effect: forbid, tools: "*", when: "tool in denials && denials[tool] >= 3", reason: probing}
limits:
  max_denials: {echo: 3}
"""


def test_hundreds_of_invented_names_do_not_switch_off_a_tools_counts(tmp_path: Path) -> None:
    session = Proxy(tmp_path, rules=PROBING)
    try:
        for batch in range(6):
            results = calls_at_once(session, [(f"invented_{batch}_{i}", {}) for i in range(100)])
            assert all(denied(r, "gate:unknown_tool") for r in results)
        for _ in range(3):
            assert denied(session.call("echo", {"text": "secret"}), "no-secret")
        assert denied(session.call("echo", {"text": "hello"}), "stop-probing")
        saved = json.loads((tmp_path / "audit.jsonl.ledger.json").read_text())
        assert set(saved["ledger"]["denials"]) == {"?", "echo"} and saved["ledger"]["denials"]["echo"] == 4
    finally:
        session.close()


@pytest.mark.parametrize("length", [129, 500_000])
def test_a_tool_name_over_mcps_cap_is_denied_and_kept_short(tmp_path: Path, length: int) -> None:
    session = Proxy(tmp_path)
    try:
        result = session.call("n" * length, {})
        record = session.audit()[-1]
        assert len(json.dumps(record)) < 2_000 and record["rule_ids"] == ["gate:unknown_tool"]
        assert (tmp_path / "audit.jsonl.ledger.json").stat().st_size < 5_000
        assert denied(result, "gate:unknown_tool") and "at most 128 characters" in text(result)
        assert session.serves()
    finally:
        session.close()


def test_a_call_refused_because_the_tools_cannot_be_listed_is_audited(tmp_path: Path) -> None:
    session = Proxy(tmp_path, flags=("--recheck-seconds", "0"))
    try:
        assert text(session.call("mutate", {"change": "fail_listing"})) == "changed"
        result = session.call("echo", {"text": "hi"})
        assert denied(result, "gate:tools_unavailable") and "tool registry is unavailable" in text(result)
        record = session.audit()[-1]
        assert (record["tool"], record["decision"], record["rule_ids"]) == ("echo", "deny", ["gate:tools_unavailable"])
    finally:
        session.close()


SLOW = POLICY + """
  - id: quadratic
    effect: forbid
    tools: [leak]
    when: "has(args.items) && args.items.all(x, args.items.all(y, x + y >= 0)) && false"
    reason: never
"""


def test_a_slow_decision_is_denied_at_its_deadline_and_the_proxy_answers_meanwhile(tmp_path: Path) -> None:
    session = Proxy(tmp_path, rules=SLOW, flags=("--decision-timeout", "3"))
    try:
        session.next_id += 1
        slow = session.next_id
        arguments = {"where": "text", "items": list(range(4000))}  # 16 million comparisons: many seconds of CEL
        session.send_json({"jsonrpc": "2.0", "id": slow, "method": "tools/call", "params": {"name": "leak", "arguments": arguments}})
        time.sleep(1)  # the decision is under way
        session.next_id += 1
        ping = session.next_id
        session.send_json({"jsonrpc": "2.0", "id": ping, "method": "ping"})
        [first] = read_lines(session, 1)
        assert first["id"] == ping and first["result"] == {}
        assert not [r for r in session.audit() if r["tool"] == "leak"]  # answered while the call was still undecided
        [second] = read_lines(session, 1)
        assert second["id"] == slow and denied(second["result"], "gate:decision_timeout"), second
        assert "within 3 s" in text(second["result"]) and rule_ids(second["result"]) == ["gate:decision_timeout"]
        assert session.audit()[-1]["rule_ids"] == ["gate:decision_timeout"]
        assert session.serves()  # a new worker decides the next call
        assert text(session.call("leak", {"where": "text", "items": [1, 2]})) == "key=[REDACTED]"
    finally:
        session.close()
