"""The calculator tool: exact arithmetic over an AST walk, never `eval`.

Numbers are kept as Fractions, so 10**30/7*7 is exactly 10**30 and 0.1+0.2 is 0.3;
only a fractional power (2**0.5) goes through a float. Every way to make Python spin or
allocate without bound is cut off before it runs: the expression length, parenthesis
depth, exponent size (9**9**9 stops at its outer power) and the size of every
intermediate number. Violations raise ToolError, which ToolSet reports as a tool_error
(the model's fault): every way `evaluate` refuses an expression is the expression's.
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from collections.abc import Callable
from decimal import Context, Decimal
from fractions import Fraction

from toolpolicy.tools.decorator import ToolError, tool

MAX_EXPRESSION_CHARS = 200
MAX_PARENTHESIS_DEPTH = 20
MAX_EXPONENT = 100
MAX_MAGNITUDE_DIGITS = 100  # every numerator and denominator stays <= 10**100
SIGNIFICANT_DIGITS = 10
ALLOWED = "numbers, + - * / // % ** and parentheses"

_LIMIT = 10**MAX_MAGNITUDE_DIGITS
_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction | int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Arithmetic with numbers, + - * / // % ** and parentheses, e.g. "12*(3+4)".
    """
    return format_number(evaluate(expression))


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression`; ToolError with a readable reason for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    _check_parenthesis_depth(expression)
    try:
        with warnings.catch_warnings():  # e.g. "invalid decimal literal" for 1if 1 else 2: not for stderr
            warnings.simplefilter("ignore")
            tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as error:  # ValueError: null bytes in the source
        raise ToolError(f"not a valid arithmetic expression; use only {ALLOWED}") from error
    return _walk(tree.body)


def format_number(value: Fraction) -> str:
    """An integral value as an int ("2" for 6/3); otherwise rounded to 10 significant digits.

    >>> format_number(Fraction(1, 3)), format_number(Fraction(-7, 2)), format_number(Fraction(1, 3 * 10**12))
    ('0.3333333333', '-3.5', '3.333333333E-13')
    """
    if value.denominator == 1:
        return str(value.numerator)
    rounded = Context(prec=SIGNIFICANT_DIGITS).divide(Decimal(value.numerator), Decimal(value.denominator)).normalize()
    # Positional notation unless that would print a run of zeros (Decimal's own rule, as str() does).
    return format(rounded, "f") if -7 <= rounded.adjusted() < 21 else str(rounded)


def _check_parenthesis_depth(expression: str) -> None:
    depth = 0
    for char in expression:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth > MAX_PARENTHESIS_DEPTH:
            raise ToolError(f"parentheses are nested more than {MAX_PARENTHESIS_DEPTH} deep")


def _walk(node: ast.expr) -> Fraction:
    """Evaluate an allowed node. Recursion depth is bounded by the 200-character limit."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(_literal(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = _walk(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and (isinstance(node.op, ast.Pow) or type(node.op) in _BINARY):
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ToolError("division by zero")
        return _checked(Fraction(_BINARY[type(node.op)](left, right)))
    raise ToolError(f"{ast.unparse(node)[:40]!r} is not allowed; use only {ALLOWED}")


def _literal(value: int | float) -> Fraction:
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("number is too large")
    # repr gives the shortest decimal that reads back as this float, so 0.1 is exactly 1/10.
    return Fraction(value) if isinstance(value, int) else Fraction(repr(value))


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """base ** exponent, refused before computing when the exponent or the result would be too big."""
    if abs(exponent) > MAX_EXPONENT:
        raise ToolError(f"exponent {format_number(exponent)} is too large; the limit is {MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise ToolError("division by zero")
    if exponent.denominator == 1:
        size = math.log10(max(abs(base.numerator), base.denominator, 1))
        if size * abs(exponent.numerator) > MAX_MAGNITUDE_DIGITS + 1e-9:
            raise ToolError(f"result of ** is too large; numbers are limited to 10**{MAX_MAGNITUDE_DIGITS}")
        return base**exponent.numerator
    if base < 0:
        raise ToolError("a negative number to a fractional power is not a real number")
    try:
        return Fraction(float(base) ** float(exponent))
    except OverflowError:
        raise ToolError(f"result of ** is too large; numbers are limited to 10**{MAX_MAGNITUDE_DIGITS}") from None


def _checked(value: Fraction) -> Fraction:
    if abs(value.numerator) > _LIMIT or value.denominator > _LIMIT:
        raise ToolError(f"an intermediate result is too large or too precise; numbers are limited to 10**{MAX_MAGNITUDE_DIGITS}")
    return value
