"""@tool schema derivation and its loud failures, ToolSet error handling (whose fault), and the calculator's limits."""

from __future__ import annotations

import doctest
from typing import Literal, Optional

import pytest
from pydantic import ValidationError

import toolpolicy.tools.toolset
from toolpolicy.tools import Tool, ToolError, ToolSet, calculator, tool
from toolpolicy.types import ToolCall, ToolResult, ToolSpec


@tool
def search(query: str, limit: int = 5, scale: float = 1.0, exact: bool = False) -> list[str]:
    """Search the notes for a phrase.

    Matching is case-insensitive.

    Args:
        query: Words to look for.
        limit (int): At most this many
            results are returned.
        scale: Score multiplier.
        exact: Match the whole phrase only.

    Returns:
        The matching lines.
    """
    return [f"{query}:{limit}:{scale}:{exact}"]


@tool(name="tag_items", description="Tag items with a colour.")
def tag(items: list[str], colour: Literal["red", "green"], weights: dict[str, float], note: str | None = None,
        level: Optional[int] = None, codes: list[int] | None = None) -> dict[str, str]:  # fmt: skip
    """Ignored: the description above wins.

    Args:
        items: Items to tag.
        colour: Tag colour.
        weights: Weight per item.
        note: Free text.
        level: Priority level.
        codes: Numeric codes.
    """
    return {item: colour for item in items}


def test_schema_from_hints_and_docstring() -> None:
    assert isinstance(search, Tool)
    assert search.spec == ToolSpec(
        "search",
        "Search the notes for a phrase.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words to look for."},
                "limit": {"type": "integer", "description": "At most this many results are returned."},
                "scale": {"type": "number", "description": "Score multiplier."},
                "exact": {"type": "boolean", "description": "Match the whole phrase only."},
            },
            "required": ["query"],
        },
    )


def test_schema_for_containers_literals_and_optionals() -> None:
    assert tag.name == "tag_items"
    assert tag.spec.description == "Tag items with a colour."
    assert tag.spec.parameters == {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"type": "string"}, "description": "Items to tag."},
            "colour": {"type": "string", "enum": ["red", "green"], "description": "Tag colour."},
            "weights": {"type": "object", "additionalProperties": {"type": "number"}, "description": "Weight per item."},
            "note": {"type": ["string", "null"], "description": "Free text."},
            "level": {"type": ["integer", "null"], "description": "Priority level."},
            "codes": {"type": ["array", "null"], "items": {"type": "integer"}, "description": "Numeric codes."},
        },
        "required": ["items", "colour", "weights"],
    }


def test_tool_calls_the_function_directly() -> None:
    assert search(query="a") == ["a:5:1.0:False"]
    assert search.fn is not None and tag(items=["x"], colour="red", weights={}) == {"x": "red"}


def test_validation_is_strict_but_accepts_int_for_float() -> None:
    assert search.validate({"query": "a", "scale": 2}) == {"query": "a", "scale": 2}
    for bad in ({"query": "a", "limit": "12"}, {"query": "a", "limit": True}, {"query": 1}, {"query": "a", "extra": 1}):
        with pytest.raises(ValidationError):
            search.validate(bad)


def test_decorator_fails_loudly() -> None:
    def no_hint(x) -> str:  # type: ignore[no-untyped-def]
        """Doc.

        Args:
            x: An x.
        """
        return ""

    def no_entry(x: int, y: int) -> str:
        """Doc.

        Args:
            x: An x.
        """
        return ""

    def star_args(*values: int) -> str:
        """Doc.

        Args:
            values: Values.
        """
        return ""

    def star_kwargs(**options: int) -> str:
        """Doc.

        Args:
            options: Options.
        """
        return ""

    def no_doc(x: int) -> str:
        return ""

    def stale_doc(x: int) -> str:
        """Doc.

        Args:
            x: An x.
            y: Gone.
        """
        return ""

    def bad_type(x: set[int]) -> str:
        """Doc.

        Args:
            x: An x.
        """
        return ""

    def int_keys(x: dict[int, str]) -> str:
        """Doc.

        Args:
            x: An x.
        """
        return ""

    cases = [
        (no_hint, "'x' has no type hint"),
        (no_entry, "'y' is not described"),
        (star_args, "'values': a tool takes named arguments only"),
        (star_kwargs, "'options': a tool takes named arguments only"),
        (no_doc, "needs a docstring"),
        (stale_doc, "describes y, which the function does not take"),
        (bad_type, "unsupported type"),
        (int_keys, "dict keys must be str"),
    ]
    for fn, message in cases:
        with pytest.raises(TypeError, match=message) as raised:
            tool(fn)
        assert fn.__name__ in str(raised.value)
    with pytest.raises(TypeError, match="tool name"):
        tool(name="has space")(no_entry)


