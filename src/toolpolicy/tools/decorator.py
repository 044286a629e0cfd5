"""`@tool`: a typed function with a Google-style docstring becomes a Tool.

The schema the model sees is derived from the signature and the docstring, so it can
never drift from the code, and a function that cannot be described fully (a missing
type hint, an undocumented parameter, *args) fails at import time rather than in the
middle of a run. Arguments are validated by a pydantic model in strict mode: the model
must send 12, not "12" (an int is still accepted where a float is expected).

Whose fault a failure is (docs/architecture.md, contracts 3 and 4) is decided by what the tool
raises: `ToolError` for a call that is wrong (the model's), anything else for a fault
of ours (the machine's). See `tool` for the rule and why ValueError is not the model's.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, create_model

from toolpolicy.types import ToolSpec

# OpenAI's rule for function names; it also keeps names plain inside the Hermes JSON.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARGS_HEADERS = ("Args:", "Arguments:", "Parameters:")
_ARG_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class ToolError(Exception):
    """Raised by a tool when the call itself is wrong: the model's fault, to be fixed by the model.

    e.g. an unknown booking id, "June 3" where a date is needed, 1/0 for the calculator.
    ToolSet shows the message to the model as the observation ("Error: <message>", error
    "tool_error"), so write it for the model: what was wrong and what would work.
    """


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with the spec it is shown and the model that checks its arguments."""

    name: str
    spec: ToolSpec
    fn: Callable[..., Any]
    arguments_model: type[BaseModel]

    def __call__(self, **kwargs: Any) -> Any:
        """Call the function directly, without validation."""
        return self.fn(**kwargs)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments the model sent, checked; raises pydantic.ValidationError.

        Only the arguments the model gave are returned, so the function's own defaults apply.
        """
        parsed = self.arguments_model.model_validate(arguments)
        return {name: getattr(parsed, name) for name in parsed.model_fields_set}


@typing.overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@typing.overload
def tool(
    *, name: str | None = None, description: str | None = None, effect: Literal["read", "write"] = "read"
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Literal["read", "write"] = "read",
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function into a Tool: `@tool` or `@tool(name=..., description=..., effect="write")`.

    The description is the docstring's first paragraph unless given; every parameter
    needs a type hint and an entry in the docstring's `Args:` section. `effect` declares
    whether the tool may change state ("write") or only reads ("read", the default).

    Errors, the rule ToolSet.call applies:
      - `raise ToolError("no booking B9")`: the call was wrong, the model's fault. The
        model sees "Error: no booking B9"; the result's error is "tool_error" and the
        episode goes on (a counted event the rewards can use).
      - any other exception (KeyError, AttributeError, an OSError from a dead service,
        and ValueError too): a fault in the tool or what it depends on, the machine's. The
        result's error is "exception", its text names the tool and the exception, and
        the rollout engine ends the episode as infra_error: the model never sees the
        message, and the episode is dropped from every mean, the update and pass^k (never
        scored 0). RL and eval print how many episodes they dropped and why, and RL stops
        when more than half of a step's episodes are dropped.
      - a returned ToolResult carries its own error kind (the sandbox and MCP tools
        decide theirs).
    ValueError is deliberately not the model's: Python raises it from deep inside our
    own code as readily as for a bad argument, and the two mistakes are not equal. A bug
    blamed on the model is silent (scored 0 and trained against); a bad input blamed on
    the machine is loud (it shows up in every summary's infra_errors). So a tool turns
    the bad inputs it knows about into ToolError, as the built-in tools do.
    """
    if effect not in ("read", "write"):
        raise TypeError(f"@tool effect must be 'read' or 'write', not {effect!r}")

    def make(fn: Callable[..., Any]) -> Tool:
        return _make_tool(fn, name or fn.__name__, description, effect)

    return make if fn is None else make(fn)


