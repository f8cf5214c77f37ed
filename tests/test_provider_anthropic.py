"""The Anthropic adapter against a fake Messages API replaying the documented SSE stream: the
exact parts of each kind of turn, what each request carried (thinking signatures and tool
results replayed), every failure as a ProviderError, and whole agent runs through our server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from pathlib import Path
from typing import Any

import anthropic
import anyio
import anyio.to_thread
import httpx2
import pytest

from agentstream.agents import AgentSpec
from agentstream.errors import ProviderError
from agentstream.events import Usage
from agentstream.providers.anthropic import AnthropicModel
from agentstream.providers.base import (
    Message,
    ModelPart,
    ModelRequest,
    ProviderStatePart,
    ReasoningPart,
    RequestedToolCall,
    StopReason,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
    UsagePart,
)
from conftest import CALCULATOR, LiveServer, free_port, make_settings, serve, stream_frames
from fakes.anthropic import (
    FakeAnthropic,
    Reply,
    error_reply,
    frame,
    message_start,
    redacted_thinking_block,
    run_fake,
    text_block,
    thinking_block,
    tool_use_block,
    turn,
)

API_MODEL = "claude-sonnet-4-5"
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
SYSTEM = Message(role="system", content="You are terse.")
ASK = Message(role="user", content="What is (2 + 3) * 4?")


def api(url: str, *, timeout: float = 5.0) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        api_key="test-key", base_url=url, max_retries=0, timeout=timeout
    )


def stream(
    url: str, request: ModelRequest, *, timeout: float = 5.0
) -> tuple[list[ModelPart], ProviderError | None]:
    """The parts of one turn, and the error that ended it, if any."""
    parts: list[ModelPart] = []

    async def run() -> ProviderError | None:
        with anyio.fail_after(10):
            async with api(url, timeout=timeout) as client:
                model = AnthropicModel("claude", client=client, api_model=API_MODEL)
                try:
                    async for part in model.stream(request):
                        parts.append(part)
                except ProviderError as exc:
                    return exc
        return None

    return parts, anyio.run(run)


def parts_of(fake: FakeAnthropic, request: ModelRequest) -> list[ModelPart]:
    parts, error = stream(fake.url, request)
    assert error is None, error
    return parts


def error_of(fake: FakeAnthropic, request: ModelRequest, **options: Any) -> ProviderError:
    _, error = stream(fake.url, request, **options)
    assert error is not None, "the turn should have failed"
    return error


def ask(*messages: Message, reasoning: bool = False, **settings: Any) -> ModelRequest:
    return ModelRequest(
        messages=[SYSTEM, ASK, *messages],
        tools=[CALCULATOR],
        reasoning=reasoning,
        settings=settings,
    )


def end(content: list[dict[str, Any]], stop: StopReason, usage: Usage) -> list[ModelPart]:
    """The closing parts of every turn."""
    return [
        UsagePart(usage),
        ProviderStatePart({"anthropic": {"content": content}}),
        TurnEndPart(stop),
    ]


THINK_THEN_CALL = turn(
    thinking_block(0, "I should not guess;", " the calculator is exact.", signature=SIGNATURE),
    text_block(1, "Let me calculate."),
    tool_use_block(2, "toolu_01A", "calculator", '{"expression', '": "(2 + 3)', ' * 4"}'),
    stop_reason="tool_use",
    input_tokens=420,
    output_tokens=96,
)
THINK_THEN_CALL_BLOCKS: list[dict[str, Any]] = [
    {
        "type": "thinking",
        "thinking": "I should not guess; the calculator is exact.",
        "signature": SIGNATURE,
    },
    {"type": "text", "text": "Let me calculate."},
    {
        "type": "tool_use",
        "id": "toolu_01A",
        "name": "calculator",
        "input": {"expression": "(2 + 3) * 4"},
    },
]
REPLAYED_TOOL_LOOP = [
    {"role": "user", "content": [{"type": "text", "text": ASK.content}]},
    {"role": "assistant", "content": THINK_THEN_CALL_BLOCKS},
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_01A", "content": "20"}],
    },
]
"""The second request of the tool loop: the thinking block with its exact signature before
the tool_use block, then the tool result in a user message."""


def test_text_answer() -> None:
    reply = turn(text_block(0, "It", " is", " 20."), input_tokens=30, cache_read_input_tokens=100)
    with run_fake(reply) as fake:
        parts = parts_of(fake, ask())

    assert parts == [
        TextPart("It"),
        TextPart(" is"),
        TextPart(" 20."),
        *end(
            [{"type": "text", "text": "It is 20."}],
            "end_turn",
            Usage(input_tokens=130, output_tokens=9),
        ),
    ]
    assert fake.requests == [
        {
            "model": API_MODEL,
            "max_tokens": 8192,
            "system": "You are terse.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": ASK.content}]}],
            "tools": [
                {
                    "name": "calculator",
                    "description": "Evaluate an arithmetic expression.",
                    "input_schema": CALCULATOR.parameters,
                }
            ],
            "stream": True,
        }
    ]


def test_thinking_is_requested_and_streamed_as_reasoning() -> None:
    thought = turn(
        thinking_block(0, "Two plus three", " is five.", signature=SIGNATURE),
        text_block(1, "Five."),
        input_tokens=50,
        output_tokens=40,
    )
    with run_fake(thought, turn(text_block(0, "Five."))) as fake:
        parts = parts_of(fake, ask(reasoning=True))
        parts_of(fake, ask(reasoning=True, max_tokens=16000, thinking_budget=4000))

    assert parts == [
        ReasoningPart("Two plus three"),
        ReasoningPart(" is five."),
        TextPart("Five."),
        *end(
            [
                {"type": "thinking", "thinking": "Two plus three is five.", "signature": SIGNATURE},
                {"type": "text", "text": "Five."},
            ],
            "end_turn",
            Usage(input_tokens=50, output_tokens=40),
        ),
    ]
    assert [(r["max_tokens"], r["thinking"]) for r in fake.requests] == [
        (8192, {"type": "enabled", "budget_tokens": 2048}),
        (16000, {"type": "enabled", "budget_tokens": 4000}),
    ]


@pytest.mark.parametrize(
    ("anthropic_reason", "stop"),
    [
        ("stop_sequence", "end_turn"),
        ("refusal", "end_turn"),
        ("max_tokens", "max_tokens"),
        ("model_context_window_exceeded", "max_tokens"),
    ],
)
def test_stop_reasons(anthropic_reason: str, stop: StopReason) -> None:
    with run_fake(turn(text_block(0, "Cut"), stop_reason=anthropic_reason)) as fake:
        parts = parts_of(fake, ask())

    assert parts[-1] == TurnEndPart(stop)


def test_a_thinking_budget_that_leaves_no_room_is_refused_before_any_request() -> None:
    with run_fake() as fake:
        error = error_of(fake, ask(reasoning=True, max_tokens=1024))

    assert error.kind == "bad_request"
    assert str(error) == (
        "model_settings max_tokens (1024) must be larger than thinking_budget (2048) when "
        "reasoning is on: thinking counts within max_tokens"
    )
    assert fake.requests == []


def test_thinking_with_its_signature_is_replayed_before_the_tool_call() -> None:
    call = RequestedToolCall(
        id="toolu_01A", name="calculator", arguments={"expression": "(2 + 3) * 4"}
    )
    with run_fake(THINK_THEN_CALL, turn(text_block(0, "(2 + 3) * 4 = 20."))) as fake:
        first = parts_of(fake, ask(reasoning=True))
        state = first[-2]
        assert isinstance(state, ProviderStatePart)
        second = parts_of(
            fake,
            ask(
                Message(role="assistant", tool_calls=(call,), provider_state=state.state),
                Message(role="tool", content="20", tool_call_id="toolu_01A"),
                reasoning=True,
            ),
        )

    assert first == [
        ReasoningPart("I should not guess;"),
        ReasoningPart(" the calculator is exact."),
        TextPart("Let me calculate."),
        ToolCallStartPart("toolu_01A", "calculator"),
        ToolCallArgsPart("toolu_01A", '{"expression'),
        ToolCallArgsPart("toolu_01A", '": "(2 + 3)'),
        ToolCallArgsPart("toolu_01A", ' * 4"}'),
        ToolCallEndPart("toolu_01A"),
        *end(THINK_THEN_CALL_BLOCKS, "tool_calls", Usage(input_tokens=420, output_tokens=96)),
    ]
    assert second[0] == TextPart("(2 + 3) * 4 = 20.")
    assert fake.requests[1]["messages"] == REPLAYED_TOOL_LOOP


def test_blocks_whose_stop_never_came_are_replayed_whole() -> None:
    """A block's text is kept in pieces, joined at the message's end: what came after the
    start block is replayed, with or without the block's ``content_block_stop``."""
    stopless = [
        f
        for f in [
            *thinking_block(0, "hmm", ", sure", signature=SIGNATURE),
            *text_block(1, "Hel", "lo"),
        ]
        if '"content_block_stop"' not in f
    ]
    with run_fake(turn(stopless)) as fake:
        parts = parts_of(fake, ask(reasoning=True))
    state = parts[-2]
    assert isinstance(state, ProviderStatePart)
    assert state.state["anthropic"]["content"] == [
        {"type": "thinking", "thinking": "hmm, sure", "signature": SIGNATURE},
        {"type": "text", "text": "Hello"},
    ]


