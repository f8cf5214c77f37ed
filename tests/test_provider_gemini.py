"""The Gemini adapter against a fake Gemini API speaking the documented SSE format, through the
real google-genai SDK: exact parts per canned stream, what was sent, errors, and full agent runs.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from google import genai
from google.genai import types

from agentstream.agents import AgentSpec
from agentstream.errors import ProviderError, ProviderErrorKind
from agentstream.events import Usage
from agentstream.providers.base import (
    Message,
    ModelPart,
    ModelRequest,
    ProviderStatePart,
    ReasoningPart,
    RequestedToolCall,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
    UsagePart,
)
from agentstream.providers.gemini import GeminiModel
from conftest import CALCULATOR, free_port, make_settings, serve, stream_frames
from fakes.gemini import (
    FakeGemini,
    Reply,
    chunk,
    error_body,
    error_reply,
    function_call,
    run_fake,
    text,
    thought,
    usage,
)

API_MODEL = "gemini-2.5-flash"
SIGNATURE = base64.b64encode(bytes(range(7, 47))).decode()
"""A thought signature as the API sends it: opaque base64."""
SYSTEM = Message(role="system", content="You are terse.")
QUESTION = Message(role="user", content="What is 17 * 23?")


def gemini(url: str, *, backend: ModuleType = httpx2, timeout_ms: int = 5000) -> GeminiModel:
    """The adapter over a real SDK client pointed at ``url``, with retries off."""
    client = genai.Client(
        api_key="test-key",
        http_options=types.HttpOptions(
            base_url=url,
            api_version="v1beta",
            timeout=timeout_ms,
            retry_options=types.HttpRetryOptions(attempts=1),
            # Limits of the httpx or httpx2 kind pick the SDK's HTTP backend; no keep-alive,
            # so no socket outlives the event loop of the test that opened it.
            async_client_args={"limits": backend.Limits(max_keepalive_connections=0)},
        ),
    )
    return GeminiModel("gemini-test", client=client, api_model=API_MODEL, provider="Gemini")


def request(*messages: Message, reasoning: bool = False, **settings: Any) -> ModelRequest:
    return ModelRequest(
        messages=(SYSTEM, *messages), tools=[CALCULATOR], reasoning=reasoning, settings=settings
    )


async def _collect(model: GeminiModel, req: ModelRequest, parts: list[ModelPart]) -> None:
    with anyio.fail_after(10):
        async for part in model.stream(req):
            parts.append(part)


def turn(model: GeminiModel, req: ModelRequest) -> list[ModelPart]:
    parts: list[ModelPart] = []
    anyio.run(_collect, model, req, parts)
    return parts


def failed_turn(model: GeminiModel, req: ModelRequest) -> tuple[list[ModelPart], ProviderError]:
    """The parts streamed before the turn failed, and the failure."""
    parts: list[ModelPart] = []
    with pytest.raises(ProviderError) as failure:
        anyio.run(_collect, model, req, parts)
    return parts, failure.value


def sent_contents(fake: FakeGemini, index: int = -1) -> list[dict[str, Any]]:
    contents: list[dict[str, Any]] = fake.requests[index].body["contents"]
    return contents


USER_CONTENT = {"role": "user", "parts": [{"text": "What is 17 * 23?"}]}
TOOLS_SENT = [
    {
        "functionDeclarations": [
            {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression.",
                "parameters_json_schema": CALCULATOR.parameters,
            }
        ]
    }
]


def test_plain_answer_streams_text_then_usage_and_end_turn() -> None:
    reply = Reply(
        events=[
            chunk(text("17 × 23")),
            chunk(text(" is 391")),
            chunk(text("."), finish="STOP", usage_metadata=usage(21, 9)),
        ]
    )
    with run_fake(reply) as fake:
        parts = turn(gemini(fake.url), request(QUESTION, max_tokens=256, temperature=0.2))

    assert parts == [
        TextPart("17 × 23"),
        TextPart(" is 391"),
        TextPart("."),
        UsagePart(Usage(input_tokens=21, output_tokens=9)),
        TurnEndPart("end_turn"),
    ], "no provider state: nothing was signed"
    [received] = fake.requests
    assert received.model == API_MODEL
    assert received.body == {
        "contents": [USER_CONTENT],
        "systemInstruction": {"role": "user", "parts": [{"text": "You are terse."}]},
        "tools": TOOLS_SENT,
        "generationConfig": {"maxOutputTokens": 256, "temperature": 0.2},
    }, "no thinking config unless reasoning is asked for"


def test_thought_summary_then_text_with_its_signature_kept() -> None:
    reply = Reply(
        events=[
            chunk(thought("**Multiplying**\n\nThe user wants 17 × 23. ")),
            chunk(thought("That is 340 + 51.")),
            chunk(text("It is 391.")),
            chunk(
                text("", signature=SIGNATURE),
                finish="STOP",
                usage_metadata=usage(21, 6, thoughts=57),
            ),
        ]
    )
    with run_fake(reply) as fake:
        parts = turn(gemini(fake.url), request(QUESTION, reasoning=True, thinking_budget=1024))

    assert parts == [
        ReasoningPart("**Multiplying**\n\nThe user wants 17 × 23. "),
        ReasoningPart("That is 340 + 51."),
        TextPart("It is 391."),
        UsagePart(Usage(input_tokens=21, output_tokens=63)),
        ProviderStatePart(
            {
                "gemini": {
                    "parts": [
                        {
                            "text": "**Multiplying**\n\nThe user wants 17 × 23. That is 340 + 51.",
                            "thought": True,
                        },
                        {"text": "It is 391."},
                        {"text": "", "thought_signature": SIGNATURE},
                    ]
                }
            }
        ),
        TurnEndPart("end_turn"),
    ], "thoughts count as output; unsigned text is joined, the signed part kept apart"
    assert fake.requests[0].body["generationConfig"] == {
        "thinkingConfig": {"include_thoughts": True, "thinking_budget": 1024}
    }


def test_signed_function_call_is_replayed_with_its_result() -> None:
    first = Reply(
        events=[
            chunk(thought("I should use the calculator.")),
            chunk(
                function_call("calculator", {"expression": "17 * 23"}, signature=SIGNATURE),
                finish="STOP",
                usage_metadata=usage(40, 12, thoughts=30),
            ),
        ]
    )
    second = Reply(
        events=[chunk(text("17 × 23 = 391."), finish="STOP", usage_metadata=usage(70, 8))]
    )
    with run_fake(first, second) as fake:
        model = gemini(fake.url)
        parts = turn(model, request(QUESTION, reasoning=True))
        call_id = "gemini-call-2-1"
        state = {
            "gemini": {
                "parts": [
                    {"text": "I should use the calculator.", "thought": True},
                    {
                        "function_call": {"name": "calculator", "args": {"expression": "17 * 23"}},
                        "thought_signature": SIGNATURE,
                    },
                ]
            }
        }
        assert parts == [
            ReasoningPart("I should use the calculator."),
            ToolCallStartPart(call_id, "calculator"),
            ToolCallArgsPart(call_id, '{"expression": "17 * 23"}'),
            ToolCallEndPart(call_id),
            UsagePart(Usage(input_tokens=40, output_tokens=42)),
            ProviderStatePart(state),
            TurnEndPart("tool_calls"),
        ], "the call came without an id: one is made up"

        call = RequestedToolCall(id=call_id, name="calculator", arguments={"expression": "17 * 23"})
        history = (
            QUESTION,
            Message(role="assistant", tool_calls=(call,), provider_state=state),
            Message(role="tool", content="391", tool_call_id=call_id),
        )
        answer = turn(model, request(*history, reasoning=True))

    assert answer[0] == TextPart("17 × 23 = 391.")
    assert sent_contents(fake) == [
        USER_CONTENT,
        {
            "role": "model",
            "parts": [
                {"text": "I should use the calculator.", "thought": True},
                {
                    "functionCall": {"name": "calculator", "args": {"expression": "17 * 23"}},
                    "thoughtSignature": SIGNATURE,
                },
            ],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "calculator", "response": {"result": 391}}}],
        },
    ], "the model turn exactly as returned; the made-up id is never sent"


def test_parallel_calls_keep_their_ids_and_results_go_back_together() -> None:
    reply = Reply(
        events=[
            chunk(
                function_call("calculator", {"expression": "2 + 2"}, call_id="fc_a1"),
                function_call("calculator", {"expression": "1 / 0"}, call_id="fc_b2"),
                finish="STOP",
                usage_metadata=usage(30, 20),
            )
        ]
    )
    answer = Reply(events=[chunk(text("4, and 1/0 fails."), finish="STOP")])
    with run_fake(reply, answer) as fake:
        model = gemini(fake.url)
        parts = turn(model, request(QUESTION))
        calls = (
            RequestedToolCall(id="fc_a1", name="calculator", arguments={"expression": "2 + 2"}),
            RequestedToolCall(id="fc_b2", name="calculator", arguments={"expression": "1 / 0"}),
        )
        history = (
            QUESTION,
            Message(role="assistant", tool_calls=calls),
            Message(role="tool", content="4", tool_call_id="fc_a1"),
            Message(role="tool", content='{"error": "division by zero"}', tool_call_id="fc_b2"),
        )
        end = turn(model, request(*history))

    assert parts == [
        ToolCallStartPart("fc_a1", "calculator"),
        ToolCallArgsPart("fc_a1", '{"expression": "2 + 2"}'),
        ToolCallEndPart("fc_a1"),
        ToolCallStartPart("fc_b2", "calculator"),
        ToolCallArgsPart("fc_b2", '{"expression": "1 / 0"}'),
        ToolCallEndPart("fc_b2"),
        UsagePart(Usage(input_tokens=30, output_tokens=20)),
        TurnEndPart("tool_calls"),
    ]
    assert end[-2:] == [UsagePart(Usage()), TurnEndPart("end_turn")], "no usage reported: 0"
    assert sent_contents(fake)[1:] == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {
                        "id": "fc_a1",
                        "name": "calculator",
                        "args": {"expression": "2 + 2"},
                    }
                },
                {
                    "functionCall": {
                        "id": "fc_b2",
                        "name": "calculator",
                        "args": {"expression": "1 / 0"},
                    }
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "fc_a1",
                        "name": "calculator",
                        "response": {"result": 4},
                    }
                },
                {
                    "functionResponse": {
                        "id": "fc_b2",
                        "name": "calculator",
                        "response": {"error": "division by zero"},
                    }
                },
            ],
        },
    ], "without provider state the turn is rebuilt from the message"


def test_history_from_another_model_is_rebuilt() -> None:
    """A session that ran on another provider: text and calls, no Gemini state."""
    call = RequestedToolCall(id="call_x", name="calculator", arguments={"expression": "6 * 7"})
    history = (
        Message(role="user", content="Hi"),
        Message(role="assistant", content="Hello!", provider_state={"anthropic": {"x": 1}}),
        Message(role="user", content="6 * 7?"),
        Message(role="assistant", tool_calls=(call,)),
        Message(role="tool", content='"forty-two"', tool_call_id="call_x"),
    )
    with run_fake(Reply(events=[chunk(text("42."), finish="STOP")])) as fake:
        turn(gemini(fake.url), request(*history))

    assert sent_contents(fake) == [
        {"role": "user", "parts": [{"text": "Hi"}]},
        {"role": "model", "parts": [{"text": "Hello!"}]},
        {"role": "user", "parts": [{"text": "6 * 7?"}]},
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {
                        "id": "call_x",
                        "name": "calculator",
                        "args": {"expression": "6 * 7"},
                    }
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "call_x",
                        "name": "calculator",
                        "response": {"result": "forty-two"},
                    }
                }
            ],
        },
    ]


def test_max_tokens_ends_the_turn_as_such() -> None:
    reply = Reply(
        events=[chunk(text("17 × 23 is"), finish="MAX_TOKENS", usage_metadata=usage(5, 4))]
    )
    with run_fake(reply) as fake:
        parts = turn(gemini(fake.url), request(QUESTION, max_tokens=4))

    assert parts[-1] == TurnEndPart("max_tokens")


@pytest.mark.parametrize(
    ("reply", "kind", "words"),
    [
        pytest.param(
            error_reply(401, "UNAUTHENTICATED", "API key not valid. Please pass a valid API key."),
            "auth",
            "refused the credentials (401 UNAUTHENTICATED): API key not valid",
            id="401",
        ),
        pytest.param(
            error_reply(403, "PERMISSION_DENIED", "Permission denied on resource project."),
            "auth",
            "(403 PERMISSION_DENIED)",
            id="403",
        ),
        pytest.param(
            error_reply(
                429,
                "RESOURCE_EXHAUSTED",
                "You exceeded your current quota.",
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"},
                headers={"retry-after": "37"},
            ),
            "rate_limit",
            "Gemini rate limit (429 RESOURCE_EXHAUSTED): You exceeded your current quota; "
            "retry in 37s or lower the request rate",
            id="429",
        ),
        pytest.param(
            error_reply(
                400,
                "INVALID_ARGUMENT",
                "The input token count (1203411) exceeds the maximum number of tokens allowed "
                "(1048576).",
            ),
            "context_length",
            "shorten the conversation",
            id="400-context",
        ),
        pytest.param(
            error_reply(400, "INVALID_ARGUMENT", "Invalid value at 'generation_config.top_k'."),
            "bad_request",
            "rejected the request (400 INVALID_ARGUMENT)",
            id="400",
        ),
        pytest.param(
            error_reply(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
            "overloaded",
            "Gemini is overloaded (503 UNAVAILABLE)",
            id="503",
        ),
        pytest.param(
            error_reply(500, "INTERNAL", "An internal error has occurred."),
            "server",
            "server error (500 INTERNAL)",
            id="500",
        ),
    ],
)
def test_http_errors_become_provider_errors(
    reply: Reply, kind: ProviderErrorKind, words: str
) -> None:
    with run_fake(reply) as fake:
        parts, error = failed_turn(gemini(fake.url), request(QUESTION))

    assert parts == []
    assert (error.kind, error.status_code, error.provider) == (kind, reply.status, "Gemini")
    assert words in str(error)
    assert error.body == reply.error
    assert error.headers.get("retry-after") == reply.headers.get("retry-after")
    assert len(fake.requests) == 1, "retries are the SDK's business, and off here"


@pytest.mark.parametrize(
    ("reply", "kind", "words"),
    [
        pytest.param(
            Reply(events=[chunk(text("17 × 23")), error_body(503, "UNAVAILABLE", "Overloaded.")]),
            "overloaded",
            "Gemini is overloaded (503 UNAVAILABLE): Overloaded; try again later",
            id="error-event",
        ),
        pytest.param(
            Reply(events=[chunk(text("17 × 23"))]),
            "bad_response",
            "Gemini ended the stream before its last chunk (no finish reason); try again",
            id="no-finish-reason",
        ),
        pytest.param(
            Reply(events=[chunk(text("17 × 23"))], ending="cut"),
            "bad_response",
            "The connection to Gemini broke mid-stream (peer closed connection",
            id="cut",
        ),
        pytest.param(
            Reply(events=[chunk(text("17 × 23")), '{"candidates": [{"content": {"parts": [{"te']),
            "bad_response",
            "Gemini sent a chunk that is not a valid response (Failed to parse response as JSON",
            id="malformed-json",
        ),
        pytest.param(
            Reply(
                events=[
                    chunk(text("17 × 23")),
                    chunk({"functionCall": {"name": "calculator", "args": "17*23"}}),
                ]
            ),
            "bad_response",
            "Gemini sent a chunk that is not a valid response (1 validation error",
            id="args-not-an-object",
        ),
        pytest.param(
            Reply(events=[chunk(text("17 × 23")), chunk(finish="SAFETY")]),
            "bad_response",
            "Gemini stopped the answer early (SAFETY): its safety filters blocked the answer; "
            "rephrase the request",
            id="safety",
        ),
        pytest.param(
            Reply(events=[chunk(text("17 × 23")), chunk(finish="RECITATION")]),
            "bad_response",
            "Gemini stopped the answer early (RECITATION): the answer would have recited "
            "copyrighted material",
            id="recitation",
        ),
    ],
)
def test_broken_streams_fail_after_what_was_streamed(
    reply: Reply, kind: ProviderErrorKind, words: str
) -> None:
    with run_fake(reply) as fake:
        parts, error = failed_turn(gemini(fake.url), request(QUESTION))

    assert parts == [TextPart("17 × 23")]
    assert error.kind == kind
    assert words in str(error)


@pytest.mark.parametrize("backend", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_transport_failures_on_either_http_backend(backend: ModuleType) -> None:
    cut = Reply(events=[chunk(text("17 × 23"))], ending="cut")
    stalled = Reply(events=[chunk(text("17 × 23"))], ending="hold")
    with run_fake(cut, stalled) as fake:
        _, broken = failed_turn(gemini(fake.url, backend=backend), request(QUESTION))
        _, slow = failed_turn(gemini(fake.url, backend=backend, timeout_ms=300), request(QUESTION))
        assert fake.disconnected.wait(5), "the timed-out request was hung up"

    assert broken.kind == "bad_response"
    assert (slow.kind, str(slow)) == ("timeout", "Gemini timed out (ReadTimeout); try again later")


def test_unreachable_server_is_a_connection_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    _, error = failed_turn(gemini(url), request(QUESTION))

    assert error.kind == "connection"
    assert str(error).startswith("Could not reach Gemini: ")


def test_blocked_prompt_is_a_bad_request() -> None:
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": usage(9, 0)}
    with run_fake(Reply(events=[blocked])) as fake:
        parts, error = failed_turn(gemini(fake.url), request(QUESTION))

    assert parts == []
    assert (error.kind, str(error)) == (
        "bad_request",
        "Gemini blocked the prompt (SAFETY); rephrase the request",
    )


def test_invalid_settings_fail_before_any_request() -> None:
    with run_fake() as fake:
        _, error = failed_turn(gemini(fake.url), request(QUESTION, max_tokens="lots"))

    assert error.kind == "bad_request"
    assert "fix the agent's model_settings" in str(error)
    assert fake.requests == []


def test_closing_the_turn_early_hangs_up() -> None:
    reply = Reply(events=[chunk(text("17 × 23"))], ending="hold")

    async def first_part(model: GeminiModel) -> ModelPart:
        with anyio.fail_after(10):
            parts = model.stream(request(QUESTION))
            try:
                return await anext(parts)
            finally:
                await parts.aclose()

    with run_fake(reply) as fake:
        assert anyio.run(first_part, gemini(fake.url)) == TextPart("17 × 23")
        assert fake.disconnected.wait(5), "closing the parts closed the HTTP stream"


def collapse(frames: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive deltas of one kind joined, to compare whole streams."""
    out: list[dict[str, Any]] = []
    for frame in frames:
        kind = frame["event"]
        if kind.endswith("_delta") and out and out[-1]["event"] == kind:
            out[-1] = {"event": kind, "delta": out[-1]["delta"] + frame["delta"]}
        else:
            out.append(frame)
    return out