def _make_tool(fn: Callable[..., Any], name: str, description: str | None, effect: Literal["read", "write"]) -> Tool:
    where = f"@tool {fn.__qualname__}"
    if not TOOL_NAME.match(name):
        raise TypeError(f"{where}: tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
    doc_description, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    description = description or doc_description
    if not description:
        raise TypeError(f"{where}: needs a docstring whose first paragraph describes the tool, or description=...")
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        label = f"{where}: parameter {param.name!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(f"{label}: a tool takes named arguments only (no *args, **kwargs or positional-only)")
        if param.name not in hints:
            raise TypeError(f"{label} has no type hint")
        if param.name not in arg_docs:
            raise TypeError(f"{label} is not described in the docstring's Args: section")
        properties[param.name] = {**json_schema(hints[param.name], label), "description": arg_docs[param.name]}
        if param.default is param.empty:
            required.append(param.name)
            fields[param.name] = (hints[param.name], ...)
        else:
            fields[param.name] = (hints[param.name], param.default)
    if extra := sorted(set(arg_docs) - set(properties)):
        raise TypeError(f"{where}: docstring describes {', '.join(extra)}, which the function does not take")
    model = create_model(f"{name}_arguments", __config__=ConfigDict(strict=True, extra="forbid"), **fields)
    parameters = {"type": "object", "properties": properties, "required": required}
    return Tool(name, ToolSpec(name, description, parameters, effect), fn, model)


def json_schema(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON schema of one supported type hint; TypeError (naming `where`) for any other.

    >>> json_schema(list[int] | None, "x")
    {'type': ['array', 'null'], 'items': {'type': 'integer'}}
    """
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    if annotation is list or origin is list:
        return {"type": "array", **({"items": json_schema(args[0], where)} if args else {})}
    if annotation is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"{where}: dict keys must be str (JSON object keys are strings)")
        return {"type": "object", **({"additionalProperties": json_schema(args[1], where)} if args else {})}
    if origin is Literal:
        kinds = {_JSON_TYPES.get(type(value)) for value in args}
        if None in kinds:
            raise TypeError(f"{where}: Literal values must be str, int, float or bool")
        return {"type": kinds.pop(), "enum": list(args)} if len(kinds) == 1 else {"enum": list(args)}
    if origin in (Union, types.UnionType):
        present = [arg for arg in args if arg is not type(None)]
        if len(present) == 1 and len(args) == 2:
            return _nullable(json_schema(present[0], where))
    raise TypeError(
        f"{where}: unsupported type {annotation!r}; use str, int, float, bool, list[X], dict[str, X], Literal[...] or X | None"
    )


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` widened to also accept null."""
    widened = dict(schema)
    if "type" in widened:
        widened["type"] = [widened["type"], "null"]
    if "enum" in widened:
        widened["enum"] = [*widened["enum"], None]
    return widened


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """A Google-style docstring's first paragraph (joined to one line) and its `Args:` entries.

    >>> parse_docstring("Add two numbers.\\n\\nArgs:\\n    a: The first.\\n    b (int): The second,\\n        continued.")
    ('Add two numbers.', {'a': 'The first.', 'b': 'The second, continued.'})
    """
    lines = inspect.cleandoc(doc).splitlines()
    paragraph: list[str] = []
    for line in lines:
        if not line.strip() or line.strip() in _ARGS_HEADERS:
            break
        paragraph.append(line.strip())
    entries: dict[str, str] = {}
    in_args, current, entry_indent = False, "", -1
    for line in lines:
        stripped, indent = line.strip(), len(line) - len(line.lstrip())
        if indent == 0 and stripped:
            in_args, current, entry_indent = stripped in _ARGS_HEADERS, "", -1
            continue
        if not in_args or not stripped:
            continue
        if entry_indent == -1:
            entry_indent = indent
        match = _ARG_ENTRY.match(stripped)
        if indent == entry_indent and match:
            current = match.group(1)
            entries[current] = match.group(2).strip()
        elif current:
            entries[current] = f"{entries[current]} {stripped}".strip()
    return " ".join(paragraph), entries