def test_redacted_thinking_gives_no_reasoning_but_is_replayed() -> None:
    call = RequestedToolCall(id="toolu_01B", name="calculator", arguments={"expression": "2 + 3"})
    redacted_then_call = turn(
        redacted_thinking_block(0, REDACTED),
        tool_use_block(1, "toolu_01B", "calculator", '{"expression": "2 + 3"}'),
        stop_reason="tool_use",
    )
    with run_fake(redacted_then_call, turn(text_block(0, "5"))) as fake:
        first = parts_of(fake, ask(reasoning=True))
        state = first[-2]
        assert isinstance(state, ProviderStatePart)
        parts_of(
            fake,
            ask(
                Message(role="assistant", tool_calls=(call,), provider_state=state.state),
                Message(role="tool", content="5", tool_call_id="toolu_01B"),
            ),
        )

    blocks: list[dict[str, Any]] = [
        {"type": "redacted_thinking", "data": REDACTED},
        {"type": "tool_use", "id": "toolu_01B", "name": "calculator", "input": call.arguments},
    ]
    assert first == [
        ToolCallStartPart("toolu_01B", "calculator"),
        ToolCallArgsPart("toolu_01B", '{"expression": "2 + 3"}'),
        ToolCallEndPart("toolu_01B"),
        *end(blocks, "tool_calls", Usage(input_tokens=12, output_tokens=9)),
    ]
    assert fake.requests[1]["messages"][1] == {"role": "assistant", "content": blocks}


