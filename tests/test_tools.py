"""Tools: schemas from type hints, validated calls, error outcomes, and the built-in tools."""

import math
import re
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from agentstream.runtime.builtin_tools import BUILTIN_TOOLS, calculator, current_time
from agentstream.runtime.tools import Tool, ToolOutcome, ToolRegistry, tool

T = TypeVar("T")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def run(awaitable_factory: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await awaitable_factory()

    return anyio.run(main)


def call(t: Tool, **arguments: Any) -> ToolOutcome:
    return run(lambda: t.call(arguments))


# --- schema --------------------------------------------------------------------------------


def test_schema_from_hints_required_defaults_and_descriptions() -> None:
    def search(
        query: Annotated[str, Field(description="What to look for")],
        limit: int = 10,
        exact: bool = False,
        tags: list[str] | None = None,
    ) -> list[str]:
        """Search the notes.

        Longer explanation that is not part of the description.
        """
        return []

    t = Tool.from_function(search)
    assert t.name == "search"
    assert t.description == "Search the notes."
    params = t.parameters
    assert params["type"] == "object"
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert list(props) == ["query", "limit", "exact", "tags"]
    assert props["query"] == {"type": "string", "description": "What to look for"}
    assert props["limit"] == {"type": "integer", "default": 10}
    assert props["exact"]["type"] == "boolean"
    assert props["tags"]["default"] is None
    assert {"type": "array", "items": {"type": "string"}} in props["tags"]["anyOf"]
    assert "title" not in params


def test_no_parameters_gives_an_empty_object_schema() -> None:
    def ping() -> str:
        return "pong"

    t = Tool.from_function(ping)
    assert t.parameters["properties"] == {}
    assert t.parameters["required"] == []
    assert t.description == ""
    assert call(t) == ToolOutcome(result="pong")


def test_google_style_args_section_supplies_descriptions() -> None:
    def book(city: str, nights: Annotated[int, Field(description="From Field")] = 1) -> str:
        """Book a hotel.

        Args:
            city: Where to stay,
                spelled in English.
            nights (int): Ignored because the Field wins.

        Returns:
            A confirmation code.
        """
        return "ok"

    t = Tool.from_function(book)
    assert t.description == "Book a hotel."
    props = t.parameters["properties"]
    assert props["city"]["description"] == "Where to stay, spelled in English."
    assert props["nights"]["description"] == "From Field"


def test_name_and_description_overrides() -> None:
    def f(x: int) -> int:
        """Original."""
        return x

    t = Tool.from_function(f, name="double-check", description="Custom.")
    assert (t.name, t.description) == ("double-check", "Custom.")


def test_parameter_names_that_clash_with_pydantic_still_work() -> None:
    def f(json: str, schema: int = 1, model_config: bool = True) -> list[Any]:
        return [json, schema, model_config]

    t = Tool.from_function(f)
    assert set(t.parameters["properties"]) == {"json", "schema", "model_config"}
    assert call(t, json="a", schema=2).result == ["a", 2, True]


def test_nested_models_are_validated_and_passed_as_models() -> None:
    class Point(BaseModel):
        x: float
        y: float

    seen: list[Any] = []

    def distance(a: Point, b: Point) -> float:
        seen.append(a)
        return math.hypot(a.x - b.x, a.y - b.y)

    t = Tool.from_function(distance)
    assert "$defs" in t.parameters
    outcome = call(t, a={"x": 0, "y": 0}, b={"x": 3, "y": 4})
    assert outcome == ToolOutcome(result=5.0)
    assert isinstance(seen[0], Point)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda *items: None, "'*items'"),
        (lambda **options: None, "'**options'"),
    ],
)
def test_var_args_rejected(fn: Callable[..., Any], message: str) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        Tool.from_function(fn, name="f")


def test_missing_annotation_rejected_naming_the_parameter() -> None:
    def f(a: int, b) -> None:  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(TypeError, match="'b' needs a type annotation"):
        Tool.from_function(f)


def test_invalid_tool_names_rejected() -> None:
    with pytest.raises(ValueError, match="Invalid tool name"):
        Tool.from_function(lambda: None)  # "<lambda>"
    with pytest.raises(ValueError, match="Invalid tool name"):
        Tool.from_function(lambda: None, name="has space")


