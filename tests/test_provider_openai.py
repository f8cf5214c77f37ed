"""The OpenAI adapters against a local server that speaks the documented wire formats: the
exact parts of each stream, what was sent (history, tools, reasoning replay), every failure
as a ProviderError, and whole agent runs through our server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from openai import AsyncOpenAI, DefaultAsyncHttpx2Client

from agentstream.agents import AgentSpec
from agentstream.errors import ProviderError
from agentstream.events import Usage
from agentstream.providers.base import (
    Message,
    ModelPart,
    ModelRequest,
    ProviderStatePart,
    ReasoningPart,
    ReasoningSummaryPart,
    RequestedToolCall,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
    UsagePart,
)
from agentstream.providers.openai import OpenAIChatModel, OpenAIResponsesModel
from conftest import CALCULATOR, free_port, make_settings, serve, stream_frames
from fakes.openai import (
    FakeOpenAI,
    Reply,
    chat_call_arguments,
    chat_call_start,
    chat_chunk,
    chat_stream,
    chat_text,
    chat_usage,
    function_call_item,
    http_error,
    message_item,
    raw_stream,
    reasoning_item,
    response_object,
    responses_reply,
    responses_stream,
)

pytestmark = pytest.mark.anyio

AnyModel = OpenAIChatModel | OpenAIResponsesModel
Adapter = type[OpenAIChatModel] | type[OpenAIResponsesModel]

SYSTEM = Message(role="system", content="Be brief.")
ASK = Message(role="user", content="What is 17 * 23?")
CALL = RequestedToolCall(id="call_1", name="calculator", arguments={"expression": "17 * 23"})
RESULT = Message(role="tool", content="391", tool_call_id="call_1")
FIRST_TURN = ModelRequest(messages=[SYSTEM, ASK], tools=[CALCULATOR])

ARGUMENT_PIECES = ('{"expr', 'ession": "17', ' * 23"}')
CALL_PARTS: list[ModelPart] = [
    ToolCallStartPart("call_1", "calculator"),
    *(ToolCallArgsPart("call_1", piece) for piece in ARGUMENT_PIECES),
    ToolCallEndPart("call_1"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    with fake.serve():
        yield fake


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        base_url=fake.base_url, api_key="test-key", max_retries=0, timeout=5
    ) as client:
        yield client


async def collect(model: AnyModel, request: ModelRequest) -> list[ModelPart]:
    with anyio.fail_after(10):
        async with aclosing(model.stream(request)) as parts:
            return [part async for part in parts]


async def collect_until_error(
    model: AnyModel, request: ModelRequest
) -> tuple[list[ModelPart], ProviderError]:
    """The parts streamed before the adapter raised, and what it raised."""
    seen: list[ModelPart] = []

    async def consume() -> None:
        async with aclosing(model.stream(request)) as parts:
            async for part in parts:
                seen.append(part)

    with anyio.fail_after(10), pytest.raises(ProviderError) as caught:
        await consume()
    return seen, caught.value


def calculator_call_chunks(pieces: tuple[str, ...] = ARGUMENT_PIECES) -> list[dict[str, Any]]:
    """A calculator call, its arguments in ``pieces``, then ``tool_calls`` and usage."""
    return [
        chat_chunk(
            {"role": "assistant", "content": None, **chat_call_start(0, "call_1", "calculator")}
        ),
        *(chat_chunk(chat_call_arguments(0, piece)) for piece in pieces),
        chat_chunk({}, finish_reason="tool_calls"),
        chat_chunk(usage=chat_usage(40, 18)),
    ]


# Chat Completions


async def test_chat_text_answer(fake: FakeOpenAI, client: AsyncOpenAI) -> None:
    fake.script.append(chat_text("Hello", " there."))
    request = ModelRequest(
        messages=[SYSTEM, Message(role="user", content="Hi")],
        tools=[CALCULATOR],
        settings={"max_tokens": 100, "temperature": 0.2, "thinking_budget": 1024},
    )

    parts = await collect(OpenAIChatModel("gpt", client=client, api_model="gpt-fake"), request)

    assert parts == [
        TextPart("Hello"),
        TextPart(" there."),
        UsagePart(Usage(input_tokens=12, output_tokens=3)),
        TurnEndPart("end_turn"),
    ]
    assert fake.received == [
        (
            "/v1/chat/completions",
            {
                "model": "gpt-fake",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"},
                ],
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "calculator",
                            "description": "Evaluate an arithmetic expression.",
                            "parameters": CALCULATOR.parameters,
                        },
                    }
                ],
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": 100,
                "temperature": 0.2,
            },
        )
    ]


async def test_chat_tool_call_then_answer_from_its_result(
    fake: FakeOpenAI, client: AsyncOpenAI
) -> None:
    fake.script += [
        chat_stream(*calculator_call_chunks()),
        chat_text("17 × 23 = 391.", usage=(60, 7)),
    ]
    model = OpenAIChatModel("gpt", client=client, api_model="gpt-fake")

    first = await collect(model, FIRST_TURN)
    assistant = Message(role="assistant", tool_calls=(CALL,))
    second = await collect(
        model, ModelRequest(messages=[SYSTEM, ASK, assistant, RESULT], tools=[CALCULATOR])
    )

    assert first == [
        *CALL_PARTS,
        UsagePart(Usage(input_tokens=40, output_tokens=18)),
        TurnEndPart("tool_calls"),
    ]
    assert second == [
        TextPart("17 × 23 = 391."),
        UsagePart(Usage(input_tokens=60, output_tokens=7)),
        TurnEndPart("end_turn"),
    ]
    assert fake.bodies[1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 17 * 23?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "17 * 23"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "391"},
    ]


async def test_chat_parallel_tool_calls_stream_by_index(
    fake: FakeOpenAI, client: AsyncOpenAI
) -> None:
    fake.script.append(
        chat_stream(
            chat_chunk({"role": "assistant", **chat_call_start(0, "call_a", "add")}),
            chat_chunk(chat_call_arguments(0, '{"a": 1,')),
            chat_chunk(chat_call_start(1, "call_b", "time")),
            chat_chunk(chat_call_arguments(1, '{"tz": "UTC"}')),
            chat_chunk(chat_call_arguments(0, ' "b": 2}')),
            chat_chunk({}, finish_reason="tool_calls"),
            chat_chunk(usage=chat_usage(30, 20)),
        )
    )

    parts = await collect(OpenAIChatModel("gpt", client=client, api_model="gpt-fake"), FIRST_TURN)

    assert parts == [
        ToolCallStartPart("call_a", "add"),
        ToolCallArgsPart("call_a", '{"a": 1,'),
        ToolCallStartPart("call_b", "time"),
        ToolCallArgsPart("call_b", '{"tz": "UTC"}'),
        ToolCallArgsPart("call_a", ' "b": 2}'),
        ToolCallEndPart("call_a"),
        ToolCallEndPart("call_b"),
        UsagePart(Usage(input_tokens=30, output_tokens=20)),
        TurnEndPart("tool_calls"),
    ]


def reasoning_server_reply(field: str) -> Reply:
    """How DeepSeek and vLLM (``reasoning_content``) or OpenRouter and Ollama (``reasoning``)
    stream thinking: a non-standard delta field, then the content."""
    return chat_stream(
        chat_chunk({"role": "assistant", "content": "", field: ""}),
        chat_chunk({"content": None, field: "17 * 23 is "}),
        chat_chunk({"content": None, field: "391."}),
        chat_chunk({"content": "391", field: None}),
        chat_chunk({}, finish_reason="stop"),
        chat_chunk(usage=chat_usage(15, 9)),
    )


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_compatible_server_reasoning_field_is_reasoning(
    fake: FakeOpenAI, client: AsyncOpenAI, field: str
) -> None:
    fake.script.append(reasoning_server_reply(field))
    model = OpenAIChatModel("r1", client=client, api_model="deepseek-r1", provider="vLLM")

    parts = await collect(model, ModelRequest(messages=[ASK], reasoning=True))

    assert parts == [
        ReasoningPart("17 * 23 is "),
        ReasoningPart("391."),
        TextPart("391"),
        UsagePart(Usage(input_tokens=15, output_tokens=9)),
        TurnEndPart("end_turn"),
    ]


async def test_compatible_server_reasoning_is_dropped_unless_asked_for(
    fake: FakeOpenAI, client: AsyncOpenAI
) -> None:
    fake.script.append(reasoning_server_reply("reasoning_content"))
    model = OpenAIChatModel("r1", client=client, api_model="deepseek-r1", provider="vLLM")

    parts = await collect(model, ModelRequest(messages=[ASK], reasoning=False))

    assert [part for part in parts if isinstance(part, ReasoningPart)] == []
    assert TextPart("391") in parts


async def test_chat_length_stop_is_max_tokens(fake: FakeOpenAI, client: AsyncOpenAI) -> None:
    fake.script.append(
        chat_stream(
            chat_chunk({"role": "assistant", "content": "Seventeen times"}),
            chat_chunk({}, finish_reason="length"),
            chat_chunk(usage=chat_usage(10, 2)),
        )
    )

    parts = await collect(OpenAIChatModel("gpt", client=client, api_model="gpt-fake"), FIRST_TURN)

    assert parts[-1] == TurnEndPart("max_tokens")


# Responses


async def test_responses_text_answer(fake: FakeOpenAI, client: AsyncOpenAI) -> None:
    fake.script.append(responses_reply(message_item("msg_1", "Hello", " there."), usage=(20, 5, 0)))
    request = ModelRequest(messages=[SYSTEM, ASK], tools=[CALCULATOR], settings={"max_tokens": 100})

    parts = await collect(OpenAIResponsesModel("o", client=client, api_model="o-fake"), request)

    assert parts == [
        TextPart("Hello"),
        TextPart(" there."),
        UsagePart(Usage(input_tokens=20, output_tokens=5)),
        TurnEndPart("end_turn"),
    ]
    assert fake.received == [
        (
            "/v1/responses",
            {
                "model": "o-fake",
                "stream": True,
                "include": ["reasoning.encrypted_content"],
                "input": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is 17 * 23?"},
                ],
                "max_output_tokens": 100,
                "store": False,
                "tools": [
                    {
                        "type": "function",
                        "name": "calculator",
                        "description": "Evaluate an arithmetic expression.",
                        "parameters": CALCULATOR.parameters,
                        "strict": False,
                    }
                ],
            },
        )
    ]


async def test_responses_reasoning_summary_then_text(fake: FakeOpenAI, client: AsyncOpenAI) -> None:
    reasoning = reasoning_item(
        "rs_1", ["Multiply ", "17 by 23."], ["Then say it."], encrypted="gAAAA-sealed"
    )
    fake.script.append(responses_reply(reasoning, message_item("msg_1", "391"), usage=(20, 90, 80)))
    request = ModelRequest(messages=[ASK], reasoning=True, settings={"reasoning_effort": "high"})

    parts = await collect(OpenAIResponsesModel("o", client=client, api_model="o-fake"), request)

    assert parts == [
        ReasoningPart("Multiply "),
        ReasoningPart("17 by 23."),
        ReasoningPart("\n\n"),
        ReasoningPart("Then say it."),
        TextPart("391"),
        UsagePart(Usage(input_tokens=20, output_tokens=90)),
        ReasoningSummaryPart("Multiply 17 by 23.\n\nThen say it."),
        ProviderStatePart({"OpenAI": {"output": [reasoning.item]}}),
        TurnEndPart("end_turn"),
    ]
    assert fake.bodies[0]["reasoning"] == {"effort": "high", "summary": "auto"}


async def test_responses_tool_call_replays_reasoning_and_call_items(
    fake: FakeOpenAI, client: AsyncOpenAI
) -> None:
    reasoning = reasoning_item("rs_1", ["I should use the calculator."], encrypted="gAAAA-1")
    call = function_call_item("fc_1", "call_1", "calculator", *ARGUMENT_PIECES)
    fake.script += [
        responses_reply(reasoning, call, usage=(50, 30, 20)),
        responses_reply(message_item("msg_2", "391"), usage=(90, 4, 0)),
    ]
    model = OpenAIResponsesModel("o", client=client, api_model="o-fake")

    first = await collect(model, ModelRequest(messages=[ASK], tools=[CALCULATOR], reasoning=True))
    state = next(part.state for part in first if isinstance(part, ProviderStatePart))
    assistant = Message(role="assistant", tool_calls=(CALL,), provider_state=state)
    second = await collect(
        model, ModelRequest(messages=[ASK, assistant, RESULT], tools=[CALCULATOR], reasoning=True)
    )

    assert first == [
        ReasoningPart("I should use the calculator."),
        *CALL_PARTS,
        UsagePart(Usage(input_tokens=50, output_tokens=30)),
        ReasoningSummaryPart("I should use the calculator."),
        ProviderStatePart({"OpenAI": {"output": [reasoning.item, call.item]}}),
        TurnEndPart("tool_calls"),
    ]
    assert second[-1] == TurnEndPart("end_turn")
    assert fake.bodies[1]["input"] == [
        {"role": "user", "content": "What is 17 * 23?"},
        reasoning.item,
        call.item,
        {"type": "function_call_output", "call_id": "call_1", "output": "391"},
    ]
    assert fake.bodies[1]["input"][1]["encrypted_content"] == "gAAAA-1"


async def test_responses_history_without_state_rebuilds_function_calls(
    fake: FakeOpenAI, client: AsyncOpenAI
) -> None:
    fake.script.append(responses_reply(message_item("msg_1", "391")))
    earlier = Message(role="assistant", content="Hello!")
    assistant = Message(role="assistant", tool_calls=(CALL,))
    messages = [Message(role="user", content="Hi"), earlier, ASK, assistant, RESULT]

    await collect(
        OpenAIResponsesModel("o", client=client, api_model="o-fake"),
        ModelRequest(messages=messages),
    )

    assert fake.bodies[0]["input"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 17 * 23?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "calculator",
            "arguments": '{"expression": "17 * 23"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "391"},
    ]


async def test_responses_incomplete_for_max_output_tokens_is_max_tokens(
    fake: FakeOpenAI, client: AsyncOpenAI
) -> None:
    text = message_item("msg_1", "Seventeen")
    incomplete = response_object(
        "incomplete",
        [text.item],
        (10, 2, 0),
        incomplete_details={"reason": "max_output_tokens"},
    )
    fake.script.append(
        responses_stream(*text.events, {"type": "response.incomplete", "response": incomplete})
    )

    parts = await collect(OpenAIResponsesModel("o", client=client, api_model="o-fake"), FIRST_TURN)

    assert parts == [
        TextPart("Seventeen"),
        UsagePart(Usage(input_tokens=10, output_tokens=2)),
        TurnEndPart("max_tokens"),
    ]


# Failures, for both APIs

BOTH_APIS = pytest.mark.parametrize("adapter", [OpenAIChatModel, OpenAIResponsesModel])


HTTP_ERRORS = {
    "401 wrong key": (
        http_error(401, "Incorrect API key provided: test-key.", code="invalid_api_key"),
        "auth",
        "Groq authentication failed (401): Incorrect API key provided: test-key.; "
        "check the API key and its access to this model",
    ),
    "403 no access": (
        http_error(403, "Project does not have access to model o-fake", code="model_not_found"),
        "auth",
        "Groq authentication failed (403): Project does not have access to model o-fake; "
        "check the API key and its access to this model",
    ),
    "429 with retry-after": (
        http_error(
            429,
            "Rate limit reached for requests per min (RPM): Limit 3, Used 3.",
            type="requests",
            code="rate_limit_exceeded",
            headers={"retry-after": "7"},
        ),
        "rate_limit",
        "Groq rate limit (429): Rate limit reached for requests per min (RPM): Limit 3, "
        "Used 3.; retry after 7s",
    ),
    "400 context too long": (
        http_error(
            400,
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9001 tokens.",
            code="context_length_exceeded",
        ),
        "context_length",
        "Groq context too long (400): This model's maximum context length is 8192 tokens. "
        "However, your messages resulted in 9001 tokens.; shorten the conversation or use "
        "a model with a larger context",
    ),
    "400 bad setting": (
        http_error(400, "Unsupported value: 'temperature' does not support 7.", code=None),
        "bad_request",
        "Groq rejected the request (400): Unsupported value: 'temperature' does not "
        "support 7.; check the model id and the agent's model_settings",
    ),
    "503 overloaded": (
        http_error(503, "The engine is currently overloaded.", type="server_error"),
        "overloaded",
        "Groq overloaded (503): The engine is currently overloaded.; try again later",
    ),
    "500 server error": (
        http_error(500, "The server had an error processing your request.", type="server_error"),
        "server",
        "Groq server error (500): The server had an error processing your request.; "
        "try again later",
    ),
}


@BOTH_APIS
@pytest.mark.parametrize(
    ("reply", "kind", "message"), list(HTTP_ERRORS.values()), ids=list(HTTP_ERRORS)
)
async def test_http_errors(
    fake: FakeOpenAI, client: AsyncOpenAI, adapter: Adapter, reply: Reply, kind: str, message: str
) -> None:
    fake.script.append(reply)

    parts, error = await collect_until_error(
        adapter("m", client=client, api_model="m-fake", provider="Groq"), FIRST_TURN
    )

    assert parts == []
    assert (error.kind, error.status_code, str(error), error.provider) == (
        kind,
        reply.status,
        message,
        "Groq",
    )
    assert isinstance(error.body, dict)
    assert error.body["message"] in message
    assert error.headers.get("retry-after") == reply.headers.get("retry-after")


STREAM_FAILURES = {
    "chat cut before finish_reason": (
        OpenAIChatModel,
        chat_stream(chat_chunk({"role": "assistant", "content": "Hel"}), done=False),
        [TextPart("Hel")],
        "bad_response",
        "OpenAI bad stream: the stream ended before a finish_reason; try again",
    ),
    "chat malformed JSON": (
        OpenAIChatModel,
        raw_stream(
            b'data: {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, '
            b'"model": "gpt-fake", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n',
            b'data: {"id": "chatcmpl-fake", "choices": [{"delta": {"content": "lo"\n\n',
        ),
        [TextPart("Hel")],
        "bad_response",
        "OpenAI bad stream: malformed event (JSONDecodeError: Expecting ',' delimiter: "
        "line 1 column 63 (char 62)); try again",
    ),
    "chat garbage chunk": (
        OpenAIChatModel,
        raw_stream(b'data: {"id": 7, "choices": "none"}\n\n', b"data: [DONE]\n\n"),
        [],
        "bad_response",
        "OpenAI bad stream: malformed event (AttributeError: 'str' object has no attribute "
        "'delta'); try again",
    ),
    "chat tool arguments not JSON": (
        OpenAIChatModel,
        chat_stream(*calculator_call_chunks(('{"expression": ', '"17 *'))),
        [
            ToolCallStartPart("call_1", "calculator"),
            ToolCallArgsPart("call_1", '{"expression": '),
            ToolCallArgsPart("call_1", '"17 *'),
        ],
        "bad_response",
        "OpenAI bad stream: the arguments of tool call 'calculator' are not JSON "
        "(Unterminated string starting at: line 1 column 16 (char 15)); try again",
    ),
    "chat error chunk mid-stream": (
        OpenAIChatModel,
        chat_stream(
            chat_chunk({"role": "assistant", "content": "Hel"}),
            {
                **chat_chunk({"content": ""}, finish_reason="error"),
                "error": {"code": "server_error", "message": "Provider disconnected"},
            },
        ),
        [TextPart("Hel")],
        "server",
        "OpenAI server error: Provider disconnected (code server_error); try again later",
    ),
    "responses cut before response.completed": (
        OpenAIResponsesModel,
        responses_reply(message_item("msg_1", "Hel", "lo"), end=None),
        [TextPart("Hel"), TextPart("lo")],
        "bad_response",
        "OpenAI bad stream: the stream ended before response.completed; try again",
    ),
    "responses malformed JSON": (
        OpenAIResponsesModel,
        raw_stream(b"event: response.output_text.delta\ndata: {not json}\n\n"),
        [],
        "bad_response",
        "OpenAI bad stream: malformed event (JSONDecodeError: Expecting property name enclosed "
        "in double quotes: line 1 column 2 (char 1)); try again",
    ),
    "responses tool arguments not JSON": (
        OpenAIResponsesModel,
        responses_reply(function_call_item("fc_1", "call_1", "calculator", '{"expression": 17')),
        [
            ToolCallStartPart("call_1", "calculator"),
            ToolCallArgsPart("call_1", '{"expression": 17'),
        ],
        "bad_response",
        "OpenAI bad stream: the arguments of tool call 'calculator' are not JSON "
        "(Expecting ',' delimiter: line 1 column 18 (char 17)); try again",
    ),
    "responses error event": (
        OpenAIResponsesModel,
        responses_stream(
            {"type": "response.created", "response": response_object()},
            {
                "type": "error",
                "code": "rate_limit_exceeded",
                "message": "Rate limit reached for tokens per min (TPM).",
                "param": None,
            },
        ),
        [],
        "rate_limit",
        "OpenAI rate limit: Rate limit reached for tokens per min (TPM). "
        "(code rate_limit_exceeded); retry later or lower the request rate",
    ),
    "responses response.failed": (
        OpenAIResponsesModel,
        responses_stream(
            *message_item("msg_1", "Hel").events[:3],
            {
                "type": "response.failed",
                "response": response_object(
                    "failed",
                    error={"code": "server_error", "message": "The model failed to respond."},
                ),
            },
        ),
        [TextPart("Hel")],
        "server",
        "OpenAI server error: The model failed to respond. (code server_error); try again later",
    ),
}


@pytest.mark.parametrize(
    ("adapter", "reply", "before", "kind", "message"),
    list(STREAM_FAILURES.values()),
    ids=list(STREAM_FAILURES),
)
async def test_stream_failures(
    fake: FakeOpenAI,
    client: AsyncOpenAI,
    adapter: Adapter,
    reply: Reply,
    before: list[ModelPart],
    kind: str,
    message: str,
) -> None:
    fake.script.append(reply)

    parts, error = await collect_until_error(
        adapter("m", client=client, api_model="m-fake"), FIRST_TURN
    )

    assert (parts, error.kind, str(error)) == (before, kind, message)


def stalled(adapter: Adapter) -> Reply:
    """The first text delta, then silence."""
    if adapter is OpenAIChatModel:
        reply = chat_stream(chat_chunk({"role": "assistant", "content": "Hel"}), done=False)
    else:
        reply = responses_stream(*message_item("msg_1", "Hel").events[:3])
    return replace(reply, stalls=True)


@BOTH_APIS
async def test_a_stalled_stream_times_out(
    fake: FakeOpenAI, client: AsyncOpenAI, adapter: Adapter
) -> None:
    fake.script.append(stalled(adapter))
    model = adapter("m", client=client.with_options(timeout=0.3), api_model="m-fake")

    parts, error = await collect_until_error(model, FIRST_TURN)

    assert parts == [TextPart("Hel")]
    assert error.kind == "timeout"
    assert str(error) == (
        f"OpenAI timed out: no answer from {fake.base_url}/"
        f"{'chat/completions' if adapter is OpenAIChatModel else 'responses'} in time; "
        "try again later or give the client a longer timeout"
    )


@BOTH_APIS
async def test_closing_early_closes_the_stream(
    fake: FakeOpenAI, client: AsyncOpenAI, adapter: Adapter
) -> None:
    fake.script.append(stalled(adapter))
    model = adapter("m", client=client, api_model="m-fake")

    with anyio.fail_after(10):
        async with aclosing(model.stream(FIRST_TURN)) as parts:
            assert await anext(parts) == TextPart("Hel")

    assert await anyio.to_thread.run_sync(fake.disconnected.wait, 10)


@BOTH_APIS
async def test_an_unreachable_server_is_a_connection_error(adapter: Adapter) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    async with AsyncOpenAI(base_url=url, api_key="test-key", max_retries=0, timeout=5) as client:
        parts, error = await collect_until_error(
            adapter("m", client=client, api_model="m-fake"), FIRST_TURN
        )

    assert parts == []
    assert error.kind == "connection"
    assert str(error).startswith(f"OpenAI connection failed: could not reach {url}/")
    assert str(error).endswith("; check the base URL and the network")


# Whole agent runs through our server


def unpooled_client(fake: FakeOpenAI) -> AsyncOpenAI:
    """A client for a model run by our server: it is used on the server's event loop, where
    the test cannot close it, so it keeps no connection open between requests."""
    http = DefaultAsyncHttpx2Client(limits=httpx2.Limits(max_keepalive_connections=0))
    return AsyncOpenAI(
        base_url=fake.base_url, api_key="test-key", max_retries=0, timeout=5, http_client=http
    )


def run_frames(
    fake: FakeOpenAI, tmp_path: Path, model: AnyModel
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run an agent on ``model`` through our server: its native frames, and the stored run."""
    agent = AgentSpec(id="calc", model=model.name, tools=["calculator"], reasoning=True)
    with serve(make_settings(tmp_path), models=[model], agents=[agent]) as live:
        _, frames = stream_frames(live, "calc", {"message": "What is 17 * 23?"})
        with live.client() as http:
            run = http.get(f"/api/agents/runs/{frames[0]['run_id']}").json()
    return frames, run