def test_history_without_provider_state_is_rebuilt_and_tool_results_share_one_message() -> None:
    calls = (
        RequestedToolCall(id="toolu_1", name="calculator", arguments={"expression": "1 / 0"}),
        RequestedToolCall(id="toolu_2", name="calculator", arguments={"expression": "2 * 2"}),
    )
    with run_fake(turn(text_block(0, "Done."))) as fake:
        parts_of(
            fake,
            ask(
                Message(role="assistant", content="Checking.", tool_calls=calls),
                Message(
                    role="tool", content='{"error": "division by zero"}', tool_call_id="toolu_1"
                ),
                Message(role="tool", content="4", tool_call_id="toolu_2"),
                Message(role="assistant", content="1 / 0 fails; 2 * 2 = 4."),
                Message(role="user", content="Thanks"),
            ),
        )

    tool_uses = [
        {"type": "tool_use", "input": c.arguments, "id": c.id, "name": c.name} for c in calls
    ]
    assert fake.requests[0]["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, *tool_uses]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": '{"error": "division by zero"}',
                    "is_error": True,
                },
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "4"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "1 / 0 fails; 2 * 2 = 4."}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]


HTTP_ERRORS = {
    "401": (
        error_reply(401, "authentication_error", "invalid x-api-key"),
        "auth",
        "Anthropic API refused the API key (401): invalid x-api-key; "
        "check the key and its permissions",
    ),
    "403": (
        error_reply(403, "permission_error", "Your API key does not have permission"),
        "auth",
        "Anthropic API refused the API key (403): Your API key does not have permission; "
        "check the key and its permissions",
    ),
    "429 with retry-after": (
        error_reply(
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
            {"retry-after": "20"},
        ),
        "rate_limit",
        "Anthropic API rate limit (429): Number of request tokens has exceeded your "
        "per-minute rate limit; retry after 20s or lower the request rate",
    ),
    "400 prompt too long": (
        error_reply(
            400, "invalid_request_error", "prompt is too long: 215000 tokens > 200000 maximum"
        ),
        "context_length",
        "Anthropic API prompt too long (400): prompt is too long: 215000 tokens > 200000 "
        "maximum; shorten the conversation or lower max_tokens",
    ),
    "400 other": (
        error_reply(400, "invalid_request_error", "tools.0.name: String should match pattern"),
        "bad_request",
        "Anthropic API rejected the request (400): tools.0.name: String should match "
        "pattern; check the model id, the tools and model_settings",
    ),
    "404 model": (
        error_reply(404, "not_found_error", f"model: {API_MODEL}"),
        "bad_request",
        f"Anthropic API rejected the request (404): model: {API_MODEL}; "
        "check the model id, the tools and model_settings",
    ),
    "529 overloaded": (
        error_reply(529, "overloaded_error", "Overloaded"),
        "overloaded",
        "Anthropic API overloaded (529): Overloaded; try again later",
    ),
    "503": (
        error_reply(503, "api_error", "Service unavailable"),
        "server",
        "Anthropic API server error (503): Service unavailable; try again later",
    ),
}


