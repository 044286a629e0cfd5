"""JSON-RPC over stdio, one message per line: splitting lines with a size cap, and
checking what a client sends before the MCP SDK sees it.

Both ends of the proxy read newline-delimited JSON-RPC from a pipe. Two things the SDK's
own stdio transports do not give the proxy:

- Linear cost and a cap. Joining each chunk onto the unfinished line and splitting
  the whole again costs time quadratic in the line's length (a 40 MB result took
  tens of seconds). `LineSplitter` keeps the chunks of an unfinished line in a list
  and stops keeping them once the line passes its cap, so an oversized message costs
  one pass over its bytes and a few kilobytes of memory.
- An answer to every malformed request. The SDK drops a line that is not a JSON-RPC
  message without a reply, so a client waits forever. `check_request` names the
  JSON-RPC error each one deserves (https://www.jsonrpc.org/specification#error_object).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from pydantic import ValidationError

KEPT_EDGE_BYTES = 4096
"""Of a line over the cap, how much of its start and its end is kept to find its id."""


@dataclass(frozen=True)
class Oversized:
    """A line longer than the cap: its size, and its first and last bytes (for its id)."""

    size: int
    head: bytes
    tail: bytes


class LineSplitter:
    """Newline-delimited lines from a byte stream, in time linear in its length.

    `feed` returns the lines a chunk completes; a line over `limit` bytes (newline not
    counted) comes out as `Oversized` instead of its bytes.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._head = b""
        self._tail = b""

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        lines: list[bytes | Oversized] = []
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            self._add(chunk[start:end])
            lines.append(self._finish())
            start = end + 1
        if start < len(chunk):
            self._add(chunk[start:])
        return lines

    def _add(self, piece: bytes) -> None:
        before = self._size
        self._size += len(piece)
        if self._size <= self.limit:
            self._parts.append(piece)
            return
        if before <= self.limit:  # this piece takes the line over the cap: keep its start, drop the rest
            self._head = (b"".join(self._parts) + piece[:KEPT_EDGE_BYTES])[:KEPT_EDGE_BYTES]
            self._parts = []
        self._tail = (self._tail + piece[-KEPT_EDGE_BYTES:])[-KEPT_EDGE_BYTES:]

    def _finish(self) -> bytes | Oversized:
        line: bytes | Oversized
        if self._size > self.limit:
            line = Oversized(self._size, self._head, self._tail)
        else:
            line = b"".join(self._parts)
        self._parts, self._size, self._head, self._tail = [], 0, b"", b""
        return line


# `"id": 7}` or `"id": "a"}` ending a message: where a server that writes the result
# first (the TypeScript SDK does) puts the id.
_TRAILING_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,256}")\s*\}\s*$')


def message_id(line: Oversized) -> types.RequestId | None:
    """The id of a JSON-RPC message known only by its first and last bytes, if they show it:
    a top-level "id" member before the first value too large to keep, or closing the message."""
    decoder = json.JSONDecoder()
    text = line.head.decode("utf-8", "replace")
    at = _skip(text, 0)
    if text[at : at + 1] == "{":
        at += 1
        try:
            while True:
                key, at = decoder.raw_decode(text, _skip(text, at))
                at = _skip(text, at)
                if text[at : at + 1] != ":":
                    break
                value, at = decoder.raw_decode(text, _skip(text, at + 1))
                if key == "id":
                    return _request_id(value)
                at = _skip(text, at)
                if text[at : at + 1] != ",":
                    break
                at += 1
        except ValueError:  # the kept start ends inside a value
            pass
    found = _TRAILING_ID.search(line.tail)
    return _request_id(json.loads(found.group(1))) if found else None


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _request_id(value: Any) -> types.RequestId | None:
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Refusal:
    """A client message the proxy answers itself, with a JSON-RPC error."""

    id: types.RequestId | None
    code: int
    message: str

    def reply(self) -> types.JSONRPCError:
        error = types.ErrorData(code=self.code, message=self.message)
        return types.JSONRPCError(jsonrpc="2.0", id=self.id, error=error)  # type: ignore[arg-type]


def check_request(line: bytes) -> types.JSONRPCMessage | Refusal | None:
    """One line from the client as a JSON-RPC message, or the error it must get.

    None for a blank line (ignored). Batches (JSON arrays) are refused: MCP removed
    them in its 2025-06-18 revision.
    """
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return Refusal(None, types.PARSE_ERROR, "Parse error: the message is not valid JSON")
    if isinstance(data, list):
        return Refusal(None, types.INVALID_REQUEST, "Invalid Request: batches are not supported; send one message per line")
    if not isinstance(data, dict):
        return Refusal(None, types.INVALID_REQUEST, f"Invalid Request: a message must be a JSON object, not {_kind(data)}")
    raw_id = data.get("id")
    request_id = _request_id(raw_id)
    if "id" in data and request_id is None:
        return Refusal(None, types.INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
    if data.get("jsonrpc") != "2.0":
        return Refusal(request_id, types.INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
    if "method" not in data and request_id is not None and ("result" in data) != ("error" in data):
        return _parsed(data, request_id)  # a response to a request of the proxy's
    method = data.get("method")
    if not isinstance(method, str) or not method:
        return Refusal(request_id, types.INVALID_REQUEST, 'Invalid Request: "method" must be a non-empty string')
    if "params" in data and not isinstance(data["params"], dict):
        return Refusal(request_id, types.INVALID_PARAMS, f"Invalid params: params must be an object, not {_kind(data['params'])}")
    return _parsed(data, request_id)


def _parsed(data: dict[str, Any], request_id: types.RequestId | None) -> types.JSONRPCMessage | Refusal:
    try:
        return types.jsonrpc_message_adapter.validate_python(data, by_name=False)
    except ValidationError:
        return Refusal(request_id, types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC request, notification or response")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
