"""One gated call: the gate's decision and the episode ledger, the same for every caller.

The rollout engine, the chat-completions engine and the MCP proxy run a tool call
the same way: `admit` asks the gate (which logs the decision once) and records a
call that will not run; the caller runs an admitted call its own way (a ToolSet,
an HTTP endpoint's tools, an upstream MCP server) and `settle` records what it did.
A fix to gating lands here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolpolicy.gate.decide import Decision, Gate
from toolpolicy.gate.ledger import Ledger
from toolpolicy.types import ToolCall

MALFORMED = frozenset({"malformed", "unknown_tool"})
"""The decision outcomes that are the model's malformed calls, not policy violations."""


@dataclass(frozen=True)
class Admission:
    """The gate's decision on a call and what follows from it."""

    decision: Decision
    runs: bool
    """Whether the call goes on to its tool: allowed, or denied by a policy rule of a gate
    in shadow mode (counted as a violation, not prevented)."""
    malformed: bool
    """Denied by the gate's own checks (unknown tool, arguments that break the schema):
    the model's malformed call, which never runs, shadow mode or not."""
    fault: bool
    """The gate itself failed (outcome gate_error) and denied to stay closed: a machine
    fault, which the engines mark as an infrastructure error, never scored as the model's."""


def admit(gate: Gate, ledger: Ledger, call: ToolCall) -> Admission:
    """Decide on `call` (the gate appends the decision to its audit log, once) and count it
    in the ledger at once: a call that runs holds its place in `max_calls` from here, before
    it runs; one that will not run is recorded as denied. The ledger's `admitting` lock is held
    from the decision to the count, so calls admitted from several threads cannot all pass a
    limit only some of them fit. Raises AuditError when the log cannot be written: the caller
    must not run the call then."""
    with ledger.admitting:
        return conclude(gate, ledger, call, gate.evaluate(call, ledger))


def conclude(gate: Gate, ledger: Ledger, call: ToolCall, evaluated: Decision) -> Admission:
    """The second half of `admit`, for a caller that had the gate evaluate `call` elsewhere (the
    proxy, in a worker thread with a deadline): settle an ask, log the decision once, count the
    call. The caller must keep other admissions on `ledger` out between the two halves."""
    decision = gate.conclude(call, evaluated)
    malformed, fault = decision.outcome in MALFORMED, decision.outcome == "gate_error"
    runs = decision.allowed or (not gate.enforce and not malformed and not fault)
    if runs:
        ledger.reserve(call)
    elif decision.outcome == "unknown_tool" and not gate.knows(call.name):
        ledger.refuse_unknown(call)
    else:
        ledger.record(call, "denied")
    return Admission(decision, runs, malformed, fault)


def settle(ledger: Ledger, call: ToolCall, ok: bool, facts: Mapping[str, Any] | None = None) -> None:
    """Record the outcome of an admitted call that ran (`admit` counted it already): whether it
    succeeded, and the facts it established (e.g. {"user_verified": True}), which later policy
    conditions read as `state`. A call whose outcome will never be known (the client gave up
    after it was sent) is settled as failed: it counts, whatever happened to it."""
    ledger.record(call, "ok" if ok else "error")
    ledger.learn(facts or {})


def release(ledger: Ledger, call: ToolCall) -> None:
    """Take back the count of an admitted call that never reached its tool (see Ledger.release)."""
    ledger.release(call)
