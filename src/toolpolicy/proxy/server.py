"""The MCP policy proxy: an MCP server (stdio) in front of another one.

    toolpolicy gate serve --policy P.yaml --audit run/audit.jsonl -- CMD ARGS...

An MCP host starts the proxy where it would have started CMD. The proxy starts CMD
itself and forwards tools/list and tools/call. On every tools/call it

1. re-lists the upstream tools if they may have changed (a list_changed notification,
   a new pins file after an approval, or `recheck_seconds` since the last listing),
2. denies a call to a tool whose definition changed since it was pinned
   (rule id `gate:definition_changed`, see pins.py),
3. asks the gate (`gate.admit`, the gated call the rollout engines use too: policy
   rules, limits, argument schema) with one Ledger for the whole session,
4. forwards an allowed call and redacts the policy's secret patterns from the result.

Every decision, the pinning denials included, is appended to the audit log once.
A denial is an MCP tool result with isError true whose text is the gate's
observation, so the model reads which rule denied it and why; every result carries
the decision (effect, rule ids, the decision id of its audit record) in
`_meta["toolpolicy/decision"]`. There is no approver in serve mode, so a rule with
effect `ask` denies. tools/list re-lists the upstream and shows a changed tool with
its approved definition, so the new text never reaches the model unreviewed.

The upstream runs with the proxy's whole environment (the host configured it for
the server). Only tools are proxied: the proxy offers none of the upstream's
resources or prompts. When the upstream exits, the proxy answers the calls in flight
with an error and exits with status 1.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from toolpolicy.gate import AuditError, AuditLog, Decision, Gate, Ledger, Policy, admit, settle
from toolpolicy.proxy.pins import PinStore, definition
from toolpolicy.tools.mcp_client import MCPConnection, ServerCommand, failure
from toolpolicy.types import ToolCall, ToolSpec

DEFINITION_CHANGED = "gate:definition_changed"
CHANGED_NOTE = " [toolpolicy: calls are denied: the server changed this tool's definition since it was approved]"
META_KEY = "toolpolicy/decision"
UPSTREAM_LOST_GRACE_SECONDS = 0.5


class UpstreamLost(RuntimeError):
    """The upstream MCP server exited while the proxy was serving."""


class PolicyProxy:
    """The state of one proxy session: the upstream tools as last listed, which of them
    changed, the gate built for them, and the session's ledger.

    Args:
        upstream: an open connection to the upstream server.
        policy: the loaded policy.
        audit: the audit log every decision is appended to.
        pins: the tool definition pins of this upstream server.
        recheck_seconds: re-list the upstream tools before a call when the last listing
            is older than this (0: before every call), to catch a server that changes
            a definition without notifying.
        call_timeout: seconds an upstream tools/call may take.
        warn: where the proxy reports what an operator should know (stderr).
    """

    def __init__(
        self,
        upstream: MCPConnection,
        policy: Policy,
        audit: AuditLog,
        pins: PinStore,
        recheck_seconds: float = 60.0,
        call_timeout: float = 60.0,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.upstream = upstream
        self.policy = policy
        self.audit = audit
        self.pins = pins
        self.recheck_seconds = recheck_seconds
        self.call_timeout = call_timeout
        self.warn = warn or _warn
        self.ledger = Ledger()
        self.gate: Gate | None = None
        self._tools: dict[str, types.Tool] = {}
        self._seen: dict[str, dict[str, Any]] = {}  # name -> pinned part of the definition, as last listed
        self._changed: set[str] = set()
        self._approved: dict[str, dict[str, Any]] = {}
        self._listed_at = float("-inf")
        self._lock = anyio.Lock()

    async def refresh(self, strict: bool = False) -> None:
        """List the upstream tools, check them against the pins, rebuild the gate if
        they differ. `strict`: a policy naming a tool the server lacks is an error
        (PolicyError) rather than a rule that never applies."""
        async with self._lock:
            listed = await self.upstream.list_tools()
            tools = {tool.name: tool for tool in listed}
            seen = {name: definition(tool.description, tool.input_schema) for name, tool in tools.items()}
            changed, pins = self.pins.check(seen)
            for name in sorted(changed - self._changed):
                self.warn(
                    f"the upstream server changed the definition of tool {name!r}; calls to it are denied until "
                    f"`toolpolicy gate approve --pins {self.pins.path} {name}`"
                )
            if self.gate is None or seen != self._seen:  # schemas are compiled once per listing that differs
                specs = [ToolSpec(name, tool.description or "", tool.input_schema) for name, tool in tools.items()]
                self.gate = Gate(self.policy, specs, audit=self.audit, strict_tool_names=strict)
            self._tools, self._seen, self._changed, self._listed_at = tools, seen, changed, time.monotonic()
            self._approved = {name: pins[name]["definition"] for name in changed}

    def stale(self) -> bool:
        """Whether the upstream tools must be listed again before the next call."""
        return (
            self.upstream.tools_changed
            or self.pins.modified_on_disk()
            or time.monotonic() - self._listed_at >= self.recheck_seconds
        )

    async def list_tools(self) -> list[types.Tool]:
        """The upstream tools as the client should see them: a changed tool keeps its
        approved definition, so a new description never reaches the model unreviewed."""
        await self.refresh()
        return [self._shown(tool) for tool in self._tools.values()]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Pinning check, gate decision, forward, redact; every outcome is a result."""
        call = ToolCall(name, arguments)
        try:
            if self.stale():
                await self.refresh()
        except Exception as error:  # fail closed: without a fresh listing the pins cannot be checked
            problem = failure(error)[1]
            self.warn(f"could not re-list the upstream tools: {problem}")
            return _error_result(f"The call was not run: the proxy could not check the MCP server's tools ({problem})")
        try:
            pinned = self._pinning_denial(call)
            if pinned is not None:
                self.audit.append(pinned, call, self.policy.hash)
                self.ledger.record(call, "denied")
                return _error_result(pinned.observation(), pinned)
            assert self.gate is not None
            admission = admit(self.gate, self.ledger, call)
        except AuditError as error:
            self.warn(f"{error}; the call to {name!r} was not run")
            return _error_result("The call was not run: the policy audit log cannot be written.")
        decision = admission.decision
        if not admission.runs:
            return _error_result(decision.observation(), decision)
        try:
            result = await self.upstream.call_tool(name, arguments, self.call_timeout)
        except Exception as error:  # the upstream's failure, reported to the client as a tool error
            settle(self.ledger, call, ok=False)
            return _error_result(f"MCP tool {name} failed: {failure(error)[1]}", decision)
        settle(self.ledger, call, ok=not result.is_error)
        return redact_result(result, self.policy.redact, decision)

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

    def _pinning_denial(self, call: ToolCall) -> Decision | None:
        if call.name not in self._changed:
            return None
        return Decision(
            "deny",
            (DEFINITION_CHANGED,),
            f"the MCP server changed the definition of {call.name} since it was approved.",
            f"An operator must review and re-approve it: toolpolicy gate approve --pins {self.pins.path} {call.name}.",
        )

    def _shown(self, tool: types.Tool) -> types.Tool:
        approved = self._approved.get(tool.name)
        if approved is None:
            return tool
        return tool.model_copy(
            update={"description": approved["description"] + CHANGED_NOTE, "input_schema": approved["inputSchema"]}
        )