def test_unsupported_type_is_a_type_error() -> None:
    class Opaque:
        pass

    def f(thing: Opaque) -> None:
        pass

    with pytest.raises(TypeError, match="argument model for tool 'f'"):
        Tool.from_function(f)


# --- calling -------------------------------------------------------------------------------


def test_validation_error_names_each_field_and_function_not_called() -> None:
    calls: list[Any] = []

    def f(count: int, name: str) -> None:
        calls.append((count, name))

    t = Tool.from_function(f)
    outcome = call(t, count="many")
    assert not outcome.ok
    assert outcome.result is None
    assert outcome.error is not None
    assert outcome.error.startswith("Invalid arguments for tool 'f': ")
    assert "count: Input should be a valid integer" in outcome.error
    assert "name: Field required" in outcome.error
    assert calls == []


def test_extra_argument_rejected() -> None:
    calls: list[int] = []

    def f(x: int) -> int:
        calls.append(x)
        return x

    outcome = call(Tool.from_function(f), x=1, y=2)
    assert outcome.error == "Invalid arguments for tool 'f': y: Extra inputs are not permitted"
    assert calls == []


def test_non_mapping_arguments_are_an_error_outcome() -> None:
    def f(x: int) -> int:
        return x

    t = Tool.from_function(f)
    outcome = run(lambda: t.call([1]))  # type: ignore[arg-type]
    assert outcome.error is not None
    assert "expected an object" in outcome.error


def test_arguments_are_coerced_like_json() -> None:
    def add(a: int, b: float = 0.5) -> float:
        return a + b

    assert call(Tool.from_function(add), a="2") == ToolOutcome(result=2.5)


def test_exception_becomes_error_outcome() -> None:
    def explode(reason: str) -> None:
        raise RuntimeError(reason)

    def silent() -> None:
        raise KeyError

    assert call(Tool.from_function(explode), reason="boom") == ToolOutcome(
        error="RuntimeError: boom"
    )
    assert call(Tool.from_function(silent)).error == "KeyError"


def test_async_exception_becomes_error_outcome() -> None:
    async def explode() -> None:
        await anyio.lowlevel.checkpoint()
        raise ValueError("nope")

    assert call(Tool.from_function(explode)).error == "ValueError: nope"


def test_sync_tool_runs_off_the_event_loop_thread() -> None:
    def where() -> int:
        return threading.get_ident()

    t = Tool.from_function(where)

    async def main() -> tuple[int, ToolOutcome]:
        return threading.get_ident(), await t.call({})

    loop_thread, outcome = anyio.run(main)
    assert outcome.ok
    assert outcome.result != loop_thread


def test_slow_sync_tool_does_not_block_the_loop() -> None:
    def slow() -> str:
        time.sleep(0.3)
        return "done"

    t = Tool.from_function(slow)
    ticks: list[float] = []

    async def ticker() -> None:
        for _ in range(5):
            ticks.append(time.monotonic())
            await anyio.sleep(0.02)

    async def main() -> ToolOutcome:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            outcome = await t.call({})
        return outcome

    assert anyio.run(main) == ToolOutcome(result="done")
    assert len(ticks) == 5
    assert ticks[-1] - ticks[0] < 0.25  # the ticker kept running while the tool slept


@pytest.mark.anyio
async def test_async_tool_is_awaited_on_the_loop() -> None:
    async def fetch(key: str) -> dict[str, str]:
        await anyio.lowlevel.checkpoint()
        return {"key": key, "thread": str(threading.get_ident())}

    outcome = await Tool.from_function(fetch).call({"key": "k"})
    assert outcome.ok
    assert outcome.result == {"key": "k", "thread": str(threading.get_ident())}


@pytest.mark.anyio
async def test_callable_object_with_async_call() -> None:
    class Greeter:
        async def __call__(self, who: str) -> str:
            return f"hi {who}"

    outcome = await Tool.from_function(Greeter(), name="greet").call({"who": "ada"})
    assert outcome == ToolOutcome(result="hi ada")


@pytest.mark.anyio
async def test_cancellation_propagates() -> None:
    started = anyio.Event()

    async def forever() -> None:
        started.set()
        await anyio.sleep_forever()

    t = Tool.from_function(forever)
    outcomes: list[ToolOutcome] = []

    async def runner() -> None:
        outcomes.append(await t.call({}))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner)
            await started.wait()
            tg.cancel_scope.cancel()
    assert outcomes == []  # cancelled, not turned into an error outcome


