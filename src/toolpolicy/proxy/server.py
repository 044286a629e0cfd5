"""The MCP policy proxy: an MCP server (stdio) in front of another one.

    toolpolicy gate serve --policy P.yaml --audit run/audit.jsonl -- CMD ARGS...

An MCP host starts the proxy where it would have started CMD. The proxy starts CMD
itself and forwards tools/list and tools/call. On every tools/call it

1. refuses a tool name over MCP's 128 characters and arguments over `max_request_bytes`
   (before anything else reads them),
2. re-lists the upstream tools if they may have changed (a list_changed notification,
   a new pins file after an approval, or `recheck_seconds` since the last listing),
3. denies a call to a tool the proxy does not show: one whose name is confusable
   (names.py, `gate:suspicious_tool_name`), one that appeared after the proxy started
   and was never approved (`gate:tool_not_approved`), one whose definition changed
   since it was approved (`gate:definition_changed`; see pins.py),
4. asks the gate (policy rules, limits, argument schema) with one Ledger, kept across
   restarts beside the audit log (signed with it) and rebuilt from it when it must be
   (ledger_file.py). The gate evaluates the call in a worker process, off the event loop, within
   `decision_timeout` (a slower decision is a denial, `gate:decision_timeout`); then `conclude`,
   the second half of the `admit` the rollout engines use, logs the decision and counts the call.
   One call is admitted at a time, so calls sent together are counted one after another: each
   admitted call holds its place in `max_calls` from its admission, before it is sent;
5. forwards an allowed call, refuses a result over `max_result_bytes`, and redacts the
   built-in secret formats and the policy's patterns from every string of the result
   (results.py); an upstream error message is redacted too. A result or error that shows
   a secret only once assembled, decoded or read after what the session carried before is
   withheld, and a call whose arguments show one (whole, encoded, or split across fields or
   calls) is denied, `gate:secret_in_arguments` (stream.py).

Every decision, the proxy's own denials included (a call refused because the upstream's
tools could not be listed too), is appended to the audit log once. A call the client cancels
after it was sent upstream stays counted; one admitted but never sent (the upstream had exited)
gives its place back.
A denial is an MCP tool result with isError true whose text is the gate's observation,
so the model reads which rule denied it and why; every result carries the decision
(effect, rule ids, the decision id of its audit record) in `_meta["toolpolicy/decision"]`.
There is no approver in serve mode, so a rule with effect `ask` denies.

tools/list re-lists the upstream and shows only what the model may use: a tool whose
name is refused, one awaiting its first approval, or one the policy never allows (an
unconditional forbid or ask, or no permit under `default: deny`) is left out; a changed
tool keeps its approved definition, so new text never reaches the model unreviewed.
The server's `instructions` are pinned the same way when the proxy starts.

The upstream runs with the proxy's whole environment (the host configured it for the
server). Only tools are proxied: the proxy offers none of the upstream's resources or
prompts. When the upstream exits, the proxy answers the calls in flight with an error
and exits with status 1.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from toolpolicy.gate import (
    MALFORMED,
    Admission,
    AuditError,
    AuditLog,
    Decision,
    Gate,
    Ledger,
    Policy,
    PolicyError,
    conclude,
    release,
    settle,
)
from toolpolicy.gate.ledger import MAX_TOOL_NAME_CHARS
from toolpolicy.proxy.decisions import DecisionWorker, timed_out
from toolpolicy.proxy.names import RefusedName, refused_names
from toolpolicy.proxy.pins import INSTRUCTIONS, PinStore, instructions_definition, tool_definition
from toolpolicy.proxy.results import error_result, error_text, failed_on, json_bytes, passed_on, strings_of
from toolpolicy.proxy.stream import SessionStream
from toolpolicy.proxy.ledger_file import ledger_file, restored_ledger, save_ledger
from toolpolicy.proxy.stdio import MESSAGE_TOO_LARGE, UpstreamConnection, client_stdio
from toolpolicy.tools.mcp_client import MCPConnection, ServerCommand, failure
from toolpolicy.types import ToolCall, ToolSpec

DEFINITION_CHANGED = "gate:definition_changed"
NOT_APPROVED = "gate:tool_not_approved"
SUSPICIOUS_NAME = "gate:suspicious_tool_name"
ARGUMENTS_TOO_LARGE = "gate:arguments_too_large"
SECRET_SENT = "gate:secret_in_arguments"
TOOLS_UNLISTED = "gate:tools_unavailable"
CHANGED_NOTE = " [toolpolicy: calls are denied: the server changed this tool's definition since it was approved]"
UPSTREAM_LOST_GRACE_SECONDS = 0.5
MESSAGE_ALLOWANCE = 64 * 1024
"""Bytes of a message beyond its payload cap (the JSON-RPC envelope, JSON escapes)."""


@dataclass(frozen=True)
class ProxySettings:
    """How one proxy session runs (the `gate serve` options)."""

    recheck_seconds: float = 60.0
    """Re-list the upstream tools before a call when the last listing is older than this
    (0: before every call), to catch a server that changes a definition without notifying."""
    call_timeout: float = 60.0
    """Seconds an upstream tools/call may take."""
    decision_timeout: float = 1.0
    """Seconds the gate may take to decide on one call (in a worker process: the proxy keeps
    serving meanwhile); a decision that takes longer is a denial, `gate:decision_timeout`."""
    connect_timeout: float = 30.0
    """Seconds the upstream may take to start and complete the MCP handshake."""
    max_request_bytes: int = 256 * 1024
    """A tools/call whose arguments are larger (UTF-8 JSON) is denied without being read
    further; a client message larger than twice this is refused before it is parsed."""
    max_result_bytes: int = 1024 * 1024
    """An upstream result holding more text (every string, UTF-8) is replaced by an error;
    an upstream message larger than four times this is refused before it is parsed."""
    require_approval: bool = False
    """Approve no tool on first sight, not even at start: every tool must be in the pins
    file or approved with `toolpolicy gate approve`."""

    @property
    def client_message_bytes(self) -> int:
        return 2 * self.max_request_bytes + MESSAGE_ALLOWANCE

    @property
    def upstream_message_bytes(self) -> int:
        return 4 * self.max_result_bytes + MESSAGE_ALLOWANCE


class UpstreamLost(RuntimeError):
    """The upstream MCP server exited while the proxy was serving."""


class PolicyProxy:
    """The state of one proxy session: the upstream tools as last listed, which of them
    the proxy holds back and why, the gate built for them, and the session's ledger.

    Args:
        upstream: an open connection to the upstream server.
        policy: the loaded policy.
        audit: the audit log every decision is appended to.
        pins: the tool definition pins of this upstream server.
        settings: limits and timeouts (ProxySettings).
        warn: where the proxy reports what an operator should know (stderr).
        ledger_path: where the ledger is kept across restarts (None: not kept).
        decisions: the worker process the gate decides in (decisions.py); None decides in a
            thread of this process, which bounds the wait but not the event loop's stall while
            CEL runs (for tests that build a proxy in process).
    """

    def __init__(
        self,
        upstream: MCPConnection,
        policy: Policy,
        audit: AuditLog,
        pins: PinStore,
        settings: ProxySettings = ProxySettings(),
        warn: Callable[[str], None] | None = None,
        ledger_path: Path | None = None,
        decisions: DecisionWorker | None = None,
    ) -> None:
        self.upstream = upstream
        self.policy = policy
        self.audit = audit
        self.pins = pins
        self.settings = settings
        self.warn = warn or _warn
        self.ledger_path = ledger_path
        self.ledger = Ledger()
        if ledger_path is not None:  # the ledger of the proxy's earlier runs on this audit log
            self.ledger, note = restored_ledger(ledger_path, audit)
            if note:
                self.warn(note)
        self.gate: Gate | None = None
        self.stream = SessionStream()  # what this session carried each way, for secrets split across calls and results
        self._tools: dict[str, types.Tool] = {}
        self._seen: dict[str, dict[str, Any]] = {}  # name -> pinned part of the definition, as last listed
        self._refused: dict[str, RefusedName] = {}
        self._awaiting: set[str] = set()
        self._approved: dict[str, dict[str, Any]] = {}  # changed tools: name -> approved definition
        self._reported: set[tuple[str, str]] = set()
        self._listed_at = float("-inf")
        self._lock = anyio.Lock()
        self._deciding = anyio.Lock()  # one admission at a time: each sees the calls admitted before it
        self.decisions = decisions

    async def refresh(self, starting: bool = False) -> None:
        """List the upstream tools, refuse confusable names, check the rest against the
        pins, rebuild the gate if they differ. `starting`: the session's first listing,
        whose new tools are trusted on first use (unless `require_approval`), and where a
        policy naming a tool the server lacks is an error (PolicyError)."""
        async with self._lock:
            tools = {tool.name: tool for tool in await self.upstream.list_tools()}
            refused = refused_names(tools, self.pins.approved("tools"), self.policy.tool_names())
            seen = {name: tool_definition(tool) for name, tool in tools.items() if name not in refused}
            trust_new = starting and not self.settings.require_approval
            awaiting, pins = self.pins.check("tools", seen, trust_new)
            if self.gate is None or seen != self._seen:  # schemas are compiled once per listing that differs
                specs = [ToolSpec(name, "", _approved_schema(name, seen, pins, awaiting)) for name in seen]
                self.gate = Gate(self.policy, specs, audit=self.audit, strict_tool_names=starting)
                if self.decisions is not None:
                    self.decisions.bind(specs)
            self._tools, self._seen, self._refused, self._awaiting = tools, seen, refused, awaiting
            self._approved = {name: pins[name]["definition"] for name in awaiting if "definition" in pins[name]}
            self._listed_at = time.monotonic()
            self._report()

    async def pinned_instructions(self, text: str | None) -> str | None:
        """The server's instructions as the client may see them: the approved text, the
        new text held back until approved (None when no text was ever approved)."""
        definition = instructions_definition(text)
        trust_new = not self.settings.require_approval
        awaiting, pins = self.pins.check("server", {INSTRUCTIONS: definition}, trust_new)
        if not awaiting:
            return text
        self.warn(
            "the upstream server's instructions are not the approved ones; the client gets the approved ones (if any) "
            f"until they are reviewed and approved by digest (`toolpolicy gate approve --pins {self.pins.path}` shows them)"
        )
        approved = pins[INSTRUCTIONS].get("definition")
        return (approved[INSTRUCTIONS] or None) if approved else None

    def stale(self) -> bool:
        """Whether the upstream tools must be listed again before the next call."""
        return (
            self.upstream.tools_changed
            or self.pins.modified_on_disk()
            or time.monotonic() - self._listed_at >= self.settings.recheck_seconds
        )

    async def list_tools(self) -> list[types.Tool]:
        """The upstream tools as the client should see them (see the module docstring)."""
        await self.refresh()
        return [self._shown(tool) for name, tool in self._tools.items() if self._visible(name)]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Size cap, pinning checks, gate decision, forward, cap and redact; every outcome is a
        result. The ledger is saved beside the audit log after each call."""
        try:
            return await self._call_tool(name, arguments)
        finally:
            if self.ledger_path is not None:
                try:
                    save_ledger(self.ledger_path, self.ledger, self.audit)
                except OSError as error:  # the audit log still holds every decision to count from
                    self.warn(f"could not save the ledger to {self.ledger_path}: {error}")

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        call = ToolCall(name, arguments)
        try:
            async with self._deciding:
                admission = await self._admission(call)
                if admission.runs:  # what reaches the upstream joins the session's stream
                    self.stream.carry("sent", strings_of(call.arguments, keys=False))
                    self.stream.carry("sent_strings", strings_of(call.arguments))
        except AuditError as error:
            self.warn(f"{error}; the call to {name!r:.60} was not run")
            return error_result("The call was not run: the policy audit log cannot be written.")
        decision = admission.decision
        if not admission.runs:
            return error_result(decision.observation(), decision)
        if self.upstream.closed.is_set():  # never sent: its place in the count is given back
            release(self.ledger, call)
            return error_result(f"The call to {name} was not run: the MCP server has exited.", decision)
        try:
            result = await self.upstream.call_tool(name, arguments, self.settings.call_timeout)
        except anyio.get_cancelled_exc_class():  # the client gave up after the call was sent: it still counts
            settle(self.ledger, call, ok=False)
            raise
        except Exception as error:  # the upstream's failure, reported to the client as a tool error
            settle(self.ledger, call, ok=False)
            return failed_on(_upstream_failure(name, error, self.upstream), self.policy.redact, decision, self.stream)
        settle(self.ledger, call, ok=not result.is_error)
        return passed_on(result, self.policy.redact, decision, self.settings.max_result_bytes, self.stream)

    async def _admission(self, call: ToolCall) -> Admission:
        """The proxy's checks, then the gate's decision on `call`, logged once and counted
        (the caller holds `_deciding`). AuditError when the log cannot be written."""
        name = call.name
        if len(name) > MAX_TOOL_NAME_CHARS:
            return self._refuse(call, _name_too_long(name))
        size = json_bytes(call.arguments)
        if size > self.settings.max_request_bytes:
            return self._refuse(call, self._too_large(name, size))
        if self.stale():
            try:
                await self.refresh()
            except AuditError:
                raise
            except Exception as error:  # fail closed: without a fresh listing the pins cannot be checked
                problem = error_text(failure(error)[1], self.policy.redact)
                self.warn(f"could not re-list the upstream tools: {problem}")
                return self._refuse(call, _tools_unlisted(problem))
        held = self._held_back(call) or self._secret_sent(call)
        if held is not None:
            return self._refuse(call, held)
        assert self.gate is not None
        gate = self.gate
        return conclude(gate, self.ledger, call, await self._evaluated(gate, call))

    async def _evaluated(self, gate: Gate, call: ToolCall) -> Decision:
        """`gate.evaluate(call)` within `decision_timeout`, off the event loop: in the decision
        worker process, or in a thread when there is none. Past the deadline, a denial."""
        bound = self.settings.decision_timeout
        if self.decisions is not None:
            return await self.decisions.evaluate(call, self.ledger, bound)
        with anyio.move_on_after(bound):
            return await anyio.to_thread.run_sync(gate.evaluate, call, self.ledger, abandon_on_cancel=True)
        return timed_out(call.name, bound)

    def server(self, instructions: str | None = None) -> Server[Any]:
        """The MCP server the client talks to, answering with this proxy."""

        async def on_list_tools(
            ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            return types.ListToolsResult(tools=await self.list_tools())

        async def on_call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
            return await self.call_tool(params.name, dict(params.arguments or {}))

        return Server(
            "toolpolicy-proxy", instructions=instructions, on_list_tools=on_list_tools, on_call_tool=on_call_tool
        )

    def _refuse(self, call: ToolCall, decision: Decision) -> Admission:
        """A denial of the proxy's own, logged once like the gate's and counted: under its tool's
        name when the upstream offers that name, else with the calls to names no tool has (so
        invented names never enter the ledger's tables)."""
        self.audit.append(decision, call, self.policy.hash)
        if call.name in self._tools:
            self.ledger.record(call, "denied")
        else:
            self.ledger.refuse_unknown(call)
        return Admission(decision, False, decision.outcome in MALFORMED, decision.outcome == "gate_error")

    def _too_large(self, name: str, size: int) -> Decision:
        cap = self.settings.max_request_bytes
        return Decision(
            "deny",
            (ARGUMENTS_TOO_LARGE,),
            f"the arguments of this call to {name!r:.60} are {size:,} bytes, over the proxy's limit of {cap:,} bytes.",
            "Send smaller arguments, or split the work into several calls.",
            outcome="malformed",
        )

    def _secret_sent(self, call: ToolCall) -> Decision | None:
        """The proxy's denial of a call whose arguments show a secret the policy redacts: whole,
        encoded, split across its fields or begun in the calls sent before it; or None."""
        redact, arguments = self.policy.redact, call.arguments
        how = self.stream.completes_secret("sent", strings_of(arguments, keys=False), redact)
        how = how or self.stream.completes_secret("sent_strings", strings_of(arguments), redact)
        if how is None:
            return None
        return Decision(
            "deny",
            (SECRET_SENT,),
            f"the arguments of this call, {how}, show a secret the policy redacts; it is not sent to the MCP server.",
            "Do not pass secrets to tools, whole, in pieces or encoded.",
        )

    def _held_back(self, call: ToolCall) -> Decision | None:
        """The proxy's denial of a tool it does not show, or None."""
        name, approve = call.name, f"toolpolicy gate approve --pins {self.pins.path} shows it, then {call.name}@SHA256 approves it"
        if name in self._refused:
            reason = f"the MCP server's tool {name!r:.60} is refused: {self._refused[name].reason}."
            return Decision("deny", (SUSPICIOUS_NAME,), reason, "Use only the tools you were shown.", outcome="unknown_tool")
        if name in self._approved:
            return Decision(
                "deny",
                (DEFINITION_CHANGED,),
                f"the MCP server changed the definition of {name} since it was approved.",
                f"An operator must review and re-approve it: {approve}.",
            )
        if name in self._awaiting:
            return Decision(
                "deny",
                (NOT_APPROVED,),
                f"the MCP server offered {name} after the session started, and it has not been approved.",
                f"An operator must review and approve it: {approve}.",
            )
        return None

    def _visible(self, name: str) -> bool:
        held = name in self._refused or (name in self._awaiting and name not in self._approved)
        return not held and not never_allowed(self.policy, name)

    def _shown(self, tool: types.Tool) -> types.Tool:
        approved = self._approved.get(tool.name)
        if approved is None:
            return tool
        shown = types.Tool.model_validate({**approved, "name": tool.name})
        return shown.model_copy(update={"description": (shown.description or "") + CHANGED_NOTE})

    def _report(self) -> None:
        """Tell the operator, once per tool and reason, what the proxy holds back."""
        notes = {(name, f"refused: {refused.reason}") for name, refused in self._refused.items()}
        for name in self._awaiting:
            kind = "changed its definition" if name in self._approved else "is new"
            notes.add((name, f"{kind}; hidden and denied until reviewed (`toolpolicy gate approve --pins {self.pins.path}`) and approved as {name}@SHA256"))
        for name, note in sorted(notes - self._reported):
            self.warn(f"upstream tool {name!r:.60} {note}")
        self._reported |= notes


def _name_too_long(name: str) -> Decision:
    return Decision(
        "deny",
        ("gate:unknown_tool",),
        f"a tool name is at most {MAX_TOOL_NAME_CHARS} characters (MCP's limit); this one has {len(name):,}.",
        "Use only the tools you were shown.",
        outcome="unknown_tool",
    )


def _tools_unlisted(problem: str) -> Decision:
    return Decision(
        "deny",
        (TOOLS_UNLISTED,),
        f"the proxy could not check the MCP server's tools ({problem}), so no call runs.",
        "Try again later.",
        outcome="gate_error",
    )


def _approved_schema(
    name: str, seen: dict[str, dict[str, Any]], pins: dict[str, Any], awaiting: set[str]
) -> dict[str, Any]:
    """The input schema the gate checks `name`'s arguments against: the approved one.
    A tool awaiting its first approval is denied before the gate; it gets an open
    schema, so a broken one from the server cannot fail the gate for every tool."""
    if name not in awaiting:
        return seen[name].get("inputSchema", {})
    approved = pins[name].get("definition")
    return approved.get("inputSchema", {}) if approved else {"type": "object"}


def never_allowed(policy: Policy, name: str) -> bool:
    """Whether no call to `name` can be allowed in serve mode, whatever its arguments:
    an unconditional forbid or ask (there is no approver), or no permit under default deny."""
    rules = policy.rules_for(name)
    if any(rule.program is None for rule in (*rules.forbid, *rules.ask)):
        return True
    return not rules.permit and policy.default == "deny"


def _upstream_failure(name: str, error: BaseException, upstream: MCPConnection) -> str:
    if isinstance(error, MCPError) and error.code == MESSAGE_TOO_LARGE:
        return f"The result of {name} was not passed on: {error.message} (--max-result-bytes)."
    status = upstream.exit_status
    if status is not None:
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        return f"MCP tool {name} failed: the MCP server {how} before it answered"
    return f"MCP tool {name} failed: {failure(error)[1]}"


async def serve(
    upstream: ServerCommand,
    policy: Policy,
    audit: AuditLog,
    pins: PinStore,
    settings: ProxySettings = ProxySettings(),
    policy_text: str | None = None,
) -> None:
    """Serve the proxy on this process's stdin/stdout until the client disconnects.

    `policy_text`: the YAML `policy` was built from (None: read again from `policy.source`; the
    decision worker refuses it unless it is the same policy). Raises MCPConnectError (upstream
    did not start), PolicyError (the policy names a tool the upstream lacks, or its file
    changed), LedgerFileError (the saved ledger does not verify) or UpstreamLost (the upstream
    exited while serving).
    """
    text = policy_text if policy_text is not None else Path(policy.source).read_text(encoding="utf-8")
    decisions = DecisionWorker(policy, text, settings.connect_timeout)
    try:
        await decisions.start()
    except ValueError as error:
        raise PolicyError(policy.source, [str(error)]) from None
    connection = UpstreamConnection(upstream, settings.connect_timeout, settings.upstream_message_bytes)
    try:
        async with connection:
            proxy = PolicyProxy(
                connection, policy, audit, pins, settings, ledger_path=ledger_file(audit.path), decisions=decisions
            )
            await proxy.refresh(starting=True)
            offered = connection.initialize_result.instructions if connection.initialize_result else None
            server = proxy.server(await proxy.pinned_instructions(offered))
            async with anyio.create_task_group() as group:
                group.start_soon(_stop_when_closed, connection, group.cancel_scope)
                async with client_stdio(settings.client_message_bytes) as (read, write):
                    await server.run(read, write, server.create_initialization_options())
                group.cancel_scope.cancel()  # the client disconnected: stop watching the upstream
            lost = connection.closed.is_set()
    finally:
        decisions.stop()
    if lost:
        raise UpstreamLost(f"the upstream MCP server `{upstream}` exited")


async def _stop_when_closed(connection: MCPConnection, scope: anyio.CancelScope) -> None:
    """Stop serving once the upstream is gone, after the calls in flight had a moment
    to answer the client with their errors."""
    await connection.closed.wait()
    await anyio.sleep(UPSTREAM_LOST_GRACE_SECONDS)
    scope.cancel()


def _warn(text: str) -> None:
    print(f"toolpolicy gate serve: {text}", file=sys.stderr, flush=True)
