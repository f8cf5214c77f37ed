"""The sandboxed expressions of condition and function blocks: what they compute, and all
they refuse (no imports, no attribute access, no calls but the listed functions)."""

from __future__ import annotations

from typing import Any

import pytest

from agentstream.workflows.expressions import (
    MAX_SIZE,
    MAX_STEPS,
    ExpressionError,
    parse_expression,
)

OUTPUTS: dict[str, Any] = {
    "start": {"input": {"n": 7, "name": "Ada", "tags": ["a", "b", "c"]}},
    "agent1": {"content": "Hello there"},
    "skipped": None,
}


def evaluate(text: str) -> Any:
    return parse_expression(text).evaluate(OUTPUTS)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("start.input.n > 5 and agent1.content != ''", True),
        ("start.input.n * 2 + 1", 15),
        ("start.input.n // 2, start.input.n % 2, -start.input.n / 2", [3, 1, -3.5]),
        ("'Hello' in agent1.content", True),
        ("lower(agent1.content) == 'hello there'", True),
        ("len(start.input.tags)", 3),
        ("start.input.tags[0] + start.input.tags[-1]", "ac"),
        ("start.input.tags[1:]", ["b", "c"]),
        ("start.input['name']", "Ada"),
        ("'big' if start.input.n > 10 else 'small'", "small"),
        ("1 < start.input.n < 10", True),
        ("skipped.result is None", True),
        ("agent1.error", None),
        ("{'n': start.input.n, 'ok': not False}", {"n": 7, "ok": True}),
        ("max(start.input.tags) or 'none'", "c"),
        ("0 or '' or 'last'", "last"),
    ],
)
def test_expressions_compute_over_upstream_outputs(text: str, value: Any) -> None:
    assert evaluate(text) == value


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("__import__('os').system('id')", "only these functions may be called"),
        ("start.__class__", "names starting with '_' are not allowed: '__class__'"),
        ("agent1.content.__len__", "names starting with '_' are not allowed"),
        ("_secret", "names starting with '_' are not allowed"),
        ("lambda: 1", "lambda is not allowed"),
        ("[x for x in start.input.tags]", "a comprehension is not allowed"),
        ("(x for x in start.input.tags)", "a generator is not allowed"),
        ("open('/etc/passwd')", "only these functions may be called"),
        ("getattr(start, 'input')", "only these functions may be called"),
        ("agent1.content.upper()", "only these functions may be called"),
        ("len(s=agent1.content)", "keyword arguments are not allowed"),
        ("9 ** 9 ** 9", "'**' is not allowed"),
        ("1 << 100000", "'<<' is not allowed"),
        ("f'{agent1.content}'", "an f-string is not allowed"),
        ("(x := 1)", "':=' is not allowed"),
        ("{**start}", "'**' unpacking is not allowed"),
        ("len(*start.input.tags)", "'*' unpacking is not allowed"),
        ("{1, 2}", "Set is not allowed"),
        ("a; b", "invalid syntax"),
        ("x" * 5000, "longer than"),
    ],
)
def test_expressions_outside_the_sandbox_are_refused_before_running(
    text: str, refusal: str
) -> None:
    with pytest.raises(ExpressionError) as caught:
        parse_expression(text)
    assert refusal in str(caught.value)


def test_dotted_names_read_keys_never_attributes() -> None:
    with pytest.raises(ExpressionError, match=r"start\.input has no field 'keys'"):
        evaluate("start.input.keys")
    with pytest.raises(ExpressionError, match=r"agent1\.content has no field 'upper'"):
        evaluate("agent1.content.upper")


def test_building_huge_values_is_refused() -> None:
    with pytest.raises(ExpressionError, match="larger than"):
        evaluate("'x' * 10_000_000")
    with pytest.raises(ExpressionError, match="larger than"):
        evaluate("start.input.tags * 10_000_000")
    assert len(evaluate(f"'x' * {MAX_SIZE}")) == MAX_SIZE
    assert len(evaluate(f"[0] * {MAX_SIZE}")) == MAX_SIZE


@pytest.mark.parametrize(
    "text",
    [
        # Each would build gigabytes, or a hundred million items, if only the outer
        # value's own length were checked.
        "len(str([[0] * 1000000] * 1000))",
        "len(str([[0] * 999_000] * 1000))",
        "sorted(['a' * 1000000] * 1000000) and 1",
        "sorted(['a' * 999_000] * 1000) and 1",
        "len(sum([[0] * 1000000] * 100, []))",
        "len(sum([[0] * 999_000] * 100, []))",
        "[[], [], []] * 1_000_000_000",
        "{'k': 'v' * 999_000, 'l': 'w' * 999_000}",
    ],
)
def test_values_are_measured_with_everything_nested_in_them(text: str) -> None:
    with pytest.raises(ExpressionError, match=f"larger than {MAX_SIZE:,} items"):
        evaluate(text)


def test_what_functions_return_is_measured_too() -> None:
    # Half a million floats: within the size, but their text is 2.5 million characters.
    with pytest.raises(ExpressionError, match="larger than"):
        evaluate("str([1.5] * 500_000)")


def test_percent_formatting_is_refused_as_it_repeats_its_values() -> None:
    with pytest.raises(ExpressionError, match="'%' formatting is not allowed"):
        evaluate("'%(a)s' * 1000 % {'a': 'x' * 999_000}")


def test_summing_lists_joins_them_in_one_pass() -> None:
    # The builtin copies the total at every step: 500 million copies here.
    assert evaluate("len(sum([[0] * 999] * 1000, []))") == 999_000
    assert evaluate("sum([[1], [2, 3]], [0])") == [0, 1, 2, 3]
    with pytest.raises(ExpressionError, match="every item must be a list"):
        evaluate("sum([[1], 'ab'], [])")


def test_an_evaluation_has_a_budget_of_work() -> None:
    # Each term is a value within the size; together they are more work than allowed.
    many = " + ".join(["len([0] * 999_999)"] * (MAX_STEPS // 999_999 + 1))
    with pytest.raises(ExpressionError, match=f"more than {MAX_STEPS:,} steps"):
        evaluate(many)
    with pytest.raises(ExpressionError, match="steps"):
        evaluate("sorted([3] * 999_999)")  # n log n comparisons
    assert evaluate("len(sorted([3] * 100_000))") == 100_000


@pytest.mark.parametrize("text", ["-" * 3000 + "1", "1 + " * 999 + "1", "not " * 900 + "1"])
def test_deep_nesting_is_refused_before_running(text: str) -> None:
    with pytest.raises(ExpressionError, match="nested too deeply"):
        parse_expression(text)


def test_upstream_data_too_deep_to_walk_fails_the_expression() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ExpressionError, match="failed: nested too deeply"):
        parse_expression("str(start.input)").evaluate({"start": {"input": deep}})


def test_runtime_failures_are_expression_errors_naming_the_expression() -> None:
    with pytest.raises(ExpressionError, match="'1 / 0' failed: division by zero"):
        evaluate("1 / 0")
    with pytest.raises(ExpressionError, match="unknown name 'nobody'"):
        evaluate("nobody.content")
    with pytest.raises(ExpressionError, match="failed: list index out of range"):
        evaluate("start.input.tags[10]")


def test_references_are_the_blocks_and_fields_read() -> None:
    expression = parse_expression("len(agent1.content) > start.input.n and skipped")
    assert sorted((r.block_id, r.path) for r in expression.references()) == [
        ("agent1", ("content",)),
        ("skipped", ()),
        ("start", ("input",)),
    ]
