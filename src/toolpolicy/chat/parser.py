"""Decode the tool calls in one generated assistant turn, never raising.

A malformed call must not crash a run (docs/architecture.md, contract 3): each problem becomes a
`CallError` whose `message` is written for the model to read as its observation, and
whose `kind` rewards and metrics count.

Model families write calls differently; each syntax is one pure function from the
turn's text to a `ParsedTurn`, chosen once by name (`CALL_SYNTAXES`):
- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks anywhere in
  the text (Qwen2.5, Qwen3, Hermes, the embedded model);
- `llama3_json`: the whole turn is one JSON object `{"name": ..., "parameters": {...}}`
  (Llama 3.1/3.2), or several separated by `;`, optionally after `<|python_tag|>`;
- `mistral`: `[TOOL_CALLS]` then a JSON array of calls (tokenizer v2-v7) or
  `name[ARGS]{...}` per call (v11 and later), each call's id kept.
A reasoning block (`<think>...</think>`, Qwen3 and others) is split off first when the
format has one, so a call inside the reasoning is not a call.

Choices worth knowing:
- Text after the first stop string (`<|im_end|>`, `<|eot_id|>`, `</s>`, ...) is not part
  of the turn and is dropped.
- A `</tool_call>` with no opener is left in the content, not reported: the gate and the
  rewards see the content anyway, and a final answer may legitimately quote the tag.
- A JSON string inside a call cannot contain `</tool_call>` (the block ends there), as in
  every Hermes-format parser.
- JSON is read leniently about raw control characters inside strings (models write raw
  newlines in code) and strictly about NaN/Infinity, which are not JSON. Arguments may
  be under "arguments" or "parameters" in every syntax.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from toolpolicy.chat.tokens import ENDOFTEXT, IM_END, TOOL_CALL_END, TOOL_CALL_START
from toolpolicy.types import CallError, ToolCall

MAX_RAW_CHARS = 200
CALL_SHAPE = 'Write {"name": "<tool name>", "arguments": {...}} inside <tool_call></tool_call>.'
CHATML_STOPS = (IM_END, ENDOFTEXT)
THINK_START = "<think>"
THINK_END = "</think>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn split into its text, its well-formed calls and its broken ones,
    and the reasoning before them when the format has a reasoning block."""

    content: str
    tool_calls: tuple[ToolCall, ...]
    errors: tuple[CallError, ...]
    reasoning: str = ""


