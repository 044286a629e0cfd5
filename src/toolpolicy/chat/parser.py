"""Decode the tool calls in one generated assistant turn, never raising.

A malformed call must not crash a run (DESIGN.md, contract 3): each problem becomes a
`CallError` whose `message` is written for the model to read as its observation, and
whose `kind` rewards and metrics count.

Choices worth knowing:
- Text after the first `<|im_end|>` or `<|endoftext|>` is not part of the turn and is dropped.
- A `</tool_call>` with no opener is left in the content, not reported: the gate and the
  rewards see the content anyway, and a final answer may legitimately quote the tag.
- A JSON string inside a call cannot contain `</tool_call>` (the block ends there), as in
  every Hermes-format parser.
- JSON is read leniently about raw control characters inside strings (models write raw
  newlines in code) and strictly about NaN/Infinity, which are not JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from toolpolicy.chat.template import ENDOFTEXT, IM_END, TOOL_CALL_END, TOOL_CALL_START
from toolpolicy.types import CallError, ToolCall

MAX_RAW_CHARS = 200
CALL_SHAPE = 'Write {"name": "<tool name>", "arguments": {...}} inside <tool_call></tool_call>.'


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn split into its text, its well-formed calls and its broken ones."""

    content: str
    tool_calls: tuple[ToolCall, ...]
    errors: tuple[CallError, ...]


class _BadCall(Exception):
    """Internal: a block that did not decode into a call."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def parse_assistant(text: str, *, max_call_chars: int = 2000) -> ParsedTurn:
    """Split generated `text` into content (outside the blocks, stripped), calls and errors.

    >>> parse_assistant('<tool_call>\\n{"name": "calc", "arguments": {"x": 1}}\\n</tool_call><|im_end|>').tool_calls
    (ToolCall(name='calc', arguments={'x': 1}, id=''),)
    """
    text = _cut_at_stop(text)
    content: list[str] = []
    calls: list[ToolCall] = []
    errors: list[CallError] = []
    pos = 0
    while (start := text.find(TOOL_CALL_START, pos)) != -1:
        content.append(text[pos:start])
        body_start = start + len(TOOL_CALL_START)
        end = text.find(TOOL_CALL_END, body_start)
        if end == -1:
            message = f"Tool call was opened with {TOOL_CALL_START} but never closed. End each call with {TOOL_CALL_END}."
            errors.append(CallError("unclosed_tag", message, text[body_start:][:MAX_RAW_CHARS]))
            pos = len(text)
            break
        body = text[body_start:end].strip()
        try:
            calls.append(_decode_call(body, max_call_chars))
        except _BadCall as bad:
            errors.append(CallError(bad.kind, bad.message, body[:MAX_RAW_CHARS]))
        pos = end + len(TOOL_CALL_END)
    content.append(text[pos:])
    return ParsedTurn("".join(content).strip(), tuple(calls), tuple(errors))


def _cut_at_stop(text: str) -> str:
    """The turn ends at the first stop marker; generation past it is not the model's turn."""
    for marker in (IM_END, ENDOFTEXT):
        index = text.find(marker)
        if index != -1:
            text = text[:index]
    return text


def _decode_call(body: str, max_call_chars: int) -> ToolCall:
    """One block body to a ToolCall, or _BadCall saying what the model should fix."""
    if len(body) > max_call_chars:
        raise _BadCall("too_long", f"Tool call is {len(body)} characters, over the limit of {max_call_chars}. Send shorter arguments.")
    try:
        value = _loads(body)
    except json.JSONDecodeError as error:
        raise _BadCall("bad_json", f"Tool call is not valid JSON ({error.msg} at char {error.pos}). {CALL_SHAPE}") from None
    except RecursionError:
        raise _BadCall("bad_json", f"Tool call JSON is nested too deeply. {CALL_SHAPE}") from None
    except ValueError as error:  # NaN/Infinity, or an integer too long to convert
        raise _BadCall("bad_json", f"Tool call is not valid JSON ({str(error)[:80]}). {CALL_SHAPE}") from None
    if not isinstance(value, dict):
        raise _BadCall("not_an_object", f"Tool call must be a JSON object, not {_json_kind(value)}. {CALL_SHAPE}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise _BadCall("missing_name", f'Tool call needs a "name" string naming the tool. {CALL_SHAPE}')
    return ToolCall(name, _decode_arguments(value.get("arguments", {})))


def _decode_arguments(arguments: Any) -> dict[str, Any]:
    """An object, or a JSON string holding an object (some models double-encode)."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            decoded = _loads(arguments)
        except (ValueError, RecursionError):
            decoded = None
        if isinstance(decoded, dict):
            return decoded
    kind = _json_kind(arguments)
    raise _BadCall("bad_arguments", f'Tool call "arguments" must be a JSON object, not {kind}. Write "arguments": {{"param": value}}.')


def _loads(text: str) -> Any:
    """json.loads, lenient about raw control characters in strings, strict about non-finite numbers."""
    return json.loads(text, strict=False, parse_constant=_reject_constant, parse_float=_finite_float)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _json_kind(value: Any) -> str:
    """The JSON name of a decoded value's type, as the model would say it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
