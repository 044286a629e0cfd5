"""MCP client adapter: the tools of an MCP server (stdio) become toolpolicy tools.

    with MCPClient("python", ["server.py"]) as server:
        tools = ToolSet(server.tools())            # names, descriptions, JSON schemas from tools/list
        result = tools.call(ToolCall("add", {"a": 1, "b": 2}))

The official `mcp` SDK is asynchronous; training and evaluation call tools from plain
synchronous code. `MCPConnection` is the async session (used as is by the policy proxy),
and `MCPClient` runs one on a background event-loop thread and submits each request to
it, so `ToolSet.call` stays synchronous.

Failures follow docs/architecture.md, contracts 3 and 4: `MCPClient.call` never raises. A result
the server marks `isError` is the tool's failure ("tool_error", the model sees it); a
server that died, a broken pipe or an exception of ours is "infra"; no answer in time
is "timeout". Arguments are checked against the server's own input schema before the
call leaves the process, and a failed check reads like any other tool's
("invalid_arguments").
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from toolpolicy.tools.schema_tool import SchemaTool, schema_tool
from toolpolicy.types import ErrorKind, ToolResult, ToolSpec

CLIENT_INFO = types.Implementation(name="toolpolicy", version="0.1.0")
MAX_LIST_PAGES = 1000  # a server whose cursor never ends cannot hang the listing


class MCPConnectError(RuntimeError):
    """The MCP server could not be started or did not complete the handshake."""


@dataclass(frozen=True)
class ServerCommand:
    """How to start an MCP server over stdio.

    env: extra variables. With `inherit_env` False the server sees only the SDK's safe
        subset of this process's environment (HOME, PATH, SHELL, TERM, USER, LOGNAME)
        plus `env`, so API keys are not passed to a server by accident; True passes the
        whole environment (the policy proxy does, as it stands in for the server).
    """

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    inherit_env: bool = False

    def parameters(self) -> StdioServerParameters:
        env = {**os.environ, **(self.env or {})} if self.inherit_env else dict(self.env or {})
        return StdioServerParameters(command=self.command, args=list(self.args), env=env or None, cwd=self.cwd)

    def __str__(self) -> str:
        return " ".join([self.command, *self.args])


class MCPConnection:
    """An initialized MCP session with one server process, for use inside one event loop.

    `closed` is set when the server's stdout ends (it exited or crashed);
    `tools_changed` is set by a notifications/tools/list_changed from the server and
    cleared by `list_tools`.
    """

    def __init__(self, server: ServerCommand, connect_timeout: float = 30.0, errlog: TextIO | None = None) -> None:
        self.server = server
        self.connect_timeout = connect_timeout
        self.errlog = errlog if errlog is not None else sys.stderr
        self.initialize_result: types.InitializeResult | None = None
        self.tools_changed = False
        self._stack = AsyncExitStack()
        self._session: ClientSession | None = None
        self._closed: anyio.Event | None = None

    @property
    def exit_status(self) -> int | None:
        """The server's exit status once known (negative: the signal that ended it). The SDK's
        transport does not tell it: None here; the policy proxy's own transport does."""
        return None

    @property
    def closed(self) -> anyio.Event:
        assert self._closed is not None, "use MCPConnection as an async context manager"
        return self._closed

    async def __aenter__(self) -> MCPConnection:
        self._closed = anyio.Event()
        try:
            await self._connect()
        except BaseException as error:
            await self._stack.aclose()
            if not isinstance(error, Exception):  # a cancellation or KeyboardInterrupt stays what it is
                raise
            raise _connect_error(self.server, self.connect_timeout, error) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _connect(self) -> None:
        """Spawn the server, relay its messages (to notice when it ends), and initialize.

        Only `initialize` is under the timeout: the transport's task groups must be
        exited in the order they were entered, so they cannot sit inside a cancel scope
        that ends first.
        """
        upstream_read, write = await self._stack.enter_async_context(
            stdio_client(self.server.parameters(), errlog=self.errlog)
        )
        relay_send, read = anyio.create_memory_object_stream[Any](0)
        group = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.callback(group.cancel_scope.cancel)  # runs before the group's exit: stop the relay
        group.start_soon(self._relay, upstream_read, relay_send)
        self._session = await self._stack.enter_async_context(
            ClientSession(read, write, message_handler=self._on_message, client_info=CLIENT_INFO)
        )
        with anyio.fail_after(self.connect_timeout):
            self.initialize_result = await self._session.initialize()

    async def _relay(self, source: Any, sink: Any) -> None:
        """Pass the server's messages to the session; when they end, the server is gone."""
        try:
            async with sink:
                async for item in source:
                    await sink.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            self.closed.set()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed = True

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the server offers, following pagination."""
        session = self._require_session()
        self.tools_changed = False
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise MCPError(types.INTERNAL_ERROR, f"tools/list did not end after {MAX_LIST_PAGES} pages")

    async def call_tool(self, name: str, arguments: dict[str, Any], timeout: float | None) -> types.CallToolResult:
        """The server's result, as sent. Raises on transport and protocol failures (see `failure`)."""
        if self.closed.is_set():
            raise MCPError(types.CONNECTION_CLOSED, "the MCP server has exited")
        return await self._require_session().call_tool(name, arguments, read_timeout_seconds=timeout)

    def _require_session(self) -> ClientSession:
        assert self._session is not None, "use MCPConnection as an async context manager"
        return self._session