async def serve(
    upstream: ServerCommand,
    policy: Policy,
    audit: AuditLog,
    pins: PinStore,
    recheck_seconds: float = 60.0,
    call_timeout: float = 60.0,
    connect_timeout: float = 30.0,
) -> None:
    """Serve the proxy on this process's stdin/stdout until the client disconnects.

    Raises MCPConnectError (upstream did not start), PolicyError (the policy names a
    tool the upstream lacks) or UpstreamLost (the upstream exited while serving).
    """
    async with MCPConnection(upstream, connect_timeout) as connection:
        proxy = PolicyProxy(connection, policy, audit, pins, recheck_seconds, call_timeout)
        await proxy.refresh(strict=True)
        instructions = connection.initialize_result.instructions if connection.initialize_result else None
        server = proxy.server(instructions)
        async with anyio.create_task_group() as group:
            group.start_soon(_stop_when_closed, connection, group.cancel_scope)
            async with stdio_server(stdin=StdinLines()) as (read, write):  # type: ignore[arg-type]
                await server.run(read, write, server.create_initialization_options())
            group.cancel_scope.cancel()  # the client disconnected: stop watching the upstream
        lost = connection.closed.is_set()
    if lost:
        raise UpstreamLost(f"the upstream MCP server `{upstream}` exited")


