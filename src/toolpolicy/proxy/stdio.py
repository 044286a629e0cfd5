"""The proxy's two stdio transports: towards its client (this process's stdin and stdout)
and towards the upstream server (a child process's pipes).

They replace the MCP SDK's `stdio_server` and `stdio_client` for the proxy, with what
framing.py describes: lines split in linear time with a size cap, and every malformed
client message answered with a JSON-RPC error. Both hand the SDK the same memory
streams of `SessionMessage`s as the SDK's own transports.

A message over the cap is never parsed. From the client it gets an error reply with
its id when its first or last bytes show it. From the upstream it becomes an error
reply (code MESSAGE_TOO_LARGE) to the request it answers, so the call fails at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage

from toolpolicy.atomic import write_all
from toolpolicy.proxy.framing import LineSplitter, Oversized, Refusal, check_request, message_id
from toolpolicy.tools.mcp_client import CLIENT_INFO, MCPConnection, ServerCommand

MESSAGE_TOO_LARGE = -32050
"""The error code of an upstream reply the proxy refused for its size: a server-defined code
of JSON-RPC's reserved range that the MCP SDK does not use (-32001 is its request timeout,
so an upstream that timed out would otherwise be reported as a result too large)."""
READ_CHUNK = 1 << 16
QUEUED_LINES = 64
"""Client lines read ahead of the server: a client that floods the proxy waits on its pipe."""
STOP_GRACE_SECONDS = 2.0
KILL = getattr(signal, "SIGKILL", signal.SIGTERM)
EXIT_DRAIN_SECONDS = 0.5
"""After the upstream exited and its process group was killed, how long its last replies may
take to arrive before the proxy ends the stream (a process that left the group may still
hold the pipe open)."""


# ---- towards the client: this process's stdin and stdout --------------------------


@asynccontextmanager
async def client_stdio(max_message_bytes: int) -> AsyncIterator[tuple[Any, Any]]:
    """(read stream, write stream) for `Server.run`, over this process's stdin and stdout.

    While it runs, fd 1 points at stderr, so a stray print cannot corrupt the protocol;
    messages go out through a private duplicate of the original stdout.
    """
    wire = _claim_stdout()
    writer = WireWriter(wire)
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_client() -> None:
        async with read_send:
            async for line in StdinLines(max_message_bytes):
                message = _too_large(line, max_message_bytes) if isinstance(line, Oversized) else check_request(line)
                if isinstance(message, Refusal):
                    await writer.send(message.reply())
                elif message is not None:
                    await read_send.send(SessionMessage(message))

    async def write_client() -> None:
        async with write_receive:
            async for session_message in write_receive:
                await writer.send(session_message.message)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(read_client)
            group.start_soon(write_client)
            yield read_receive, write_send
            group.cancel_scope.cancel()
    finally:
        _release_stdout(wire)


def _too_large(line: Oversized, limit: int) -> Refusal:
    return Refusal(
        message_id(line),
        types.INVALID_REQUEST,
        f"Invalid Request: the message is {line.size:,} bytes, over the proxy's limit of {limit:,} bytes per message "
        "(see --max-request-bytes)",
    )


def _claim_stdout() -> int:
    """A private duplicate of fd 1 for protocol messages; fd 1 itself now goes to stderr."""
    sys.stdout.flush()
    wire = os.dup(1)
    os.dup2(2, 1)
    return wire


def _release_stdout(wire: int) -> None:
    os.dup2(wire, 1)
    os.close(wire)


class WireWriter:
    """Writes whole JSON-RPC messages, one per line, to a file descriptor. The blocking
    write runs on a worker thread, so a client slow to read does not stall the proxy."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = anyio.Lock()

    async def send(self, message: Any) -> None:
        data = (message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode("utf-8")
        async with self._lock:
            await anyio.to_thread.run_sync(write_all, self.fd, data)


class StdinLines:
    """This process's stdin as an async iterator of lines (bytes, or Oversized past
    `limit`), read and split by a daemon thread.

    A cancellation cannot abandon the SDK's worker-thread reads, so a proxy whose upstream
    died would have to wait for the client's next line before it could exit; a daemon
    thread blocked in a read does not hold the exit. The thread reads fd 0 directly: one
    blocked inside sys.stdin's buffered reader would hold its lock and abort the
    interpreter's shutdown. The queue is bounded, so a client that floods the proxy waits.
    """

    def __init__(self, limit: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[bytes | Oversized | None] = asyncio.Queue(QUEUED_LINES)
        self._splitter = LineSplitter(limit)
        threading.Thread(target=self._pump, name="toolpolicy-stdin", daemon=True).start()

    def _pump(self) -> None:
        try:
            while chunk := os.read(0, READ_CHUNK):
                for line in self._splitter.feed(chunk):
                    self._put(line)
            self._put(None)
        except (RuntimeError, OSError):  # the loop is closed, or stdin is: the proxy is stopping
            return

    def _put(self, line: bytes | Oversized | None) -> None:
        asyncio.run_coroutine_threadsafe(self._lines.put(line), self._loop).result()

    def __aiter__(self) -> StdinLines:
        return self

    async def __anext__(self) -> bytes | Oversized:
        line = await self._lines.get()
        if line is None:
            raise StopAsyncIteration
        return line


# ---- towards the upstream server: a child process ---------------------------------


@asynccontextmanager
async def upstream_stdio(
    params: StdioServerParameters, errlog: TextIO, max_message_bytes: int
) -> AsyncIterator[tuple[Any, Any, Process]]:
    """Start the server and yield (read stream, write stream) for a ClientSession, and the process.

    The server runs in its own process group (POSIX), so stopping it stops whatever it
    started. On exit: stdin closed, then SIGTERM and SIGKILL if it lingers, and SIGKILL
    to the group, whose other processes would otherwise outlive the proxy.

    The server's exit is watched itself, not inferred from its output ending: a process
    it started may hold the pipe open after it crashed, and the calls in flight would
    wait for their timeout. Once it has exited, its group is killed and the read stream
    ends, so the session fails those calls at once.
    """
    process = await anyio.open_process(
        [params.command, *params.args],
        env={**get_default_environment(), **(params.env or {})},
        cwd=params.cwd,
        stderr=errlog,
        start_new_session=sys.platform != "win32",
    )
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    output_ended = anyio.Event()

    async def read_server() -> None:
        assert process.stdout is not None
        splitter = LineSplitter(max_message_bytes)
        async with read_send:
            try:
                async for chunk in process.stdout:
                    for line in splitter.feed(chunk):
                        if line:
                            await read_send.send(_upstream_message(line, max_message_bytes))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass  # the server is gone; closing the stream tells the session
            finally:
                output_ended.set()
            with anyio.move_on_after(EXIT_DRAIN_SECONDS):  # its exit status, for the calls that fail
                await process.wait()

    async def write_server() -> None:
        assert process.stdin is not None
        async with write_receive:
            try:
                async for session_message in write_receive:
                    data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode("utf-8"))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await read_send.aclose()  # a server that stopped reading is a closed connection

    async def watch_server() -> None:
        await process.wait()
        _signal_group(process, KILL)  # what it started goes with it, holding its pipe or not
        with anyio.move_on_after(EXIT_DRAIN_SECONDS):
            await output_ended.wait()
        await read_send.aclose()  # the session fails the calls in flight: the server is gone

    async with anyio.create_task_group() as group:
        group.start_soon(read_server)
        group.start_soon(write_server)
        group.start_soon(watch_server)
        try:
            yield read_receive, write_send, process
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
            group.cancel_scope.cancel()


def _upstream_message(line: bytes | Oversized, limit: int) -> SessionMessage | Exception:
    """One line from the server for the session: a message, an error reply in place of
    one too large to read, or the parse error (which the session ignores)."""
    if isinstance(line, Oversized):
        request_id = message_id(line)
        text = f"the MCP server's reply is {line.size:,} bytes, over the proxy's limit of {limit:,} bytes per message"
        if request_id is None:
            return ValueError(f"{text}, and its request id could not be found")
        error = types.ErrorData(code=MESSAGE_TOO_LARGE, message=text)
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as error:
        return error


async def _stop(process: Process) -> None:
    """Close the server's stdin, signal its process group if it does not exit, and kill
    what is left of the group once it has."""
    if process.stdin is not None:
        try:
            await process.stdin.aclose()
        except (anyio.BrokenResourceError, OSError):
            pass
    for stop in (signal.SIGTERM, KILL):
        with anyio.move_on_after(STOP_GRACE_SECONDS):
            await _exited(process)
            break
        _signal_group(process, stop)
    else:
        with anyio.move_on_after(STOP_GRACE_SECONDS):
            await _exited(process)
    if sys.platform != "win32":
        _signal_group(process, KILL)


async def _exited(process: Process) -> None:
    while process.returncode is None:
        await anyio.sleep(0.02)


def _signal_group(process: Process, number: int) -> None:
    try:
        if sys.platform == "win32":
            process.kill()
        else:
            os.killpg(process.pid, number)
    except (ProcessLookupError, PermissionError):
        pass


class UpstreamConnection(MCPConnection):
    """An MCPConnection over `upstream_stdio`: the upstream's replies are capped at
    `max_message_bytes` and read in linear time."""

    def __init__(self, server: ServerCommand, connect_timeout: float, max_message_bytes: int) -> None:
        super().__init__(server, connect_timeout)
        self.max_message_bytes = max_message_bytes
        self._process: Process | None = None

    @property
    def exit_status(self) -> int | None:
        """The upstream's exit status once it has exited (negative: the signal that ended it), else None."""
        return self._process.returncode if self._process is not None else None

    async def _connect(self) -> None:
        """As MCPConnection._connect, over this proxy's transport."""
        transport = upstream_stdio(self.server.parameters(), self.errlog, self.max_message_bytes)
        upstream_read, write, self._process = await self._stack.enter_async_context(transport)
        relay_send, read = anyio.create_memory_object_stream[Any](0)
        group = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.callback(group.cancel_scope.cancel)
        group.start_soon(self._relay, upstream_read, relay_send)
        self._session = await self._stack.enter_async_context(
            ClientSession(read, write, message_handler=self._on_message, client_info=CLIENT_INFO)
        )
        with anyio.fail_after(self.connect_timeout):
            self.initialize_result = await self._session.initialize()