def tool_run_frames(
    start: dict[str, Any], reasoning: str, answer: list[str], summary: str | None = None
) -> list[dict[str, Any]]:
    """The native frames of a run that reasons, calls the calculator, then answers."""
    ids = {"run_id": start["run_id"], "session_id": start["session_id"]}
    return [
        {"event": "start", **ids},
        {"event": "step_started", "step": 1},
        {"event": "reasoning_delta", "delta": reasoning},
        {"event": "reasoning", "text": reasoning},
        {
            "event": "tool_call",
            "tool_call_id": "call_1",
            "tool_name": "calculator",
            "arguments": {"expression": "17 * 23"},
        },
        {
            "event": "tool_result",
            "tool_call_id": "call_1",
            "tool_name": "calculator",
            "result": 391,
            "status": "success",
        },
        *([{"event": "reasoning_summary", "summary": summary}] if summary else []),
        {"event": "step_completed", "step": 1},
        {"event": "step_started", "step": 2},
        *({"event": "content_delta", "delta": piece} for piece in answer),
        {"event": "step_completed", "step": 2},
        {
            "event": "complete",
            "run_id": start["run_id"],
            "content": "".join(answer),
            "usage": {
                "input_tokens": 100,
                "output_tokens": 25,
                "total_tokens": 125,
                "cost_usd": None,
            },
        },
    ]


