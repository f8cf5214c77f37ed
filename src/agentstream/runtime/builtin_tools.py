"""The built-in tools every agent may be given: a safe calculator and a clock.

The calculator walks the parsed syntax tree itself (never eval) with exact rational arithmetic
and hard limits on input length, exponents and number size, so no input can hang or exhaust it.
"""

from __future__ import annotations

import ast
import math
from datetime import datetime
from fractions import Fraction
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field

from agentstream.runtime.tools import Tool

__all__ = ["BUILTIN_TOOLS", "calculator", "current_time"]

MAX_EXPRESSION_LENGTH = 200
MAX_EXPONENT = 1000
# Largest exact intermediate value, in bits (~1200 decimal digits).
MAX_BITS = 4000

_SYNONYMS = {"×": "*", "÷": "/", "^": "**", "−": "-"}

_Number = Fraction | float


def calculator(
    expression: Annotated[
        str, Field(description="The arithmetic expression, e.g. '(2 + 3) ** 2 / 7'.")
    ],
) -> float | int:
    """Evaluate an arithmetic expression exactly, e.g. '17 * 23' or '(2 + 3) ** 2 / 7'.

    Supports numbers, + - * / // % ** and parentheses; the multiplication and division signs
    and ^ (for **) are accepted too.
    """
    # Arithmetic is exact (fractions): 0.1 + 0.2 == 0.3 and 6 / 3 == 2. The result is an int
    # when it is integral and the expression has no decimal literals (17 * 23 -> 391,
    # 6 / 3 -> 2, 7 / 2 -> 3.5, 1.5 * 2 -> 3.0), otherwise a float. Non-integer powers
    # (2 ** 0.5) are computed in floating point.
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise ValueError(
            f"Expression too long: {len(expression)} characters (max {MAX_EXPRESSION_LENGTH})"
        )
    text = expression
    for symbol, replacement in _SYNONYMS.items():
        text = text.replace(symbol, replacement)
    text = text.strip()
    if not text:
        raise ValueError("Empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ValueError(f"Invalid expression: {expression!r}") from exc

    has_decimals = any(
        isinstance(node, ast.Constant) and isinstance(node.value, float) for node in ast.walk(tree)
    )
    try:
        value = _evaluate(tree.body)
        if isinstance(value, Fraction):
            if value.denominator == 1 and not has_decimals:
                return int(value)
            value = float(value)
    except RecursionError as exc:
        raise ValueError("Expression nested too deeply") from exc
    except OverflowError as exc:  # Python's own messages ("int too large to convert...") confuse
        raise OverflowError("Result too large") from exc
    if not math.isfinite(value):
        raise OverflowError("Result too large")
    return value


def current_time(
    timezone: Annotated[
        str, Field(description="IANA time zone name, e.g. 'Europe/Paris' or 'UTC'.")
    ] = "UTC",
) -> str:
    """The current date and time in an IANA time zone, ISO 8601."""
    name = timezone.strip()
    if name.upper() in {"UTC", "Z", "GMT"}:
        name = "UTC"
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"Unknown time zone: {timezone!r}") from exc
    return datetime.now(zone).isoformat(timespec="seconds")


BUILTIN_TOOLS: tuple[Tool, ...] = (
    Tool.from_function(calculator, name="calculator"),
    Tool.from_function(current_time, name="current_time"),
)


# --- the calculator's evaluator --------------------------------------------------------------


def _unsupported(node: ast.AST) -> ValueError:
    try:
        shown = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every parsed node
        shown = type(node).__name__
    return ValueError(
        f"Unsupported expression: {shown!r} "
        "(only numbers, + - * / // % **, unary + - and parentheses are allowed)"
    )


def _evaluate(node: ast.expr) -> _Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _unsupported(node)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise OverflowError(f"Number too large: {ast.unparse(node)}")
            # repr gives the shortest decimal for the float, i.e. what was typed: 0.1 -> 1/10.
            return Fraction(repr(value))
        return Fraction(value)
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand)
        if isinstance(node.op, ast.USub):
            return -operand
        if isinstance(node.op, ast.UAdd):
            return operand
        raise _unsupported(node)
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left)
        right = _evaluate(node.right)
        return _checked(_binary(node, left, right))
    raise _unsupported(node)


def _binary(node: ast.BinOp, left: _Number, right: _Number) -> _Number | int:
    op = node.op
    if isinstance(op, ast.Add):
        return left + right
    if isinstance(op, ast.Sub):
        return left - right
    if isinstance(op, ast.Mult):
        return left * right
    if isinstance(op, ast.Div | ast.FloorDiv | ast.Mod):
        if right == 0:
            raise ZeroDivisionError("Division by zero")
        if isinstance(op, ast.Div):
            return left / right
        if isinstance(op, ast.FloorDiv):
            return left // right
        return left % right
    if isinstance(op, ast.Pow):
        return _power(left, right)
    raise _unsupported(node)


def _power(base: _Number, exponent: _Number) -> _Number:
    if not -MAX_EXPONENT <= exponent <= MAX_EXPONENT:
        raise ValueError(f"Exponent too large: |exponent| must be at most {MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise ZeroDivisionError("Zero cannot be raised to a negative power")
    if isinstance(base, Fraction) and isinstance(exponent, Fraction) and exponent.denominator == 1:
        power = int(exponent)
        if base in (0, 1, -1):
            return base**power
        size = max(base.numerator.bit_length(), base.denominator.bit_length()) * abs(power)
        if size <= MAX_BITS:
            return base**power
        if base.denominator == 1 and power > 0:
            raise OverflowError("Result too large")
        # A non-integer result too big to keep exactly: continue in floating point.
        return _float_power(float(base), float(power))
    return _float_power(float(base), float(exponent))


def _float_power(base: float, exponent: float) -> float:
    result: float | complex = base**exponent  # OverflowError if out of range
    if isinstance(result, complex):
        raise ValueError("Result is not a real number (fractional power of a negative number)")
    return result


def _checked(value: _Number | int) -> _Number:
    """Keep intermediate values bounded: exact values in MAX_BITS, floats finite."""
    if isinstance(value, int):  # Fraction // Fraction is an int
        value = Fraction(value)
    if isinstance(value, Fraction):
        if max(value.numerator.bit_length(), value.denominator.bit_length()) <= MAX_BITS:
            return value
        if value.denominator == 1:
            raise OverflowError("Result too large")
        value = float(value)
    if not math.isfinite(value):
        raise OverflowError("Result too large")
    return value