# --- ToolSet ----------------------------------------------------------------------------


@tool
def explode(reason: str) -> str:
    """Always refuse the call, the model's fault.

    Args:
        reason: What to say.
    """
    raise ToolError(reason)


@tool
def echo(text: str, times: int = 1) -> str:
    """Repeat text.

    Args:
        text: Text to repeat.
        times: How many times.
    """
    return text * times


@tool
def stats(values: list[float]) -> dict[str, float]:
    """Summarise numbers.

    Args:
        values: The numbers.
    """
    return {"total": sum(values), "count": len(values)}


@tool
def count(text: str) -> int:
    """Count characters.

    Args:
        text: Text.
    """
    return len(text)


TOOLS = ToolSet([calculator, echo, explode, stats, count])


def test_toolset_lookup() -> None:
    assert TOOLS.names == ("calculator", "echo", "explode", "stats", "count")
    assert [spec.name for spec in TOOLS.specs()] == list(TOOLS.names)
    assert "echo" in TOOLS and "nope" not in TOOLS
    with pytest.raises(ValueError, match="two tools"):
        ToolSet([echo, echo])


def test_toolset_success_and_output_formats() -> None:
    assert TOOLS.call(ToolCall("echo", {"text": "ab", "times": 2})) == ToolResult("abab")
    assert TOOLS.call(ToolCall("stats", {"values": [1, 2.5]})) == ToolResult('{"total": 3.5, "count": 2}')
    assert TOOLS.call(ToolCall("count", {"text": "abc"})) == ToolResult("3")


def test_unknown_tool() -> None:
    result = TOOLS.call(ToolCall("calc", {"expression": "1"}))
    assert result == ToolResult("Unknown tool 'calc'. Available tools: calculator, echo, explode, stats, count.", "unknown_tool")


def test_invalid_arguments_name_the_argument() -> None:
    result = TOOLS.call(ToolCall("echo", {"text": "a", "times": "2"}))
    assert result.error == "invalid_arguments"
    assert result.content.startswith("Invalid arguments for echo: 'times' should be a valid integer (got \"2\").")
    missing = ToolSet([echo]).call(ToolCall("echo", {"txt": "a"}))
    assert missing == ToolResult(
        "Invalid arguments for echo: missing required argument 'text'; unknown argument 'txt'. "
        "Expected: echo(text: string, times?: integer).",
        "invalid_arguments",
    )


def test_tool_error() -> None:
    assert TOOLS.call(ToolCall("explode", {"reason": "boom"})) == ToolResult("Error: boom", "tool_error")


RATES = {"USD": 1.0}


@tool
def convert(amount: float, currency: str) -> float:
    """Convert an amount to US dollars.

    Args:
        amount: The amount.
        currency: Its currency code.
    """
    if len(currency) != 3:
        raise ToolError(f"{currency!r} is not a currency code like EUR")
    return amount * RATES[currency]  # bug: a valid code missing from the table raises KeyError


@tool
def broken(kind: Literal["attribute", "value", "unprintable"]) -> str:
    """Fail the way a bug in our own code does.

    Args:
        kind: Which bug.
    """
    if kind == "attribute":
        return None.upper()  # type: ignore[attr-defined]
    if kind == "value":
        return str(int("twelve"))  # ValueError from inside the tool: not the model's by default

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    raise Unprintable


def test_a_bug_inside_a_tool_is_an_infra_error_naming_the_tool_and_exception() -> None:
    tools = ToolSet([convert, broken])
    assert tools.call(ToolCall("convert", {"amount": 2, "currency": "USD"})) == ToolResult("2.0")
    fix = "(raise toolpolicy.tools.ToolError to show the model the message)"
    assert tools.call(ToolCall("convert", {"amount": 2, "currency": "EUR"})) == ToolResult(
        f"tool 'convert' raised KeyError: 'EUR' {fix}", "exception"
    )
    attribute = tools.call(ToolCall("broken", {"kind": "attribute"}))
    assert attribute.error == "exception" and attribute.content.startswith("tool 'broken' raised AttributeError: ")
    value = tools.call(ToolCall("broken", {"kind": "value"}))
    assert value.error == "exception" and value.content.startswith("tool 'broken' raised ValueError: ")
    assert value.content.endswith(fix)
    unprintable = tools.call(ToolCall("broken", {"kind": "unprintable"}))
    assert unprintable == ToolResult(f"tool 'broken' raised Unprintable: <unprintable error> {fix}", "exception")
    assert doctest.testmod(toolpolicy.tools.toolset).failed == 0