def test_results_are_made_json_able() -> None:
    class Point(BaseModel):
        x: int

    def f() -> dict[str, Any]:
        return {"when": datetime(2024, 1, 2, tzinfo=UTC), "p": Point(x=1), "t": (1, 2)}

    outcome = call(Tool.from_function(f))
    assert outcome.result == {"when": "2024-01-02T00:00:00Z", "p": {"x": 1}, "t": [1, 2]}


def test_non_serialisable_result_is_an_error_outcome() -> None:
    def f() -> object:
        return object()

    def g() -> float:
        return math.nan

    outcome = call(Tool.from_function(f))
    assert outcome.error is not None
    assert "not JSON-serialisable" in outcome.error
    assert call(Tool.from_function(g)).error is not None


# --- decorator and registry ----------------------------------------------------------------


def test_decorator_forms() -> None:
    @tool
    def plain(x: int) -> int:
        """Plain doc."""
        return x * 2

    @tool(name="renamed", description="Described.")
    def other(x: int) -> int:
        return x

    @tool()
    def empty_parens() -> int:
        return 1

    assert isinstance(plain, Tool)
    assert (plain.name, plain.description) == ("plain", "Plain doc.")
    assert (other.name, other.description) == ("renamed", "Described.")
    assert empty_parens.name == "empty_parens"
    assert call(plain, x=4).result == 8
    assert plain.fn(3) == 6


def test_registry() -> None:
    a = Tool.from_function(lambda: 1, name="b_tool")
    b = Tool.from_function(lambda: 2, name="a_tool")
    registry = ToolRegistry([a, b])
    assert registry.names() == ["a_tool", "b_tool"]
    assert "a_tool" in registry
    assert "zzz" not in registry
    assert 42 not in registry
    assert registry.get("b_tool") is a
    assert registry.select(["b_tool", "a_tool", "b_tool"]) == [a, b]
    assert registry.select([]) == []
    assert len(registry) == 2


def test_registry_errors() -> None:
    registry = ToolRegistry([Tool.from_function(lambda: 1, name="one")])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Tool.from_function(lambda: 2, name="one"))
    with pytest.raises(KeyError, match="Unknown tool 'two'; known tools: one"):
        registry.get("two")
    with pytest.raises(KeyError, match="two"):
        registry.select(["one", "two"])


def test_builtin_tools() -> None:
    assert [t.name for t in BUILTIN_TOOLS] == ["calculator", "current_time"]
    registry = ToolRegistry(BUILTIN_TOOLS)
    calc = registry.get("calculator")
    assert calc.parameters["required"] == ["expression"]
    assert calc.description.startswith("Evaluate an arithmetic expression exactly")
    assert call(calc, expression="17 * 23") == ToolOutcome(result=391)
    assert call(calc, expression="1/0").error == "ZeroDivisionError: Division by zero"
    unsafe = call(calc, expression="__import__('os').system('true')")
    assert unsafe.error is not None
    assert unsafe.error.startswith("ValueError: Unsupported expression")


# --- calculator ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("17 * 23", 391),
        ("(2 + 3) ** 2 / 7", 25 / 7),
        ("7 / 2", 3.5),
        ("6 / 3", 2),
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("2 ** 3 ** 2", 512),
        ("-2 ** 2", -4),
        ("(-2) ** 2", 4),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("-7 % 3", 2),
        ("+5 - -5", 10),
        ("0.1 + 0.2", 0.3),
        ("1.5 * 2", 3.0),
        ("2 ** -2", 0.25),
        ("2 ** 0.5", math.sqrt(2)),
        ("1e3 + 1", 1001.0),
        ("1_000 * 3", 3000),
        ("2 ** 100", 2**100),
        ("  42  ", 42),
        ("0.999 ** 1000", 0.999**1000),
    ],
)
def test_calculator_results(expression: str, expected: float) -> None:
    result = calculator(expression)
    assert result == pytest.approx(expected, rel=1e-12)
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("3 \u00d7 4", 12),
        ("12 \u00f7 4", 3),
        ("2 ^ 10", 1024),
        ("2^3^2", 512),
        ("3\u00d7(1+1)^2\u00f76", 2),
    ],
)
def test_calculator_operator_synonyms(expression: str, expected: int) -> None:
    assert calculator(expression) == expected