class _BadCall(Exception):
    """Internal: a block that did not decode into a call."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def parse_assistant(
    text: str,
    *,
    max_call_chars: int = 2000,
    syntax: str = "hermes",
    stops: Sequence[str] = CHATML_STOPS,
    reasoning: bool = False,
) -> ParsedTurn:
    """Split generated `text` into content (stripped), calls, errors and reasoning.

    >>> parse_assistant('<tool_call>\\n{"name": "calc", "arguments": {"x": 1}}\\n</tool_call><|im_end|>').tool_calls
    (ToolCall(name='calc', arguments={'x': 1}, id=''),)
    """
    text = cut_at_stop(text, stops)
    thought, text = split_reasoning(text) if reasoning else ("", text)
    return replace(CALL_SYNTAXES[syntax](text, max_call_chars), reasoning=thought)


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """The turn ends at the first stop string; generation past it is not the model's turn."""
    ends = [i for i in (text.find(stop) for stop in stops) if i != -1]
    return text[: min(ends)] if ends else text


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, the rest) of a turn that may open with `<think>...</think>`.

    A `</think>` without an opener closes reasoning that the generation prompt opened.
    An unclosed block is all reasoning (the turn was cut while thinking)."""
    end = text.find(THINK_END)
    if end == -1:
        body = text.lstrip()
        return (body[len(THINK_START) :].strip(), "") if body.startswith(THINK_START) else ("", text)
    thought = text[:end].strip()
    thought = thought[len(THINK_START) :].strip() if thought.startswith(THINK_START) else thought
    return thought, text[end + len(THINK_END) :]


def hermes_calls(text: str, max_call_chars: int) -> ParsedTurn:
    """`<tool_call>` JSON blocks anywhere in the text; the rest is content."""
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
        _decode_into(text[body_start:end].strip(), max_call_chars, calls, errors)
        pos = end + len(TOOL_CALL_END)
    content.append(text[pos:])
    return ParsedTurn("".join(content).strip(), tuple(calls), tuple(errors))


def llama3_json_calls(text: str, max_call_chars: int) -> ParsedTurn:
    """A turn that opens with a JSON object is calls (objects separated by `;`); any other
    turn is content. Text after the last object is kept as content."""
    body = text.strip()
    body = body[len(PYTHON_TAG) :].lstrip() if body.startswith(PYTHON_TAG) else body
    if not body.startswith("{"):
        return ParsedTurn(text.strip(), (), ())
    if len(body) > max_call_chars:
        return ParsedTurn("", (), (_too_long(body, max_call_chars),))
    calls: list[ToolCall] = []
    errors: list[CallError] = []
    decoder = json.JSONDecoder(strict=False, parse_constant=_reject_constant, parse_float=_finite_float)
    pos = 0
    while pos < len(body) and body[pos] == "{":
        try:
            value, pos = decoder.raw_decode(body, pos)
        except (ValueError, RecursionError):  # the rest is no object: one bad call, said why
            _decode_into(body[pos:], max_call_chars, calls, errors)
            return ParsedTurn("", tuple(calls), tuple(errors))
        _decode_into(value, max_call_chars, calls, errors)
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
    return ParsedTurn(body[pos:].strip(), tuple(calls), tuple(errors))


def mistral_calls(text: str, max_call_chars: int) -> ParsedTurn:
    """Content, then `[TOOL_CALLS]` and a JSON array of calls, or `name[ARGS]{...}` per call."""
    content, *chunks = text.split(MISTRAL_CALLS)
    calls: list[ToolCall] = []
    errors: list[CallError] = []
    for chunk in (c.strip() for c in chunks):
        if chunk.startswith("["):
            _decode_array(chunk, max_call_chars, calls, errors)
        elif MISTRAL_ARGS in chunk:
            head, arguments = chunk.split(MISTRAL_ARGS, 1)
            name, _, call_id = head.partition(MISTRAL_CALL_ID)
            _decode_into(f'{{"name": {json.dumps(name.strip())}, "arguments": {arguments}}}', max_call_chars, calls, errors, call_id.strip())
        else:
            message = f'After {MISTRAL_CALLS} write a JSON array: [{{"name": "<tool name>", "arguments": {{...}}}}].'
            errors.append(CallError("bad_json", message, chunk[:MAX_RAW_CHARS]))
    return ParsedTurn(content.strip(), tuple(calls), tuple(errors))


CallSyntax = Callable[[str, int], ParsedTurn]
CALL_SYNTAXES: dict[str, CallSyntax] = {"hermes": hermes_calls, "llama3_json": llama3_json_calls, "mistral": mistral_calls}
"""Each tool-call syntax by the name a config gives it (`chat_format`)."""


def _decode_array(body: str, max_call_chars: int, calls: list[ToolCall], errors: list[CallError]) -> None:
    """A JSON array of call objects (Mistral); each object keeps its "id"."""
    if len(body) > max_call_chars:
        errors.append(_too_long(body, max_call_chars))
        return
    try:
        values = _loads(body)
    except (ValueError, RecursionError) as error:
        message = f"Tool calls are not a valid JSON array ({str(error)[:80]}). {CALL_SHAPE}"
        errors.append(CallError("bad_json", message, body[:MAX_RAW_CHARS]))
        return
    for value in values if isinstance(values, list) else [values]:
        call_id = value.get("id") if isinstance(value, dict) else None
        _decode_into(value, max_call_chars, calls, errors, call_id if isinstance(call_id, str) else "")


def _decode_into(body: Any, max_call_chars: int, calls: list[ToolCall], errors: list[CallError], call_id: str = "") -> None:
    """Decode one call (its JSON text, or an already decoded value) into `calls`, or say
    what is wrong with it in `errors`."""
    try:
        call = _decode_call(body, max_call_chars) if isinstance(body, str) else _call_from_value(body)
        calls.append(replace(call, id=call_id) if call_id else call)
    except _BadCall as bad:
        raw = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, default=str)
        errors.append(CallError(bad.kind, bad.message, raw[:MAX_RAW_CHARS]))


def _too_long(body: str, max_call_chars: int) -> CallError:
    message = f"Tool call is {len(body)} characters, over the limit of {max_call_chars}. Send shorter arguments."
    return CallError("too_long", message, body[:MAX_RAW_CHARS])


def _decode_call(body: str, max_call_chars: int) -> ToolCall:
    """One call's JSON text to a ToolCall, or _BadCall saying what the model should fix."""
    if len(body) > max_call_chars:
        raise _BadCall("too_long", _too_long(body, max_call_chars).message)
    try:
        value = _loads(body)
    except json.JSONDecodeError as error:
        raise _BadCall("bad_json", f"Tool call is not valid JSON ({error.msg} at char {error.pos}). {CALL_SHAPE}") from None
    except RecursionError:
        raise _BadCall("bad_json", f"Tool call JSON is nested too deeply. {CALL_SHAPE}") from None
    except ValueError as error:  # NaN/Infinity, or an integer too long to convert
        raise _BadCall("bad_json", f"Tool call is not valid JSON ({str(error)[:80]}). {CALL_SHAPE}") from None
    return _call_from_value(value)


def _call_from_value(value: Any) -> ToolCall:
    """A decoded JSON value to a ToolCall: an object with a "name" and its arguments."""
    if not isinstance(value, dict):
        raise _BadCall("not_an_object", f"Tool call must be a JSON object, not {_json_kind(value)}. {CALL_SHAPE}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise _BadCall("missing_name", f'Tool call needs a "name" string naming the tool. {CALL_SHAPE}')
    return ToolCall(name, _decode_arguments(value.get("arguments", value.get("parameters", {}))))


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
