"""BFCL's executable backends, driven the way BFCL's own evaluation drives them.

The backend classes (GorillaFileSystem, TradingBot, ...) are imported from the installed
bfcl_eval at run time. Each episode gets fresh instances loaded with the entry's initial
config (`fresh_instances`), as BFCL's `execute_multi_turn_func_call` makes them. A call's
observation is what BFCL records as its execution result (`execution_text`): a string
as returned, a dict as JSON, anything else through str(); an exception inside the method
becomes "Error during execution: ..." rather than an error of ours, because BFCL scores
it that way (a model passing a wrong id makes a backend raise KeyError) and its response
check compares these strings.

The function docs become tool specs (`tool_spec`): BFCL's schema dialect ("dict",
"float", "tuple", "any") turned into JSON Schema. The model is shown the types, but, as in
BFCL, the backends receive the values as the model wrote them: only the argument names
are enforced (`accepted_arguments`: no unknown argument, none of the required missing).
BFCL's own ground truth relies on it: multi_turn_*_173 closes ticket_id='ticket_001'
where the doc says integer, and expects the backend's "not found" error. Ground-truth
calls are Python call strings, some with positional arguments ("sort('a.txt')");
`parse_call` names them from the method's signature so they travel the same tool path as
a model's JSON calls.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from typing import Any

from toolpolicy.envs.bfcl.data import Entry
from toolpolicy.types import ToolCall, ToolSpec

STATE_FREE = ("MathAPI",)
"""Backends without a scenario to load (BFCL's STATELESS_CLASSES)."""

BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
"""BFCL's schema type names that JSON Schema spells differently; "any" drops the type."""


def backend_class(name: str) -> type:
    """The backend class `name` from the installed bfcl_eval."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)


def fresh_instances(entry: Entry) -> dict[str, Any]:
    """One instance per backend the entry involves, loaded with a copy of its initial config."""
    instances = {}
    for name in entry.classes:
        instance = backend_class(name)()
        if name not in STATE_FREE:
            instance._load_scenario(copy.deepcopy(entry.initial_config.get(name, {})), long_context=entry.long_context)
        instances[name] = instance
    return instances


def method_owners(instances: dict[str, Any]) -> dict[str, Any]:
    """Public method name -> the instance that has it (BFCL's names are unique across backends)."""
    return {
        name: instance
        for instance in instances.values()
        for name, _ in inspect.getmembers(instance, predicate=inspect.ismethod)
        if not name.startswith("_")
    }


def execution_text(value: Any) -> str:
    """A backend method's return value as BFCL records it: str as is, dict as JSON, else str()."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def run_method(owner: Any, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """Call `owner.name(**arguments)`: (BFCL's execution text, whether it raised)."""
    try:
        return execution_text(getattr(owner, name)(**arguments)), False
    except Exception as error:  # BFCL's eval loop records any exception as the call's result
        return f"Error during execution: {error}", True


def parse_call(text: str, owners: dict[str, Any]) -> ToolCall:
    """A ground-truth call string as a ToolCall with named arguments.

    >>> class Files:
    ...     def sort(self, file_name: str) -> None: ...
    >>> parse_call("sort('a.txt')", {"sort": Files()})
    ToolCall(name='sort', arguments={'file_name': 'a.txt'}, id='')
    """
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    name = node.func.id
    if name not in owners:
        raise ValueError(f"{text!r} calls {name}, which none of the entry's backends has")
    positional = list(inspect.signature(getattr(owners[name], name)).parameters)
    arguments = {positional[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
    arguments.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None})
    return ToolCall(name, arguments)


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A BFCL parameter schema in JSON Schema's words (recursively).

    >>> json_schema({"type": "dict", "properties": {"x": {"type": "float"}}, "required": ["x"]})
    {'type': 'object', 'properties': {'x': {'type': 'number'}}, 'required': ['x']}
    """
    out = {key: value for key, value in schema.items() if key not in ("type", "properties", "items")}
    kind = schema.get("type")
    if kind is not None and kind != "any":
        out = {"type": BFCL_TYPES.get(kind, kind), **out}
    if "properties" in schema:
        out["properties"] = {name: json_schema(sub) for name, sub in schema["properties"].items()}
    if "items" in schema:
        out["items"] = json_schema(schema["items"])
    return out


def tool_spec(doc: dict[str, Any]) -> ToolSpec:
    """The spec the model is shown for one BFCL function doc; unknown arguments are refused."""
    parameters = {**json_schema(doc["parameters"]), "additionalProperties": False}
    return ToolSpec(doc["name"], doc["description"], parameters)


def accepted_arguments(spec: ToolSpec) -> dict[str, Any]:
    """The schema a call's arguments are checked against: `spec`'s argument names and
    required ones, any values (see the module docstring).

    >>> accepted_arguments(ToolSpec("f", "", {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}))
    {'type': 'object', 'properties': {'x': {}}, 'required': ['x'], 'additionalProperties': False}
    """
    names = spec.parameters.get("properties", {})
    return {"type": "object", "properties": {name: {} for name in names},
            "required": list(spec.parameters.get("required", [])), "additionalProperties": False}
