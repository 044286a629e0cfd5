"""Conversations as OpenAI chat records: the format SFT data is read in and episodes are exported in.

One record is one conversation:

    {"messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "What is 17 * 23?"},
                  {"role": "assistant", "content": null, "tool_calls": [
                      {"id": "call_0", "type": "function",
                       "function": {"name": "calculator", "arguments": "{\"expression\": \"17 * 23\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "391"},
                  {"role": "assistant", "content": "Answer: 391"}],
     "tools": [{"type": "function", "function": {"name": "calculator", "description": "...", "parameters": {...}}}]}

`arguments` is a JSON object, as a string (OpenAI's form) or as an object; `id`,
`tool_call_id` and `name` may be left out. An assistant's reasoning travels as
`reasoning_content`. Reading checks every field and raises RecordError naming the
message and the field; the caller adds the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolpolicy.types import Message, ToolCall, ToolSpec
from toolpolicy.jsonl import json_object, json_value

ROLES = ("system", "user", "assistant", "tool")


class RecordError(ValueError):
    """A record that is not a usable chat conversation; the message names the field."""


@dataclass(frozen=True)
class Conversation:
    """A whole recorded dialogue and the tools its system prompt lists."""

    messages: list[Message]
    tools: list[ToolSpec] | None
    """None when the record has no "tools" (the reader decides what it is shown, see sft_data)."""


def chat_record(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """A conversation (an episode's messages, with its environment's tools) as an OpenAI chat record."""
    return {"messages": [_message_record(m) for m in messages], "tools": [spec.to_openai() for spec in tools]}


def _message_record(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [_call_record(call) for call in message.tool_calls]
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    if message.name:
        out["name"] = message.name
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


def _call_record(call: ToolCall) -> dict[str, Any]:
    function = {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}
    return {**({"id": call.id} if call.id else {}), "type": "function", "function": function}


def conversation_from_record(record: Any) -> Conversation:
    """The conversation a chat record holds. RecordError if a field is missing or of the wrong
    type, or if the dialogue cannot be trained on: no assistant turn, an assistant turn
    before any prompt, or two assistant turns with nothing between them."""
    if not isinstance(record, dict):
        raise RecordError(f"expected a JSON object with 'messages', got {type(record).__name__}")
    raw = record.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RecordError("'messages' must be a non-empty list of messages")
    messages = [_read_message(m, f"messages[{i}]") for i, m in enumerate(raw)]
    roles = [m.role for m in messages]
    if "assistant" not in roles:
        raise RecordError("no assistant message: nothing to train on")
    if roles[0] == "assistant":
        raise RecordError("messages[0]: an assistant turn needs a system or user message before it")
    for i in range(1, len(roles)):
        if roles[i] == roles[i - 1] == "assistant":
            raise RecordError(f"messages[{i}]: two assistant messages in a row (merge them into one turn)")
    tools = record.get("tools")
    if tools is None:
        return Conversation(messages, None)
    if not isinstance(tools, list):
        raise RecordError("'tools' must be a list of {type: function, function: {name, description, parameters}}")
    return Conversation(messages, [_read_tool(t, f"tools[{i}]") for i, t in enumerate(tools)])


def unoffered_call(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str | None:
    """The first assistant call to a tool `tools` does not list, as "FIELD: what is wrong", or None.

    >>> unoffered_call([Message("assistant", "", (ToolCall("convert", {}),))], [])
    "messages[0].tool_calls[0].function.name: calls 'convert', a tool the record does not offer (it offers none)"
    """
    offered = [spec.name for spec in tools]
    for i, message in enumerate(messages):
        for j, call in enumerate(message.tool_calls):
            if call.name not in offered:
                listed = ", ".join(offered) or "none"
                return (f"messages[{i}].tool_calls[{j}].function.name: calls {call.name!r}, a tool the record does not offer "
                        f"(it offers {listed})")
    return None


def _read_message(raw: Any, where: str) -> Message:
    if not isinstance(raw, dict):
        raise RecordError(f"{where}: expected an object with 'role' and 'content', got {type(raw).__name__}")
    role = raw.get("role")
    if role not in ROLES:
        raise RecordError(f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}")
    content = _optional_text(raw, "content", where)
    calls = raw.get("tool_calls") or []
    if not isinstance(calls, list) or (calls and role != "assistant"):
        raise RecordError(f"{where}.tool_calls: a list, on assistant messages only")
    if role != "assistant" and raw.get("content") is None:
        raise RecordError(f"{where}.content: a {role} message needs text")
    return Message(
        role,
        content,
        tuple(_read_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls)),
        name=_optional_text(raw, "name", where),
        tool_call_id=_optional_text(raw, "tool_call_id", where),
        reasoning=_optional_text(raw, "reasoning_content", where),
    )


def _read_call(raw: Any, where: str) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict):
        raise RecordError(f"{where}: expected {{type: function, function: {{name, arguments}}}}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise RecordError(f"{where}.function.name: expected the tool's name, got {name!r}")
    arguments, at = function.get("arguments"), f"{where}.function.arguments"
    if isinstance(arguments, str):
        arguments = json_value(arguments, at, RecordError)
    return ToolCall(name, json_object(arguments, at, RecordError), _optional_text(raw, "id", where))


def _read_tool(raw: Any, where: str) -> ToolSpec:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RecordError(f"{where}: expected {{type: function, function: {{name, description, parameters}}}}")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise RecordError(f"{where}.function.parameters: expected a JSON schema object, got {type(parameters).__name__}")
    return ToolSpec(function["name"], _optional_text(function, "description", f"{where}.function"), parameters)


def _optional_text(raw: dict[str, Any], key: str, where: str) -> str:
    """raw[key] as text; missing or null is ""."""
    value = raw.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RecordError(f"{where}.{key}: expected a string, got {type(value).__name__}")
    return value