async def _stop_when_closed(connection: MCPConnection, scope: anyio.CancelScope) -> None:
    """Stop serving once the upstream is gone, after the calls in flight had a moment
    to answer the client with their errors."""
    await connection.closed.wait()
    await anyio.sleep(UPSTREAM_LOST_GRACE_SECONDS)
    scope.cancel()


class StdinLines:
    """This process's stdin as an async iterator of lines, read by a daemon thread.

    The SDK's stdio server reads stdin on a worker thread that a cancellation cannot
    abandon, so a proxy whose upstream died would have to wait for the client's next
    line before it could exit. A daemon thread blocked in a read does not hold the exit.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        threading.Thread(target=self._pump, name="toolpolicy-stdin", daemon=True).start()

    def _pump(self) -> None:
        """Read fd 0 directly: a daemon thread blocked inside sys.stdin's buffered reader
        would hold its lock and abort the interpreter's shutdown."""
        pending = b""
        try:
            while chunk := os.read(0, 65536):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._loop.call_soon_threadsafe(self._lines.put_nowait, line.decode("utf-8", "replace"))
            self._loop.call_soon_threadsafe(self._lines.put_nowait, None)
        except (RuntimeError, OSError):  # the loop is closed, or stdin is: the proxy is stopping
            return

    def __aiter__(self) -> StdinLines:
        return self

    async def __anext__(self) -> str:
        line = await self._lines.get()
        if line is None:
            raise StopAsyncIteration
        return line


def redact_result(
    result: types.CallToolResult, redact: Callable[[str], str], decision: Decision
) -> types.CallToolResult:
    """The upstream result with secrets replaced in every text it carries (text blocks,
    embedded text resources, strings in the structured content), and the decision in `_meta`."""
    content = [_redact_block(block, redact) for block in result.content]
    structured = _redact_value(result.structured_content, redact)
    meta = {**(result.meta or {}), META_KEY: _decision_meta(decision)}
    return result.model_copy(update={"content": content, "structured_content": structured, "meta": meta})


def _redact_block(block: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(block, types.TextContent):
        return block.model_copy(update={"text": redact(block.text)})
    if isinstance(block, types.EmbeddedResource) and isinstance(block.resource, types.TextResourceContents):
        return block.model_copy(update={"resource": block.resource.model_copy(update={"text": redact(block.resource.text)})})
    return block


def _redact_value(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redact_value(item, redact) for item in value]
    if isinstance(value, dict):
        return {key: _redact_value(item, redact) for key, item in value.items()}
    return value


def _error_result(text: str, decision: Decision | None = None) -> types.CallToolResult:
    meta = {META_KEY: _decision_meta(decision)} if decision is not None else None
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True, meta=meta)


def _decision_meta(decision: Decision) -> dict[str, Any]:
    """The decision as the client sees it; `decision_id` finds its audit record."""
    return {"effect": decision.effect, "rule_ids": list(decision.rule_ids), "decision_id": decision.decision_id}


def _warn(text: str) -> None:
    print(f"toolpolicy gate serve: {text}", file=sys.stderr, flush=True)
