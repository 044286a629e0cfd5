"""The fast argument check agrees with jsonschema on the schemas it accepts, and leaves
every other schema to jsonschema."""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st

from toolpolicy.gate.schema import ArgumentSchema, compile_simple, plain_date

TYPES = ["string", "integer", "number", "boolean", "null", "array", "object"]

LEAF_SCHEMAS = st.one_of(
    st.builds(lambda t: {"type": t}, st.sampled_from(TYPES)),
    st.builds(lambda ts: {"type": ts}, st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True)),
    st.builds(
        lambda vs: {"type": "string", "enum": vs}, st.lists(st.sampled_from(["a", "b", "1"]), min_size=1, unique=True)
    ),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.sampled_from(["a", "b"]), min_size=1, unique=True)),
    st.just({}),
)
SCHEMAS = st.recursive(
    LEAF_SCHEMAS,
    lambda inner: st.one_of(
        st.builds(
            lambda props, req, extra: {
                "type": "object",
                "properties": props,
                "required": sorted(set(req) & set(props)),
                **extra,
            },
            st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
            st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
            st.sampled_from([{}, {"additionalProperties": False}, {"additionalProperties": True}])
            | inner.map(lambda s: {"additionalProperties": s}),
        ),
        st.builds(lambda items: {"type": "array", "items": items}, inner),
        st.builds(
            lambda props: {"properties": props, "description": "no type"},
            st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2),
        ),
    ),
    max_leaves=6,
)
VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 3),
        st.floats(allow_nan=False, width=16),
        st.sampled_from(["a", "b", "1", ""]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(SCHEMAS, VALUES)
def test_fast_check_agrees_with_jsonschema(schema: dict[str, Any], value: Any) -> None:
    check = compile_simple(schema)
    assert check is not None, schema
    expected = jsonschema.validators.validator_for(schema)(schema).is_valid(value)
    assert check(value) == expected, (schema, value)
    assert (ArgumentSchema(schema).problem(value) is None) == expected


def test_other_keywords_fall_back_to_jsonschema() -> None:
    for schema in (
        {"type": "string", "maxLength": 3},
        {"anyOf": [{"type": "string"}]},
        {"enum": [1, True]},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "string"}}},
    ):
        assert compile_simple(schema) is None
        assert not ArgumentSchema(schema).fast
    limited = ArgumentSchema({"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}})
    assert limited.problem({"a": "abc"}) is None
    assert limited.problem({"a": "abcd"}) == "a: is longer than 3 characters"  # the rule, never the value


DATE_SPELLINGS = {
    "2025-06-01": True,
    "2024-02-29": True,
    "20250601": False,  # basic form: date.fromisoformat takes it
    "2025-W22-7": False,  # week form: so does this
    "2025-152": False,  # ordinal form
    "2025-06-01T00:00:00Z": False,
    "2025-06-01 ": False,
    " 2025-06-01": False,
    "2025-06-01\n": False,
    "\uff12\uff10\uff12\uff15-06-01": False,  # fullwidth digits
    "\u0662\u0660\u0662\u0665-06-01": False,  # Arabic-Indic digits match Python's \d
    "2025-02-29": False,
    "2025-13-01": False,
    "": False,
}


def test_format_date_is_asserted_strictly_on_both_paths() -> None:
    """A tool declaring `format: date` gets only YYYY-MM-DD, whichever path checks it; a
    value of another type is the `type` keyword's business, as in JSON Schema."""
    fast = ArgumentSchema({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}})
    slow = ArgumentSchema({"type": "object", "properties": {"d": {"type": "string", "format": "date", "maxLength": 99}}})
    assert fast.fast and not slow.fast
    for text, valid in DATE_SPELLINGS.items():
        assert (fast.problem({"d": text}) is None) == valid, text
        assert (slow.problem({"d": text}) is None) == valid, text
        assert (plain_date(text) is not None) == valid, text
    assert "is not a 'date'" in (fast.problem({"d": "20250601"}) or "")
    assert compile_simple({"format": "date"})(5) and compile_simple({"format": "uri"})("not a uri")


def test_format_date_time_is_rfc_3339() -> None:
    schema = ArgumentSchema({"type": "string", "format": "date-time"})
    for text in ("2025-06-01T12:00:00Z", "2025-06-01t12:00:00.5+02:00", "2016-12-31T23:59:60Z"):
        assert schema.problem(text) is None, text
    for text in ("2025-06-01T12:00:00", "2025-06-01 12:00:00Z", "20250601T120000Z", "2025-06-01T24:00:00Z"):
        assert schema.problem(text) is not None, text