@pytest.mark.parametrize(("reply", "kind", "message"), HTTP_ERRORS.values(), ids=HTTP_ERRORS.keys())
def test_http_errors(reply: Reply, kind: str, message: str) -> None:
    with run_fake(reply) as fake:
        error = error_of(fake, ask())

    assert (error.kind, str(error), error.status_code) == (kind, message, reply.status)
    assert error.provider == "anthropic"
    assert error.body == reply.error
    assert error.headers.items() >= dict(reply.headers).items()


def test_an_error_event_mid_stream() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    reply = Reply(
        frames=[*message_start(), *text_block(0, "The answer"), frame("error", overloaded)]
    )
    with run_fake(reply) as fake:
        parts, error = stream(fake.url, ask())

    assert parts == [TextPart("The answer")]
    assert error is not None
    assert (error.kind, error.status_code, error.body) == ("overloaded", None, overloaded)
    assert str(error) == "Anthropic API overloaded (mid-stream): Overloaded; try again later"


STARTED = [*message_start(), *text_block(0, "Par")]
BROKEN_STREAMS = {
    "ends before message_stop": (
        Reply(frames=STARTED),
        "The Anthropic API stream ended before message_stop (cut short?)",
    ),
    "connection cut": (
        Reply(frames=STARTED, ending="cut"),
        "The Anthropic API connection broke before the end of the stream "
        "(peer closed connection without sending complete message body (incomplete chunked "
        "read))",
    ),
    "malformed JSON": (
        Reply(frames=[*STARTED, frame("message_delta", '{"type": "message_delta", "del')]),
        "Malformed message_delta event from the Anthropic API: "
        "Invalid JSON: EOF while parsing a string at line 1 column 30",
    ),
    "a known event with a missing field": (
        Reply(frames=[*STARTED, frame("content_block_delta", {"type": "content_block_delta"})]),
        "Malformed content_block_delta event from the Anthropic API: "
        "delta: Field required; index: Field required",
    ),
    "invalid tool JSON": (
        turn(
            text_block(0, "Par"),
            tool_use_block(1, "toolu_9", "calculator", '{"expression": ', '"2 +'),
            stop_reason="tool_use",
        ),
        "The Anthropic API sent invalid JSON arguments for tool calculator: "
        '\'{"expression": "2 +\'',
    ),
}


@pytest.mark.parametrize(("reply", "message"), BROKEN_STREAMS.values(), ids=BROKEN_STREAMS.keys())
def test_broken_streams_are_bad_responses(reply: Reply, message: str) -> None:
    with run_fake(reply) as fake:
        parts, error = stream(fake.url, ask())

    assert parts[0] == TextPart("Par"), "what came before the break was streamed"
    assert error is not None
    assert (error.kind, str(error)) == ("bad_response", message)


def test_unknown_event_types_are_skipped() -> None:
    future = frame("future_event", {"type": "future_event", "detail": 1})
    reply = turn(text_block(0, "Hi"))
    with run_fake(Reply(frames=[future, *reply.frames])) as fake:
        parts = parts_of(fake, ask())

    assert parts[0] == TextPart("Hi")
    assert parts[-1] == TurnEndPart("end_turn")


def test_a_stalled_stream_times_out_and_is_closed() -> None:
    with run_fake(Reply(frames=STARTED, ending="hold")) as fake:
        parts, error = stream(fake.url, ask(), timeout=0.5)

        assert parts == [TextPart("Par")]
        assert error is not None
        assert error.kind == "timeout"
        assert fake.disconnected.wait(5), "the fake saw the client hang up"