def test_chat_agent_run_with_a_compatible_server(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script += [
        chat_stream(
            chat_chunk({"role": "assistant", "content": "", "reasoning_content": "Use the tool."}),
            *calculator_call_chunks(),
        ),
        chat_text("17 × 23 = ", "391.", usage=(60, 7)),
    ]
    model = OpenAIChatModel(
        "qwen-local", client=unpooled_client(fake), api_model="qwen3", provider="vLLM"
    )

    frames, run = run_frames(fake, tmp_path, model)

    assert frames == tool_run_frames(frames[0], "Use the tool.", ["17 × 23 = ", "391."])
    assert run["status"] == "completed"
    assert fake.bodies[1]["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "17 * 23"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "391"},
    ]


def test_responses_agent_run_replays_reasoning(fake: FakeOpenAI, tmp_path: Path) -> None:
    reasoning = reasoning_item("rs_1", ["Use the tool."], encrypted="gAAAA-1")
    call = function_call_item("fc_1", "call_1", "calculator", *ARGUMENT_PIECES)
    fake.script += [
        responses_reply(reasoning, call, usage=(40, 18, 10)),
        responses_reply(message_item("msg_2", "17 × 23 = ", "391."), usage=(60, 7, 0)),
    ]
    model = OpenAIResponsesModel("o-test", client=unpooled_client(fake), api_model="o-fake")

    frames, run = run_frames(fake, tmp_path, model)

    assert frames == tool_run_frames(
        frames[0], "Use the tool.", ["17 × 23 = ", "391."], summary="Use the tool."
    )
    assert run["status"] == "completed"
    assert fake.bodies[1]["input"][2:] == [
        reasoning.item,
        call.item,
        {"type": "function_call_output", "call_id": "call_1", "output": "391"},
    ]


def test_a_provider_error_ends_the_run_with_an_error_frame(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script.append(
        http_error(
            429,
            "Rate limit reached for requests per min (RPM): Limit 3, Used 3.",
            type="requests",
            code="rate_limit_exceeded",
            headers={"retry-after": "20"},
        )
    )
    model = OpenAIChatModel("gpt-test", client=unpooled_client(fake), api_model="gpt-fake")

    frames, run = run_frames(fake, tmp_path, model)

    message = (
        "OpenAI rate limit (429): Rate limit reached for requests per min (RPM): Limit 3, "
        "Used 3.; retry after 20s"
    )
    assert frames[-1] == {"event": "error", "message": message, "status": "error"}
    assert run["status"] == "error"