class MCPClient:
    """An MCP server's tools for synchronous code: one server process, one session on a
    background event-loop thread.

    Args:
        command, args, env, cwd: how to start the server (see ServerCommand for env).
        connect_timeout: seconds to wait for the server to initialize.
        call_timeout: seconds one tools/call may take before it counts as "timeout".
        errlog: where the server's stderr goes (default: this process's stderr).
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        connect_timeout: float = 30.0,
        call_timeout: float = 60.0,
        errlog: TextIO | None = None,
    ) -> None:
        self.server = ServerCommand(command, tuple(args), env, cwd)
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self.errlog = errlog
        self._connection: MCPConnection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MCPClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Start the server and initialize the session; MCPConnectError if that fails.
        A client connects once: after `close`, make a new one."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"mcp:{self.server.command}", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure

    def close(self) -> None:
        """End the session and stop the server (stdin closed, then terminated if it lingers)."""
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    @property
    def alive(self) -> bool:
        """True while the session is up and the server has not exited."""
        running = self._thread is not None and self._thread.is_alive()
        return running and self._connection is not None and not self._connection.closed.is_set()

    def list_tools(self) -> list[types.Tool]:
        """The server's tool definitions as the SDK parses them."""
        return self._submit(self._require().list_tools(), self.call_timeout)

    def tools(self) -> list[SchemaTool]:
        """The server's tools as toolpolicy Tools, ready for a ToolSet."""
        return [self.as_tool(definition) for definition in self.list_tools()]

    def as_tool(self, definition: types.Tool) -> SchemaTool:
        """One server tool as a Tool whose function forwards the call to this client.

        Its effect is "read" only when the server marks it readOnlyHint: MCP's default
        is that a tool may change its environment."""
        read_only = definition.annotations is not None and definition.annotations.read_only_hint is True
        parameters = dict(definition.input_schema)
        spec = ToolSpec(definition.name, definition.description or "", parameters, effect="read" if read_only else "write")
        return schema_tool(spec, _forwarder(self, spec.name), "MCP tool")

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run one tool on the server; every failure is a ToolResult, never an exception."""
        if not self.alive:
            return ToolResult(f"The MCP server {self.server.command!r} is not running.", "infra")
        connection = self._require()
        try:
            result = self._submit(connection.call_tool(name, dict(arguments), self.call_timeout), self.call_timeout + 5)
        except Exception as error:
            kind, text = failure(error)
            return ToolResult(f"MCP tool {name} failed: {text}", kind)
        return tool_result(result)

    def _submit(self, coroutine: Any, timeout: float) -> Any:
        """Run `coroutine` on the session's loop and wait for it; TimeoutError after `timeout`."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def _require(self) -> MCPConnection:
        if self._connection is None:
            raise RuntimeError("MCPClient is not connected; use it as a context manager or call connect()")
        return self._connection

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported to connect(); the thread must not die loudly
            self._failure = error if isinstance(error, MCPConnectError) else MCPConnectError(str(error))
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with MCPConnection(self.server, self.connect_timeout, self.errlog) as connection:
            self._connection = connection
            self._ready.set()
            await self._stop.wait()


def tool_result(result: types.CallToolResult) -> ToolResult:
    """An MCP call result as the observation the model reads."""
    return ToolResult(result_text(result), "tool_error" if result.is_error else None)


def result_text(result: types.CallToolResult) -> str:
    """Text blocks joined by newlines; other blocks described in brackets; the
    structured content as JSON when there is nothing else."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


def failure(error: BaseException) -> tuple[ErrorKind, str]:
    """Whose fault a failed request was, and what to tell the model."""
    if isinstance(error, TimeoutError) or (isinstance(error, MCPError) and error.code == types.REQUEST_TIMEOUT):
        return "timeout", "the MCP server did not answer in time."
    if isinstance(error, MCPError):
        if error.code == types.CONNECTION_CLOSED:
            return "infra", "the MCP server closed the connection (it exited or crashed)."
        if error.code in (types.INVALID_PARAMS, types.METHOD_NOT_FOUND):
            return "tool_error", f"the MCP server refused the call: {error.message}"
        return "infra", f"the MCP server reported an error: {error.message}"
    if isinstance(error, (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError)):
        return "infra", "the connection to the MCP server is broken."
    return "infra", f"{type(error).__name__}: {error}"


def _block_text(block: Any) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, (types.ImageContent, types.AudioContent)):
        return f"[{block.type} {block.mime_type}, {len(block.data) * 3 // 4} bytes]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link {block.uri}]"
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return resource.text
        return f"[resource {resource.uri} ({resource.mime_type or 'binary'})]"
    return f"[{getattr(block, 'type', 'unknown')} content]"


def _forwarder(client: MCPClient, name: str) -> Callable[..., ToolResult]:
    def forward(**arguments: Any) -> ToolResult:
        return client.call(name, arguments)

    forward.__name__ = name
    return forward


def _connect_error(server: ServerCommand, timeout: float, error: BaseException) -> MCPConnectError:
    """What went wrong starting `server`, in words a user can act on."""
    error = _leaf(error)
    where = f"MCP server `{server}`"
    if isinstance(error, MCPConnectError):
        return error
    if isinstance(error, TimeoutError):  # before OSError, of which it is a subclass
        return MCPConnectError(f"the {where} did not complete the MCP handshake within {timeout:g}s")
    if isinstance(error, FileNotFoundError):
        return MCPConnectError(f"cannot start the {where}: {server.command!r} was not found")
    if isinstance(error, OSError):
        return MCPConnectError(f"cannot start the {where}: {error.strerror or error}")
    if isinstance(error, MCPError) and error.code == types.CONNECTION_CLOSED:
        return MCPConnectError(f"the {where} exited before completing the MCP handshake (see its stderr)")
    return MCPConnectError(f"the {where} failed during the MCP handshake: {type(error).__name__}: {error}")


def _leaf(error: BaseException) -> BaseException:
    """The first real error inside (possibly nested) exception groups from task groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error
