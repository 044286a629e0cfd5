"""ToolSet: the tools of one environment, and the one place a decoded call is run.

`ToolSet.call` never raises (docs/architecture.md, contract 3). Whatever goes wrong becomes a
ToolResult the model reads as its observation, with `error` saying whose fault it was:
an unknown tool, arguments that break the schema, or the tool raising ToolError are the
model's; any other exception from inside a tool is ours ("exception", contract 4: the
rollout engine drops the episode and the run reports it). The rule and its reasons are in
`toolpolicy.tools.decorator.tool`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from toolpolicy.tools.decorator import Tool, ToolError
from toolpolicy.types import Image, ToolCall, ToolResult, ToolSpec

MAX_PROBLEMS_SHOWN = 3
TOOL_ERROR_HINT = "raise toolpolicy.tools.ToolError to show the model the message"


class ToolSet:
    """Named tools plus the output limit that keeps one call from flooding the context."""

    def __init__(self, tools: Iterable[Tool], max_output_chars: int = 4000) -> None:
        self._tools: dict[str, Tool] = {}
        for each in tools:
            if each.name in self._tools:
                raise ValueError(f"two tools are named {each.name!r}")
            self._tools[each.name] = each
        self.max_output_chars = max_output_chars

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def specs(self) -> list[ToolSpec]:
        """What the chat template shows the model, in the order the tools were given."""
        return [each.spec for each in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __len__(self) -> int:
        return len(self._tools)

    def call(self, call: ToolCall) -> ToolResult:
        """Validate and run one call; every failure is a ToolResult, never an exception."""
        target = self._tools.get(call.name)
        if target is None:
            available = ", ".join(self._tools) or "none"
            return self._result(f"Unknown tool {call.name!r}. Available tools: {available}.", "unknown_tool")
        try:
            arguments = target.validate(call.arguments)
        except ValidationError as error:
            return self._result(describe_invalid_arguments(target, error), "invalid_arguments")
        try:
            output = target.fn(**arguments)
        except ToolError as error:  # the tool says the call was wrong: the model's to fix
            return self._result(f"Error: {_exception_text(error)}", "tool_error")
        except Exception as error:  # a fault in the tool, not the call; KeyboardInterrupt still propagates
            return self._result(infra_error_text(target.name, error), "exception")
        if isinstance(output, ToolResult):  # a tool that records facts, reports its own error or shows images
            return ToolResult(truncate(output.content, self.max_output_chars), output.error, dict(output.facts), output.images)
        if isinstance(output, Image):  # a picture alone
            return ToolResult("", images=(output,))
        return self._result(output_text(output))

    def _result(self, content: str, error: Any = None) -> ToolResult:
        return ToolResult(truncate(content, self.max_output_chars), error)


def output_text(value: Any) -> str:
    """A tool's return value as observation text: str as is, numbers via str, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # non-str keys, circular references
        return str(value)


def truncate(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was cut so the model knows."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [truncated {len(text) - limit} chars]"


def describe_invalid_arguments(target: Tool, error: ValidationError) -> str:
    """One readable line naming each bad argument and what the tool expects.

    e.g. "Invalid arguments for calculator: 'expression' should be a valid string (got 12).
    Expected: calculator(expression: string)."
    """
    problems = []
    for item in error.errors(include_url=False):
        where = ".".join(str(part) for part in item["loc"]) or "arguments"
        if item["type"] == "missing":
            problems.append(f"missing required argument {where!r}")
        elif item["type"] == "extra_forbidden":
            problems.append(f"unknown argument {where!r}")
        else:
            message = item["msg"].removeprefix("Input ")
            problems.append(f"{where!r} {message} (got {_preview(item['input'])})")
    shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
    return f"Invalid arguments for {target.name}: {shown}. Expected: {signature_text(target.spec)}."


def signature_text(spec: ToolSpec) -> str:
    """A one-line signature from the schema, e.g. "search(query: string, limit?: integer)"."""
    properties = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", ()))
    params = [f"{name}{'' if name in required else '?'}: {_type_text(schema)}" for name, schema in properties.items()]
    return f"{spec.name}({', '.join(params)})"


def _type_text(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " | ".join(json.dumps(value) for value in schema["enum"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " | ".join(kind)
    if kind == "array" and "items" in schema:
        return f"array of {_type_text(schema['items'])}"
    return str(kind)


def _preview(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def infra_error_text(tool_name: str, error: Exception) -> str:
    """What an exception that is not a ToolError becomes: the tool, the type, the message and
    the fix. The model never reads it (its episode is dropped); the run's report of dropped
    episodes quotes it.

    >>> infra_error_text("read", KeyError("B9"))
    "tool 'read' raised KeyError: 'B9' (raise toolpolicy.tools.ToolError to show the model the message)"
    """
    return f"tool {tool_name!r} raised {type(error).__name__}: {truncate(_exception_text(error), 300)} ({TOOL_ERROR_HINT})"


def _exception_text(error: Exception) -> str:
    try:
        return str(error)
    except Exception:  # an exception whose __str__ fails must not escape call()
        return "<unprintable error>"
