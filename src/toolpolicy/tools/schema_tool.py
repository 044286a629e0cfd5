"""Tools described by a JSON schema rather than by a typed Python function.

An MCP server's tools and the BFCL multi-turn backends come with JSON schemas of their
arguments and no type hints `@tool` could read. `schema_tool` checks the schema once and
returns a Tool whose arguments `jsonschema` validates. A failed check is raised as a
pydantic ValidationError with pydantic's own error types for a missing or unknown
argument, so ToolSet describes it to the model like any other tool's
("invalid_arguments").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import PydanticCustomError

from toolpolicy.tools.decorator import Tool
from toolpolicy.types import ToolSpec


@dataclass(frozen=True)
class SchemaTool(Tool):
    """A tool whose arguments are checked against its spec's JSON schema (not a pydantic model)."""

    checker: Any = field(default=None, compare=False, repr=False)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        problems = [line for error in self.checker.iter_errors(arguments) for line in _line_errors(error)]
        if problems:
            raise ValidationError.from_exception_data(f"{self.name}_arguments", problems)
        return dict(arguments)


def schema_tool(
    spec: ToolSpec, fn: Callable[..., Any], source: str = "tool", checked: dict[str, Any] | None = None
) -> SchemaTool:
    """`fn` as a tool shown to the model as `spec`, its arguments checked against `checked`
    (default: `spec.parameters`); ValueError naming `source` and the tool when that is not
    a valid JSON schema."""
    schema = spec.parameters if checked is None else checked
    try:
        checker = jsonschema.validators.validator_for(schema)
        checker.check_schema(schema)
    except jsonschema.SchemaError as error:
        raise ValueError(f"{source} {spec.name!r} has an invalid input schema: {error.message}") from None
    return SchemaTool(spec.name, spec, fn, _open_model(spec.name), checker(schema))


def _line_errors(error: jsonschema.ValidationError) -> list[dict[str, Any]]:
    """One jsonschema error as pydantic line errors: a missing or unknown argument gets
    pydantic's own error type, anything else the schema's message."""
    path = tuple(error.absolute_path)
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        missing = [name for name in error.validator_value if name not in instance]
        return [{"type": "missing", "loc": (*path, name), "input": instance} for name in missing]
    if error.validator == "additionalProperties" and error.validator_value is False and isinstance(instance, dict):
        extra = [name for name in instance if name not in error.schema.get("properties", {})]
        return [{"type": "extra_forbidden", "loc": (*path, name), "input": instance[name]} for name in extra]
    if error.validator == "type":
        expected = error.validator_value if isinstance(error.validator_value, str) else " or ".join(error.validator_value)
        message = f"should be of type {expected}"
    else:
        message = error.message
    return [{"type": PydanticCustomError("json_schema", "{message}", {"message": message}), "loc": path, "input": instance}]


def _open_model(name: str) -> type[BaseModel]:
    """A pydantic model that takes any arguments: the JSON schema does the checking."""
    return create_model(f"{name}_arguments", __config__=ConfigDict(extra="allow"))
