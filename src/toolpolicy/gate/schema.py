"""Argument checks against a tool's JSON schema, with a fast path for simple schemas.

`jsonschema` takes about 10 us per call even for `{"path": string}`, a fifth of the
gate's latency budget (p99 <= 50 us at 100 rules). The schemas `@tool` derives use only
type, properties, required, additionalProperties, items and string enums, and for those
`compile_simple` builds a plain Python check (about 1 us). Any other keyword sends the
whole schema to `jsonschema`, and the error message always comes from `jsonschema`, so
both paths describe a failure the same way. A hypothesis test checks that the fast path
and `jsonschema` agree.

`format` is asserted, not just annotated, for the formats in FORMATS: a tool that declares
`{"type": "string", "format": "date"}` gets only strict YYYY-MM-DD past the gate, so a
condition comparing dates and the tool using the date read the same value. Python's
`date.fromisoformat` also takes `20250501` and `2025-W01-1`; a policy comparing the text
`'20250501' <= '2025-06-01'` would be fooled by them. A tool with a date argument should
parse it with `plain_date` too, so that the gate and the tool cannot disagree. Other
formats stay annotations, as JSON Schema has them by default.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import jsonschema

Check = Callable[[Any], bool]

# Keywords that do not constrain a value (annotations), and the ones compile_simple handles.
_ANNOTATIONS = frozenset(
    {"description", "title", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
)
_HANDLED = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum", "format"}) | _ANNOTATIONS

# ASCII digits only: `\d` would take Arabic-Indic or fullwidth digits too.
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DATE_TIME = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt](?P<h>[0-9]{2}):(?P<m>[0-9]{2}):(?P<s>[0-9]{2})(?:\.[0-9]{1,9})?"
    r"(?:[Zz]|[+-](?P<oh>[0-9]{2}):(?P<om>[0-9]{2}))"
)


def plain_date(text: Any) -> dt.date | None:
    """The date `text` names if it is exactly YYYY-MM-DD (RFC 3339 full-date, ASCII digits,
    a real calendar day), else None. The one parser for `format: date`, for gate and tools.

    >>> plain_date("2025-06-01"), plain_date("20250601"), plain_date("2025-W22-7"), plain_date("2025-02-30")
    (datetime.date(2025, 6, 1), None, None, None)
    """
    if not isinstance(text, str) or _DATE.fullmatch(text) is None:
        return None
    try:
        return dt.date.fromisoformat(text)
    except ValueError:  # 2025-02-30
        return None


def _is_date_time(text: str) -> bool:
    """RFC 3339 date-time: a plain date, 'T', hh:mm:ss, optional fraction, 'Z' or an offset."""
    match = _DATE_TIME.fullmatch(text)
    if match is None or plain_date(match["date"]) is None:
        return False
    hour, minute, second = int(match["h"]), int(match["m"]), int(match["s"])
    offset_ok = match["oh"] is None or (int(match["oh"]) < 24 and int(match["om"]) < 60)
    return hour < 24 and minute < 60 and second <= 60 and offset_ok  # 60: a leap second


FORMATS: dict[str, Callable[[str], bool]] = {
    "date": lambda text: plain_date(text) is not None,
    "date-time": _is_date_time,
}
"""The `format` values the gate asserts on strings (values of other types pass, as in JSON Schema)."""


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    for name, test in FORMATS.items():
        checker.checks(name)(lambda value, test=test: not isinstance(value, str) or test(value))
    return checker


_FORMAT_CHECKER = _format_checker()


def _is_integer(value: Any) -> bool:
    # jsonschema counts 3.0 as an integer (JSON has one number type), but never a bool
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


_TYPES: dict[str, Check] = {
    "string": lambda v: isinstance(v, str),
    "integer": _is_integer,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


class ArgumentSchema:
    """One tool's parameters schema: `problem(args)` is None when the arguments conform,
    otherwise what is wrong with jsonschema's best match, said without the value (see
    `describe_error`)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)  # SchemaError for a schema that is not one
        self._validator = validator_class(schema, format_checker=_FORMAT_CHECKER)
        self._fast = compile_simple(schema)
        self._fields = declared_fields(schema)

    @property
    def fast(self) -> bool:
        return self._fast is not None

    def problem(self, arguments: Any) -> str | None:
        if self._fast is not None and self._fast(arguments):
            return None
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        if error is None:
            return None
        return describe_error(error, self._fields)


