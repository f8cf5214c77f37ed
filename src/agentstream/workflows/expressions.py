"""Sandboxed expressions for condition and function blocks: a small, safe subset of Python.

The text is parsed with ``ast`` and every node checked against a whitelist before anything
runs; evaluation then walks the tree here, never through ``eval``. So there is no attribute
access at all (``agent1.content`` reads the key ``content`` of the block's output), calls go
only to the functions in ``FUNCTIONS``, and the only names are upstream block ids. Whatever
could make an expression slow or huge (``**``, ``<<``, comprehensions) is refused, and
what ``+`` and ``*`` build is capped in size.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agentstream.workflows.errors import BlockFailed
from agentstream.workflows.references import Reference

__all__ = ["FUNCTIONS", "Expression", "ExpressionError", "parse_expression"]

MAX_LENGTH = 4_000
"""Longest expression text accepted."""
MAX_SIZE = 1_000_000
"""Longest string or list ``+`` and ``*`` may build."""

FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    "abs": abs,
    "bool": bool,
    "float": float,
    "int": int,
    "len": len,
    "lower": str.lower,
    "max": max,
    "min": min,
    "round": round,
    "sorted": sorted,
    "str": str,
    "strip": str.strip,
    "sum": sum,
    "upper": str.upper,
}
"""The only functions an expression may call."""

_BINARY: Mapping[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: Mapping[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_COMPARE: Mapping[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_PLAIN = (
    ast.Expression,
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.Attribute,
    ast.Subscript,
    ast.Slice,
    ast.List,
    ast.Tuple,
    ast.Dict,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.BinOp,
    ast.Compare,
    ast.IfExp,
    ast.Call,
    *_BINARY,
    *_UNARY,
    *_COMPARE,
)
_NAMES = {
    ast.Lambda: "lambda",
    ast.ListComp: "a comprehension",
    ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension",
    ast.GeneratorExp: "a generator",
    ast.NamedExpr: "':='",
    ast.Pow: "'**'",
    ast.LShift: "'<<'",
    ast.JoinedStr: "an f-string",
    ast.Starred: "'*' unpacking",
    ast.Await: "await",
}


class ExpressionError(BlockFailed):
    """The expression is not allowed, or failed when evaluated."""


@dataclass(frozen=True, slots=True)
class Expression:
    """A checked expression, ready to evaluate against upstream outputs."""

    text: str
    tree: ast.Expression

    def references(self) -> Iterator[Reference]:
        """Each block output the expression reads: the block id, and the field if one is
        named (``agent1.content`` gives ``agent1`` and ``content``)."""
        with_field = {
            node.value: node.attr
            for node in ast.walk(self.tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        }
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and node.id not in FUNCTIONS:
                field = with_field.get(node)
                yield Reference(node.id, (field,) if field else ())

    def evaluate(self, outputs: Mapping[str, Mapping[str, Any] | None]) -> Any:
        """The value, given the outputs of upstream blocks by id (None for skipped ones)."""
        try:
            return _Evaluator(outputs).visit(self.tree.body)
        except ExpressionError:
            raise
        except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
            raise ExpressionError(f"{self.text!r} failed: {exc}") from None


def parse_expression(text: str) -> Expression:
    """Parse and check ``text``; ``ExpressionError`` says what is not allowed and where."""
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        where = f"column {exc.offset}" if exc.offset else "the end"
        raise ExpressionError(f"{exc.msg} at {where}") from None
    for node in ast.walk(tree):
        _check(node)
    return Expression(text, tree)


def _check(node: ast.AST) -> None:
    if not isinstance(node, _PLAIN):
        what = _NAMES.get(type(node), type(node).__name__)
        raise ExpressionError(f"{what} is not allowed")
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    if name.startswith("_"):
        raise ExpressionError(f"names starting with '_' are not allowed: {name!r}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            allowed = ", ".join(FUNCTIONS)
            raise ExpressionError(f"only these functions may be called: {allowed}")
        if node.keywords:
            raise ExpressionError("keyword arguments are not allowed")
    if isinstance(node, ast.Dict) and None in node.keys:
        raise ExpressionError("'**' unpacking is not allowed")


class _Evaluator:
    """Walks a checked tree. Only the node types ``_check`` lets through reach it."""

    def __init__(self, outputs: Mapping[str, Mapping[str, Any] | None]) -> None:
        self.outputs = outputs

    def visit(self, node: ast.expr) -> Any:
        match node:
            case ast.Constant(value=value):
                return value
            case ast.Name(id=name):
                if name not in self.outputs:
                    raise ExpressionError(f"unknown name {name!r}")
                return self.outputs[name]
            case ast.Attribute(value=ast.Name(id=name), attr=attr):
                # A block's own fields: one it did not produce (e.g. ``error``) is null.
                return (self.visit(node.value) or {}).get(attr)
            case ast.Attribute(value=inner, attr=attr):
                value = self.visit(inner)
                if not isinstance(value, Mapping) or attr not in value:
                    raise ExpressionError(f"{ast.unparse(inner)} has no field {attr!r}")
                return value[attr]
            case ast.Subscript(value=inner, slice=ast.Slice() as part):
                bounds = (part.lower, part.upper, part.step)
                indices = [None if b is None else self.visit(b) for b in bounds]
                return self.visit(inner)[slice(*indices)]
            case ast.Subscript(value=inner, slice=index):
                return self.visit(inner)[self.visit(index)]
            case ast.List(elts=items) | ast.Tuple(elts=items):
                return [self.visit(item) for item in items]
            case ast.Dict(keys=keys, values=values):
                # No None keys: ``**`` unpacking was refused by the check.
                return {
                    self.visit(k): self.visit(v)
                    for k, v in zip(keys, values, strict=True)
                    if k is not None
                }
            case ast.BoolOp(op=ast.And(), values=values):
                result = True
                for item in values:
                    if not (result := self.visit(item)):
                        break
                return result
            case ast.BoolOp(values=values):
                result = False
                for item in values:
                    if result := self.visit(item):
                        break
                return result
            case ast.UnaryOp(op=op, operand=operand):
                return _UNARY[type(op)](self.visit(operand))
            case ast.BinOp(left=left, op=op, right=right):
                a, b = self.visit(left), self.visit(right)
                if isinstance(op, ast.Mult):
                    _check_repeat(a, b)
                return _check_size(_BINARY[type(op)](a, b))
            case ast.Compare(left=left, ops=ops, comparators=comparators):
                a = self.visit(left)
                for comparison, right in zip(ops, comparators, strict=True):
                    b = self.visit(right)
                    if not _COMPARE[type(comparison)](a, b):
                        return False
                    a = b
                return True
            case ast.IfExp(test=test, body=body, orelse=orelse):
                return self.visit(body) if self.visit(test) else self.visit(orelse)
            case ast.Call(func=ast.Name(id=name), args=args):
                return FUNCTIONS[name](*(self.visit(arg) for arg in args))
        raise ExpressionError(f"{type(node).__name__} is not allowed")  # unreachable if checked


def _check_repeat(a: Any, b: Any) -> None:
    """Refuse before building: one ``*`` can ask for gigabytes."""
    for sequence, times in ((a, b), (b, a)):
        if isinstance(sequence, str | list) and isinstance(times, int):
            _check_length(len(sequence) * times)


def _check_size(value: Any) -> Any:
    if isinstance(value, str | list):
        _check_length(len(value))
    return value


def _check_length(length: int) -> None:
    if length > MAX_SIZE:
        raise ExpressionError(f"the result would be longer than {MAX_SIZE:,} items")