def test_closing_the_parts_early_closes_the_http_stream() -> None:
    async def take_one(fake: FakeAnthropic) -> tuple[ModelPart, bool]:
        with anyio.fail_after(10):
            async with api(fake.url) as client:
                model = AnthropicModel("claude", client=client, api_model=API_MODEL)
                async with aclosing(model.stream(ask())) as parts:
                    first = await anext(parts)
                hung_up = await anyio.to_thread.run_sync(fake.disconnected.wait, 5)
        return first, hung_up

    with run_fake(Reply(frames=STARTED, ending="hold")) as fake:
        first, hung_up = anyio.run(take_one, fake)

    assert first == TextPart("Par")
    assert hung_up, "the fake saw the client hang up while the client was still open"


def test_an_unreachable_api_is_a_connection_error() -> None:
    port = free_port()
    _, error = stream(f"http://127.0.0.1:{port}", ask())

    assert error is not None
    assert error.kind == "connection"
    assert str(error).startswith(f"Could not reach the Anthropic API at http://127.0.0.1:{port}")


@contextmanager
def agent_server(fake: FakeAnthropic, tmp_path: Path) -> Iterator[LiveServer]:
    """Our server with an agent on an AnthropicModel pointed at the fake. The client's
    connections live in the server's event loop, which ends with the block, so none may be
    kept alive past its request."""
    no_keepalive = httpx2.AsyncClient(limits=httpx2.Limits(max_keepalive_connections=0))
    client = anthropic.AsyncAnthropic(
        api_key="test-key", base_url=fake.url, max_retries=0, timeout=5, http_client=no_keepalive
    )
    model = AnthropicModel("claude", client=client, api_model=API_MODEL)
    agent = AgentSpec(
        id="calc", model="claude", tools=["calculator"], reasoning=True, instructions="Be terse."
    )
    with serve(make_settings(tmp_path), models=[model], agents=[agent]) as live:
        yield live


def test_agent_run_with_thinking_and_a_tool_call(tmp_path: Path) -> None:
    answer = turn(
        thinking_block(0, "The tool says 20.", signature="sig-2"),
        text_block(1, "(2 + 3) * 4", " = 20."),
        input_tokens=530,
        output_tokens=40,
    )
    with run_fake(THINK_THEN_CALL, answer) as fake, agent_server(fake, tmp_path) as live:
        _, frames = stream_frames(live, "calc", {"message": ASK.content})

    run_id, session_id = frames[0]["run_id"], frames[0]["session_id"]
    complete = frames[-1]
    assert frames == [
        {"event": "start", "run_id": run_id, "session_id": session_id},
        {"event": "step_started", "step": 1},
        {"event": "reasoning_delta", "delta": "I should not guess;"},
        {"event": "reasoning_delta", "delta": " the calculator is exact."},
        {"event": "reasoning", "text": "I should not guess; the calculator is exact."},
        {"event": "content_delta", "delta": "Let me calculate."},
        {"event": "preamble", "step": 1, "text": "Let me calculate."},
        {
            "event": "tool_call",
            "tool_call_id": "toolu_01A",
            "tool_name": "calculator",
            "arguments": {"expression": "(2 + 3) * 4"},
        },
        {
            "event": "tool_result",
            "tool_call_id": "toolu_01A",
            "tool_name": "calculator",
            "result": 20,
            "status": "success",
        },
        {"event": "step_completed", "step": 1},
        {"event": "step_started", "step": 2},
        {"event": "reasoning_delta", "delta": "The tool says 20."},
        {"event": "reasoning", "text": "The tool says 20."},
        {"event": "content_delta", "delta": "\n\n(2 + 3) * 4"},  # after the preamble
        {"event": "content_delta", "delta": " = 20."},
        {"event": "step_completed", "step": 2},
        {
            "event": "complete",
            "run_id": run_id,
            "content": "(2 + 3) * 4 = 20.",
            "usage": complete["usage"],
        },
    ]
    usage = complete["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (420 + 530, 96 + 40)
    second = fake.requests[1]
    assert (second["system"], second["thinking"]["type"]) == ("Be terse.", "enabled")
    assert second["messages"] == REPLAYED_TOOL_LOOP


def test_agent_run_ends_in_error_when_the_api_is_overloaded(tmp_path: Path) -> None:
    overloaded = error_reply(529, "overloaded_error", "Overloaded")
    with run_fake(overloaded) as fake, agent_server(fake, tmp_path) as live:
        _, frames = stream_frames(live, "calc", {"message": ASK.content})
        with live.client() as client:
            run = client.get(f"/api/agents/runs/{frames[0]['run_id']}").json()

    message = "Anthropic API overloaded (529): Overloaded; try again later"
    assert frames[-1] == {"event": "error", "message": message, "status": "error"}
    assert run["status"] == "error"