def compile_simple(schema: Any) -> Check | None:
    """A Python check equivalent to `schema`, or None when it uses anything beyond
    type, properties, required, additionalProperties, items, string-only enums and format."""
    if schema is True or schema == {}:
        return lambda value: True
    if not isinstance(schema, dict) or not set(schema) <= _HANDLED:
        return None
    checks: list[Check] = []

    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list) or not kinds or any(k not in _TYPES for k in kinds):
            return None
        tests = [_TYPES[k] for k in kinds]
        checks.append(tests[0] if len(tests) == 1 else (lambda v, tests=tests: any(t(v) for t in tests)))

    if "format" in schema:
        test = FORMATS.get(schema["format"])
        if test is not None:  # any other format is an annotation
            checks.append(lambda v, test=test: not isinstance(v, str) or test(v))

    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return None  # jsonschema's equality for mixed types (1 vs 1.0 vs True) is not worth copying
        allowed = frozenset(values)
        checks.append(lambda v: isinstance(v, str) and v in allowed)

    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list):
        return None
    if properties or required or extra is not True:
        children = {name: compile_simple(sub) for name, sub in properties.items()}
        extra_check = None if extra is False else compile_simple(extra)
        if any(check is None for check in children.values()) or (extra is not False and extra_check is None):
            return None
        checks.append(_object_check(children, tuple(required), extra_check))

    if "items" in schema:
        item_check = compile_simple(schema["items"])
        if item_check is None:
            return None
        checks.append(lambda v: not isinstance(v, list) or all(item_check(x) for x in v))

    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:  # the usual object schema: its type, then its properties (no generator per call)
        first, second = checks
        return lambda value: first(value) and second(value)
    return lambda value: all(check(value) for check in checks)


def _object_check(children: dict[str, Check], required: tuple[str, ...], extra: Check | None) -> Check:
    """Keywords for objects apply only to objects (any other value passes them)."""

    def check(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        for name in required:
            if name not in value:
                return False
        for name, item in value.items():
            child = children.get(name)
            if child is not None:
                if not child(item):
                    return False
            elif extra is None or not extra(item):
                return False
        return True

    return check


def declared_fields(schema: Any) -> frozenset[str]:
    """Every property name `schema` declares, at any depth: the field names an error may show."""
    names: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            properties = node.get("properties")
            if isinstance(properties, dict):
                names.update(key for key in properties if isinstance(key, str))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return frozenset(names)


def describe_error(error: jsonschema.ValidationError, fields: frozenset[str]) -> str:
    """What is wrong, naming the field and the schema's rule, never the value: jsonschema's own
    message quotes the value (`'X1234567' does not match '^[0-9]+$'`), and this text becomes a
    denial's reason, which the audit log keeps and the model reads. A path part is shown when it
    is an array index or a field the schema declares; a key the caller made up is not.

    >>> schema = {"type": "object", "properties": {"passport": {"type": "string", "pattern": "^[0-9]+$"}}}
    >>> describe_error(next(jsonschema.Draft202012Validator(schema).iter_errors({"passport": "X1234567"})), frozenset({"passport"}))
    "passport: does not match the pattern '^[0-9]+$'"
    """
    where = "/".join(
        str(part) if isinstance(part, int) or part in fields else "(a field the schema does not declare)"
        for part in error.absolute_path
    )
    what = _rule_broken(error, fields)
    return f"{where}: {what}" if where else what


def _rule_broken(error: jsonschema.ValidationError, fields: frozenset[str]) -> str:
    keyword, expected = error.validator, error.validator_value
    if keyword == "required":
        present = error.instance if isinstance(error.instance, dict) else {}
        missing = [name for name in expected if name not in present] if isinstance(expected, list) else []
        return f"{missing[0]!r} is a required property" if missing else "a required property is missing"
    if keyword == "additionalProperties":
        extra = [key for key in error.instance if key not in fields] if isinstance(error.instance, dict) else []
        return f"has {len(extra) or 'a'} field{'s' if len(extra) > 1 else ''} the schema does not allow"
    if keyword == "type":
        kinds = expected if isinstance(expected, list) else [expected]
        return f"must be of type {' or '.join(map(str, kinds))}, not {_json_type(error.instance)}"
    words = {
        "enum": "must be one of the values the schema lists",
        "const": "must be the value the schema gives",
        "pattern": f"does not match the pattern {_shown(expected)}",
        "format": f"is not a {_shown(expected)}",
        "minLength": f"is shorter than {expected} characters",
        "maxLength": f"is longer than {expected} characters",
        "minimum": f"is less than {expected}",
        "maximum": f"is more than {expected}",
        "exclusiveMinimum": f"is not more than {expected}",
        "exclusiveMaximum": f"is not less than {expected}",
        "multipleOf": f"is not a multiple of {expected}",
        "minItems": f"has fewer than {expected} items",
        "maxItems": f"has more than {expected} items",
        "uniqueItems": "has repeated items",
        "minProperties": f"has fewer than {expected} fields",
        "maxProperties": f"has more than {expected} fields",
        "propertyNames": "has a field name the schema does not allow",
        "dependentRequired": "lacks a field that another field requires",
        "dependencies": "lacks a field that another field requires",
    }
    return words.get(str(keyword), f"breaks the schema's {_shown(keyword)} rule")


def _shown(value: Any) -> str:
    """A value from the schema (never from the arguments), quoted and cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_type(value: Any) -> str:
    for name in ("boolean", "integer", "number", "string", "null", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__
