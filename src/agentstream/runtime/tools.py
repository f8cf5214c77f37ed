"""Turn plain Python functions into tools a model can call.

The JSON Schema a provider needs is derived from the type hints, and arguments are validated
against it before the function runs, so a confused model gets an error message, never a crash.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin, overload

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from agentstream.inputs import message_of

__all__ = ["Tool", "ToolOutcome", "ToolRegistry", "tool"]

# What OpenAI and Anthropic both accept as a function/tool name.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Headers that end the summary paragraph / the "Args:" section of a Google-style docstring.
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|"
    r"Attributes|Warnings?|See Also|Todo)\s*:\s*$",
    re.IGNORECASE,
)
_ARGS_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params)\s*:\s*$", re.IGNORECASE)
_ARG_LINE = re.compile(r"^\*{0,2}([A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a tool call produced: a JSON-able result, or an error message for the model."""

    result: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the call succeeded (no error)."""
        return self.error is None


class Tool:
    """A callable the model may invoke, with a JSON Schema derived from its type hints."""

    name: str
    description: str
    parameters: dict[str, Any]

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        requires_approval: bool = False,
    ) -> None:
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        if tool_name is None:
            raise TypeError(f"Cannot infer a tool name from {fn!r}; pass name=...")
        if not _TOOL_NAME.fullmatch(tool_name):
            raise ValueError(
                f"Invalid tool name {tool_name!r}: use 1-64 letters, digits, '_' or '-'"
            )
        doc = inspect.getdoc(fn) or ""
        self.name = tool_name
        self.description = description if description is not None else _summary(doc)
        self.requires_approval = requires_approval
        """Every call waits for a person's approval before it runs."""
        self._fn = fn
        # An object whose class defines `async def __call__` is async too.
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__
        )
        self._model, self._fields = _arguments_model(fn, tool_name, _arg_docs(doc))
        self.parameters = _parameters_schema(self._model, tool_name)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        requires_approval: bool = False,
    ) -> Tool:
        """Build a tool from `fn`: name, description and parameter schema come from the function.

        Raises TypeError for *args/**kwargs, missing annotations or types pydantic cannot
        describe, and ValueError for a name providers would reject.
        """
        return cls(fn, name=name, description=description, requires_approval=requires_approval)

    @property
    def fn(self) -> Callable[..., Any]:
        """The wrapped function."""
        return self._fn

    async def call(self, arguments: Mapping[str, Any]) -> ToolOutcome:
        """Validate `arguments`, run the function and report the result or the error.

        Exceptions raised by the function become error outcomes; cancellation propagates.
        """
        if not isinstance(arguments, Mapping):
            return ToolOutcome(
                error=f"Invalid arguments for tool '{self.name}': expected an object, "
                f"got {type(arguments).__name__}"
            )
        try:
            validated = self._model.model_validate(dict(arguments))
        except ValidationError as exc:
            return ToolOutcome(error=f"Invalid arguments for tool '{self.name}': {_describe(exc)}")

        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for field, (param, positional) in self._fields.items():
            value = getattr(validated, field)
            if positional:
                args.append(value)
            else:
                kwargs[param] = value

        try:
            if self._is_async:
                result = await self._fn(*args, **kwargs)
            else:
                # A cancelled run does not wait for a sync tool's thread to finish: the call
                # settles as cancelled at once and the thread's result is dropped.
                result = await anyio.to_thread.run_sync(
                    functools.partial(self._fn, *args, **kwargs), abandon_on_cancel=True
                )
                if inspect.isawaitable(result):
                    result = await result
        except Exception as exc:
            return ToolOutcome(error=_exception_message(exc))

        try:
            jsonable = to_jsonable_python(result)
            json.dumps(jsonable, allow_nan=False)
        except Exception as exc:
            return ToolOutcome(
                error=f"Tool '{self.name}' returned a value that is not JSON-serialisable "
                f"({type(result).__name__}): {_exception_message(exc)}"
            )
        return ToolOutcome(result=jsonable)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r})"


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Decorator form: @tool or @tool(name=..., requires_approval=True) returns a Tool."""

    def decorate(func: Callable[..., Any]) -> Tool:
        return Tool.from_function(
            func, name=name, description=description, requires_approval=requires_approval
        )

    return decorate(fn) if fn is not None else decorate


class ToolRegistry:
    """Tools available to agents, by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> None:
        """Add `tool`; a second tool with the same name is a ValueError."""
        if tool.name in self._tools:
            raise ValueError(f"A tool named '{tool.name}' is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool:
        """The tool called `name`; KeyError listing the known names otherwise."""
        try:
            return self._tools[name]
        except KeyError:
            known = ", ".join(self.names()) or "(none)"
            raise KeyError(f"Unknown tool '{name}'; known tools: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._tools)

    def select(self, names: Iterable[str]) -> list[Tool]:
        """The tools with these names, in the given order without repeats; KeyError if unknown."""
        return [self.get(n) for n in dict.fromkeys(names)]


# --- helpers -------------------------------------------------------------------------------


def _summary(doc: str) -> str:
    """The first paragraph of a docstring, on one line (stops at a section header)."""
    lines: list[str] = []
    for line in doc.strip().splitlines():
        stripped = line.strip()
        if not stripped or _SECTION.match(stripped):
            break
        lines.append(stripped)
    return " ".join(lines)


def _arg_docs(doc: str) -> dict[str, str]:
    """Parameter descriptions from a Google-style "Args:" section."""
    docs: dict[str, str] = {}
    in_args = False
    base_indent: int | None = None
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        if not in_args:
            in_args = bool(_ARGS_SECTION.match(stripped))
            continue
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break
        if base_indent is None:
            base_indent = indent
        if indent < base_indent:
            break
        if indent == base_indent:
            match = _ARG_LINE.match(stripped)
            if match:
                current = match.group(1)
                docs[current] = match.group(2).strip()
            else:
                current = None
        elif current is not None:
            docs[current] = f"{docs[current]} {stripped}".strip()
    return {k: v for k, v in docs.items() if v}


def _description_for(annotation: Any, docstring_text: str | None) -> str | None:
    """The description to add to a parameter, or None to leave pydantic's own.

    Annotated[T, Field(description=...)] wins (pydantic applies it), then Annotated[T, "text"],
    then the docstring's "Args:" entry.
    """
    if get_origin(annotation) is Annotated:
        metadata = get_args(annotation)[1:]
        if any(isinstance(m, FieldInfo) and m.description is not None for m in metadata):
            return None
        texts = [m for m in metadata if isinstance(m, str)]
        if texts:
            return texts[0]
    return docstring_text


def _arguments_model(
    fn: Callable[..., Any], tool_name: str, arg_docs: Mapping[str, str]
) -> tuple[type[BaseModel], dict[str, tuple[str, bool]]]:
    """A pydantic model for the arguments, and field name -> (parameter name, positional?).

    Fields get neutral names and the parameter name as alias, so parameters such as `json`,
    `schema` or `_private` don't collide with pydantic's own attributes.
    """
    try:
        signature = inspect.signature(fn, eval_str=True)
    except (NameError, SyntaxError) as exc:
        raise TypeError(f"Cannot resolve the type hints of tool '{tool_name}': {exc}") from exc

    definitions: dict[str, Any] = {}
    fields: dict[str, tuple[str, bool]] = {}
    for index, param in enumerate(signature.parameters.values()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            star = "*" if param.kind is param.VAR_POSITIONAL else "**"
            raise TypeError(
                f"Tool '{tool_name}': parameter '{star}{param.name}' is not supported; "
                "tools take named parameters only"
            )
        if param.annotation is param.empty:
            raise TypeError(f"Tool '{tool_name}': parameter '{param.name}' needs a type annotation")
        annotation = param.annotation
        default: Any = ... if param.default is param.empty else param.default
        extra: dict[str, Any] = {}
        description = _description_for(annotation, arg_docs.get(param.name))
        if description is not None:
            extra["description"] = description
        field_name = f"arg_{index}"
        definitions[field_name] = (annotation, Field(default, alias=param.name, **extra))
        fields[field_name] = (param.name, param.kind is param.POSITIONAL_ONLY)

    model_name = "".join(part.capitalize() for part in re.split(r"[-_]", tool_name)) + "Arguments"
    try:
        model = create_model(
            model_name,
            __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
            **definitions,
        )
    except Exception as exc:
        raise TypeError(f"Cannot build an argument model for tool '{tool_name}': {exc}") from exc
    return model, fields


def _parameters_schema(model: type[BaseModel], tool_name: str) -> dict[str, Any]:
    """The JSON Schema object for the arguments, without pydantic's generated titles."""
    try:
        schema = model.model_json_schema(by_alias=True)
    except Exception as exc:
        raise TypeError(f"Cannot describe the parameters of tool '{tool_name}': {exc}") from exc
    schema.pop("title", None)
    properties: dict[str, Any] = schema.setdefault("properties", {})
    for prop in properties.values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    schema.setdefault("required", [])
    schema["type"] = "object"
    return schema


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        parts.append(f"{where}: {message_of(error)}")
    return "; ".join(parts)


def _exception_message(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
