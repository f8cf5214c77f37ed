"""The offline model: deterministic, tool-using, token by token, reasoning only on request."""

from __future__ import annotations

import anyio

from agentstream.providers.base import (
    Message,
    ModelPart,
    ModelRequest,
    ReasoningPart,
    RequestedToolCall,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    ToolSpec,
    TurnEndPart,
    UsagePart,
)
from agentstream.providers.offline import OfflineModel

TOOLS = [
    ToolSpec(name="calculator", description="", parameters={}),
    ToolSpec(name="current_time", description="", parameters={}),
]


def turn(
    *messages: Message, reasoning: bool = False, tools: list[ToolSpec] = TOOLS
) -> list[ModelPart]:
    async def collect() -> list[ModelPart]:
        request = ModelRequest(messages=messages, tools=tools, reasoning=reasoning)
        return [part async for part in OfflineModel().stream(request)]

    return anyio.run(collect)


def text(parts: list[ModelPart]) -> str:
    return "".join(p.delta for p in parts if isinstance(p, TextPart))


def user(content: str) -> Message:
    return Message(role="user", content=content)


def test_arithmetic_becomes_a_calculator_call_with_streamed_arguments() -> None:
    parts = turn(user("What is (2 + 3) * 4?"))

    start = next(p for p in parts if isinstance(p, ToolCallStartPart))
    arguments = "".join(p.delta for p in parts if isinstance(p, ToolCallArgsPart))
    assert start.name == "calculator"
    assert arguments == '{"expression": "(2 + 3) * 4"}'
    assert len([p for p in parts if isinstance(p, ToolCallArgsPart)]) > 1
    assert ToolCallEndPart(start.id) in parts
    assert parts[-1] == TurnEndPart("tool_calls")
    assert text(parts) == "Let me use the calculator tool."


def test_answers_from_tool_results() -> None:
    call = RequestedToolCall(id="c1", name="calculator", arguments={"expression": "2+2"})
    parts = turn(
        user("What is 2+2?"),
        Message(role="assistant", tool_calls=(call,)),
        Message(role="tool", content="4", tool_call_id="c1"),
    )
    assert text(parts) == "The answer is 4."
    assert parts[-1] == TurnEndPart("end_turn")


def test_no_tool_call_without_the_tool() -> None:
    parts = turn(user("What is 2+2?"), tools=[])
    assert not any(isinstance(p, ToolCallStartPart) for p in parts)


def test_time_questions_use_the_clock() -> None:
    parts = turn(user("What time is it?"))
    assert [p.name for p in parts if isinstance(p, ToolCallStartPart)] == ["current_time"]


def test_reasoning_only_when_requested_and_before_text() -> None:
    assert not any(isinstance(p, ReasoningPart) for p in turn(user("hi")))
    parts = turn(user("hi"), reasoning=True)
    kinds = [type(p) for p in parts]
    assert kinds.index(ReasoningPart) < kinds.index(TextPart)
    assert max(i for i, k in enumerate(kinds) if k is ReasoningPart) < kinds.index(TextPart)


def test_streams_token_by_token_and_reports_usage() -> None:
    parts = turn(user("Write 50 words please"))
    deltas = [p for p in parts if isinstance(p, TextPart)]
    assert len(deltas) == 50
    assert [p.delta for p in deltas[:3]] == ["word1", " word2", " word3"]
    assert text(parts) == " ".join(f"word{i}" for i in range(1, 51))
    usage = next(p.usage for p in parts if isinstance(p, UsagePart))
    assert usage.output_tokens == 50
    assert usage.input_tokens == 4


def test_is_deterministic() -> None:
    assert turn(user("What is 9 * 9? Think."), reasoning=True) == turn(
        user("What is 9 * 9? Think."), reasoning=True
    )