def test_a_deliberate_tool_error_is_the_models_with_its_message() -> None:
    result = ToolSet([convert]).call(ToolCall("convert", {"amount": 2, "currency": "euro"}))
    assert result == ToolResult("Error: 'euro' is not a currency code like EUR", "tool_error")

    class Refused(ToolError):
        """A tool's own kind of refusal is still the model's."""

    @tool
    def strict(text: str) -> str:
        """Refuse everything.

        Args:
            text: Anything.
        """
        raise Refused(f"not {text}")

    assert ToolSet([strict]).call(ToolCall("strict", {"text": "this"})) == ToolResult("Error: not this", "tool_error")


def test_output_is_truncated_and_says_so() -> None:
    small = ToolSet([echo, explode], max_output_chars=50)
    assert small.call(ToolCall("echo", {"text": "x", "times": 50})) == ToolResult("x" * 50)
    assert small.call(ToolCall("echo", {"text": "x", "times": 80})) == ToolResult("x" * 50 + "... [truncated 30 chars]")
    # Error text is bounded the same way: an exception message can be as long as any output.
    failed = small.call(ToolCall("explode", {"reason": "y" * 100}))  # "Error: " + 100 chars = 107, 57 over
    assert failed == ToolResult("Error: " + "y" * 43 + "... [truncated 57 chars]", "tool_error")


# --- calculator -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("12*(3+4)", "84"),
        ("374 * 375 + 23", "140273"),
        ("6/3", "2"),
        ("1/3", "0.3333333333"),
        ("2/3", "0.6666666667"),
        ("-7/2", "-3.5"),
        ("0.1 + 0.2", "0.3"),
        ("10**30 / 7 * 7", "1" + "0" * 30),
        ("2**-2", "0.25"),
        ("2**0.5", "1.414213562"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("+-+3", "-3"),
        (" (1 + 2) ", "3"),
        ("10**100", "1" + "0" * 100),
        ("1/3 * 10**-12", "3.333333333E-13"),
    ],
)
def test_calculator_values(expression: str, expected: str) -> None:
    assert calculator(expression=expression) == expected


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("9**9**9", "exponent 387420489 is too large"),
        ("2**101", "exponent 101 is too large"),
        ("99999**99", "result of \\*\\* is too large"),
        ("10**100 * 10", "too large"),
        ("1" * 101, "too large"),
        ("1e999", "too large"),
        ("1/0", "division by zero"),
        ("5 // 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** (1/3)", "not a real number"),
        ("(" * 21 + "1" + ")" * 21, "nested more than 20 deep"),
        ("1+" * 100 + "1", "201 characters"),
        ("__import__('os')", "not allowed"),
        ("x", "not allowed"),
        ("abs(1)", "not allowed"),
        ("lambda: 1", "not allowed"),
        ("(1).real", "not allowed"),
        ("True + 1", "not allowed"),
        ("1j", "not allowed"),
        ("'a' * 3", "not allowed"),
        ("[1, 2]", "not allowed"),
        ("1 < 2", "not allowed"),
        ("", "not a valid arithmetic expression"),
        ("1 +", "not a valid arithmetic expression"),
        ("1\x00", "not a valid arithmetic expression"),
    ],
)
def test_calculator_limits_become_tool_errors(expression: str, reason: str) -> None:
    with pytest.raises(ToolError, match=reason):
        calculator(expression=expression)
    # bad input is the model's fault (tool_error), never an infra error that would drop the episode
    result = ToolSet([calculator]).call(ToolCall("calculator", {"expression": expression}))
    assert result.error == "tool_error" and result.content.startswith("Error: ")


def test_calculator_spec() -> None:
    assert calculator.spec.description == "Evaluate an arithmetic expression exactly."
    assert list(calculator.spec.parameters["properties"]) == ["expression"]
    assert calculator.spec.parameters["required"] == ["expression"]
