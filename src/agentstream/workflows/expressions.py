"""Sandboxed expressions for condition and function blocks: a small, safe subset of Python.

The text is parsed with ``ast`` and every node checked against a whitelist before anything
runs; evaluation then walks the tree here, never through ``eval``. So there is no attribute
access at all (``agent1.content`` reads the key ``content`` of the block's output), calls go
only to the functions in ``FUNCTIONS``, and the only names are upstream block ids. Whatever
could make an expression slow or huge (``**``, ``<<``, comprehensions, ``%`` formatting)
is refused, and so is nesting deeper than ``MAX_DEPTH``.

Evaluating is bounded too, since one expression runs while the server's streams wait: no
value an expression builds may hold more than ``MAX_SIZE`` items, nested ones counted (so
``[[0] * 1000] * 1000`` is a million, though it shares one inner list), checked before a
``*`` builds and after every operation and call; and each evaluation has ``MAX_STEPS`` of
work, charged for the nodes it visits and the items it builds, compares, sorts or hands to a
function. Either limit ends it with an ``ExpressionError``, as does a result too deep to walk.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agentstream.workflows.errors import BlockFailed
from agentstream.workflows.references import Reference

__all__ = ["FUNCTIONS", "Expression", "ExpressionError", "parse_expression"]

MAX_LENGTH = 4_000
"""Longest expression text accepted."""
MAX_DEPTH = 200
"""Deepest nesting of an expression's tree (each operator of a chain like ``a + b + c`` nests)."""
MAX_SIZE = 1_000_000
"""Largest value an expression may build or hand to a function, in items: a string counts its
characters, a list or dict its items and what they hold, nested ones included."""
MAX_STEPS = 10_000_000
"""Work one evaluation may do, in nodes visited and items built, compared, sorted or passed."""


def _sum(items: Any, start: Any = 0) -> Any:
    """``sum``, but lists are joined in one pass: ``sum`` copies the total at every step."""
    if isinstance(start, list) and isinstance(items, list):
        if not all(isinstance(item, list) for item in items):
            raise TypeError("sum of lists: every item must be a list")
        return list(itertools.chain(start, *items))
    return sum(items, start)


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
    "sum": _sum,
    "upper": str.upper,
}
"""The only functions an expression may call."""
_CHEAP = frozenset({"bool", "len"})
"""Functions that do not read their argument through, so it is not measured."""

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
        """The value, given the outputs of upstream blocks by id (None for skipped ones).
        Bounded in size and work, but it may take a second: call it off the event loop."""
        try:
            return _Evaluator(outputs).visit(self.tree.body)
        except ExpressionError:
            raise
        except (RecursionError, MemoryError):  # upstream data nested too deep to walk
            raise ExpressionError(f"{self.text!r} failed: nested too deeply") from None
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
    except (RecursionError, MemoryError):  # the parser's own limit, below MAX_LENGTH
        raise _too_deep() from None
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep()
        _check(node)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return Expression(text, tree)


def _too_deep() -> ExpressionError:
    return ExpressionError(f"nested too deeply (more than {MAX_DEPTH} levels)")


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
        self.steps = MAX_STEPS

    def spend(self, steps: int) -> None:
        self.steps -= steps
        if self.steps < 0:
            raise ExpressionError(f"too much work: more than {MAX_STEPS:,} steps")

    def measure(self, value: Any) -> int:
        """The size of ``value``, its counting paid for; past ``MAX_SIZE`` counting stops."""
        size = _size(value)
        self.spend(size)
        return size

    def checked(self, value: Any) -> Any:
        if self.measure(value) > MAX_SIZE:
            raise _too_large()
        return value

    def visit(self, node: ast.expr) -> Any:
        self.spend(1)
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
                part_of = self.visit(inner)[slice(*indices)]
                self.spend(len(part_of))
                return part_of
            case ast.Subscript(value=inner, slice=index):
                return self.visit(inner)[self.visit(index)]
            case ast.List(elts=items) | ast.Tuple(elts=items):
                return self.checked([self.visit(item) for item in items])
            case ast.Dict(keys=keys, values=values):
                # No None keys: ``**`` unpacking was refused by the check.
                return self.checked(
                    {
                        self.visit(k): self.visit(v)
                        for k, v in zip(keys, values, strict=True)
                        if k is not None
                    }
                )
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
                    self.check_repeat(a, b)
                if isinstance(op, ast.Mod) and isinstance(a, str):
                    # One short format can repeat a long value: '%(a)s%(a)s' % {'a': ...}
                    raise ExpressionError("'%' formatting is not allowed: use + and str()")
                return self.checked(_BINARY[type(op)](a, b))
            case ast.Compare(left=left, ops=ops, comparators=comparators):
                a = self.visit(left)
                for comparison, right in zip(ops, comparators, strict=True):
                    b = self.visit(right)
                    self.spend(_size(a) + _size(b))
                    if not _COMPARE[type(comparison)](a, b):
                        return False
                    a = b
                return True
            case ast.IfExp(test=test, body=body, orelse=orelse):
                return self.visit(body) if self.visit(test) else self.visit(orelse)
            case ast.Call(func=ast.Name(id=name), args=args):
                return self.checked(self.call(name, [self.visit(arg) for arg in args]))
        raise ExpressionError(f"{type(node).__name__} is not allowed")  # unreachable if checked

    def call(self, name: str, args: list[Any]) -> Any:
        """Arguments too large to read through are refused, and sorting costs its n log n."""
        if name not in _CHEAP:
            for arg in args:
                if (size := self.measure(arg)) > MAX_SIZE:
                    raise ExpressionError(f"{name}() of a value over {MAX_SIZE:,} items")
                if name == "sorted":
                    self.spend(size * math.ceil(math.log2(size + 1)))
        return FUNCTIONS[name](*args)

    def check_repeat(self, a: Any, b: Any) -> None:
        """Refuse before building: one ``*`` can ask for gigabytes."""
        for sequence, times in ((a, b), (b, a)):
            if isinstance(times, int) and times > 0:
                if isinstance(sequence, str):
                    built = len(sequence) * times
                elif isinstance(sequence, list):
                    built = self.measure(sequence) * times
                else:
                    continue
                if built > MAX_SIZE:
                    raise _too_large()


def _size(value: Any, limit: int = MAX_SIZE) -> int:
    """How many items ``value`` holds: a string its characters, a list or dict a slot for each
    item plus what the items hold, an int one per 64 bits (so ``str`` cannot turn a small
    size into a huge text). Stops counting past ``limit``, so shared inner lists
    (``[big] * 1000``) cost no more than that to count; flat lists are counted at C speed."""
    total, pending = 0, [iter((value,))]
    while pending and total <= limit:
        item = next(pending[-1], _END)
        if item is _END:
            pending.pop()
        elif isinstance(item, str):
            total += len(item)
        elif isinstance(item, int):
            total += item.bit_length() // 64
        elif isinstance(item, list | tuple):
            total += len(item)
            kinds = set(map(type, item))
            if kinds <= _FLAT:
                continue
            if kinds <= {str}:
                total += sum(map(len, item))
            elif kinds <= {int, bool}:
                total += max(map(int.bit_length, item)) // 64 * len(item)  # at most
            else:
                pending.append(iter(item))
        elif isinstance(item, Mapping):
            total += len(item)
            pending.append(itertools.chain.from_iterable(item.items()))
    return total


_FLAT = frozenset({float, bool, type(None)})
_END = object()


def _too_large() -> ExpressionError:
    return ExpressionError(f"the result would be larger than {MAX_SIZE:,} items")