def test_agent_run_with_thinking_and_the_real_calculator(tmp_path: Path) -> None:
    calling = Reply(
        events=[
            chunk(thought("Multiply exactly: ")),
            chunk(thought("use the calculator.")),
            chunk(
                function_call("calculator", {"expression": "17 * 23"}, signature=SIGNATURE),
                finish="STOP",
                usage_metadata=usage(50, 10, thoughts=20),
            ),
        ]
    )
    answering = Reply(
        events=[
            chunk(thought("The tool said 391.")),
            chunk(text("17 × 23 = ")),
            chunk(text("391."), finish="STOP", usage_metadata=usage(90, 7, thoughts=5)),
        ]
    )
    agent = AgentSpec(id="gem", model="gemini-test", tools=["calculator"], reasoning=True)
    with run_fake(calling, answering) as fake:
        model = gemini(fake.url)
        with serve(make_settings(tmp_path), models=[model], agents=[agent]) as live:
            _, frames = stream_frames(live, "gem", {"message": "What is 17 * 23?"})

    run_id, session_id = frames[0]["run_id"], frames[0]["session_id"]
    call_id = "gemini-call-2-1"
    assert collapse(frames) == [
        {"event": "start", "run_id": run_id, "session_id": session_id},
        {"event": "step_started", "step": 1},
        {"event": "reasoning_delta", "delta": "Multiply exactly: use the calculator."},
        {"event": "reasoning", "text": "Multiply exactly: use the calculator."},
        {
            "event": "tool_call",
            "tool_call_id": call_id,
            "tool_name": "calculator",
            "arguments": {"expression": "17 * 23"},
        },
        {
            "event": "tool_result",
            "tool_call_id": call_id,
            "tool_name": "calculator",
            "result": 391,
            "status": "success",
        },
        {"event": "step_completed", "step": 1},
        {"event": "step_started", "step": 2},
        {"event": "reasoning_delta", "delta": "The tool said 391."},
        {"event": "reasoning", "text": "The tool said 391."},
        {"event": "content_delta", "delta": "17 × 23 = 391."},
        {"event": "step_completed", "step": 2},
        {
            "event": "complete",
            "run_id": run_id,
            "content": "17 × 23 = 391.",
            "usage": {
                "input_tokens": 140,
                "output_tokens": 42,
                "total_tokens": 182,
                "cost_usd": None,
            },
        },
    ]
    assert fake.requests[1].body["generationConfig"] == {
        "thinkingConfig": {"include_thoughts": True}
    }
    assert sent_contents(fake)[1:] == [
        {
            "role": "model",
            "parts": [
                {"text": "Multiply exactly: use the calculator.", "thought": True},
                {
                    "functionCall": {"name": "calculator", "args": {"expression": "17 * 23"}},
                    "thoughtSignature": SIGNATURE,
                },
            ],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "calculator", "response": {"result": 391}}}],
        },
    ]


def test_agent_run_fails_with_the_providers_message(tmp_path: Path) -> None:
    limited = error_reply(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota.")
    agent = AgentSpec(id="gem", model="gemini-test")
    with run_fake(limited) as fake:
        model = gemini(fake.url)
        with serve(make_settings(tmp_path), models=[model], agents=[agent]) as live:
            _, frames = stream_frames(live, "gem", {"message": "Hello"})
            with live.client() as client:
                run = client.get(f"/api/agents/runs/{frames[0]['run_id']}").json()

    assert frames[-1] == {
        "event": "error",
        "message": "Gemini rate limit (429 RESOURCE_EXHAUSTED): You exceeded your current quota; "
        "retry later or lower the request rate",
        "status": "error",
    }
    assert run["status"] == "error"