@pytest.mark.parametrize(
    "expression",
    [
        "x",
        "x + 1",
        "abs(-1)",
        "__import__('os')",
        "(1).real",
        "().__class__",
        "'a' * 3",
        "1 < 2",
        "not 1",
        "~1",
        "True + 1",
        "1j",
        "[1, 2]",
        "1 if 1 else 2",
        "lambda: 1",
        "(x := 1)",
        "1 & 3",
        "1 << 100",
    ],
)
def test_calculator_rejects_anything_but_arithmetic(expression: str) -> None:
    with pytest.raises(ValueError, match="Unsupported expression"):
        calculator(expression)


@pytest.mark.parametrize("expression", ["", "   ", "1 +", "1;2", "import os", "(1", "\x00"])
def test_calculator_rejects_malformed_input(expression: str) -> None:
    with pytest.raises(ValueError, match=r"Invalid expression|Empty expression"):
        calculator(expression)


@pytest.mark.parametrize("expression", ["9 ** 9 ** 9", "2 ** 100000", "2 ** -5000", "1 ** 1001"])
def test_calculator_rejects_huge_exponents(expression: str) -> None:
    with pytest.raises(ValueError, match="Exponent too large"):
        calculator(expression)


@pytest.mark.parametrize(
    "expression",
    ["(10 ** 1000) ** 10", "((10**100)**10)**10", "10.0 ** 400", "1e308 * 10", "1e999"],
)
def test_calculator_rejects_huge_results(expression: str) -> None:
    started = time.monotonic()
    with pytest.raises(OverflowError, match="too large"):
        calculator(expression)
    assert time.monotonic() - started < 1


def test_calculator_rejects_long_input() -> None:
    expression = "+".join(["1"] * 101)  # 201 characters
    with pytest.raises(ValueError, match="too long"):
        calculator(expression)
    assert calculator("+".join(["1"] * 100)) == 100


@pytest.mark.parametrize(
    "expression", ["1 / 0", "1 // 0", "1 % 0", "1 / (2 - 2)", "0 ** -1", "1/0.0"]
)
def test_calculator_division_by_zero(expression: str) -> None:
    with pytest.raises(ZeroDivisionError):
        calculator(expression)


def test_calculator_fractional_power_of_negative_is_not_real() -> None:
    with pytest.raises(ValueError, match="not a real number"):
        calculator("(-8) ** (1/3)")


_ARITHMETIC = st.text(alphabet="0123456789+-*/%().^\u00d7\u00f7 e_jx", max_size=60)


@settings(
    max_examples=400,
    deadline=timedelta(seconds=2),
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.one_of(_ARITHMETIC, st.text(max_size=250)))
def test_calculator_only_raises_documented_errors(expression: str) -> None:
    started = time.monotonic()
    try:
        result = calculator(expression)
    except (ValueError, ZeroDivisionError, OverflowError):
        pass
    else:
        assert type(result) in (int, float)
        assert isinstance(result, int) or math.isfinite(result)
    assert time.monotonic() - started < 1


# --- current_time --------------------------------------------------------------------------


def test_current_time_utc() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    stamp = current_time()
    after = datetime.now(UTC)
    parsed = datetime.fromisoformat(stamp)
    assert parsed.utcoffset() == timedelta(0)
    assert before <= parsed <= after
    assert datetime.fromisoformat(current_time("utc")).utcoffset() == timedelta(0)


def test_current_time_in_a_zone() -> None:
    parsed = datetime.fromisoformat(current_time("Asia/Kolkata"))
    assert parsed.utcoffset() == timedelta(hours=5, minutes=30)


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "", "../etc/passwd", "America"])
def test_current_time_invalid_zone(zone: str) -> None:
    with pytest.raises(ValueError, match="Unknown time zone"):
        current_time(zone)


def test_current_time_tool_reports_the_bad_zone() -> None:
    clock = ToolRegistry(BUILTIN_TOOLS).get("current_time")
    outcome = call(clock, timezone="Nowhere/Special")
    assert outcome.error == "ValueError: Unknown time zone: 'Nowhere/Special'"
    assert call(clock).ok
