"""The OpenAI-compatible endpoints, driven by the official ``openai`` client: agents as
models, chat completions streamed and not, responses streamed, in the background,
followed from after an event, continued and cancelled; errors as the client's exceptions.
Every streamed Responses event is checked against the client's own types."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel

from agentstream.agents import AgentSpec
from agentstream.providers.base import ModelPart, ModelRequest, TextPart, TurnEndPart
from agentstream.providers.scripted import ScriptedModel
from conftest import LiveServer, make_settings, read_events, rows, serve, wait_for_status
from test_run_lifecycle import TALKER

EVENT_TYPES: dict[str, type[BaseModel]] = {
    get_args(kind.model_fields["type"].annotation)[0]: kind
    for kind in get_args(get_args(ResponseStreamEvent)[0])
}
"""The client's class of each Responses event, by its ``type``."""


def checked(frame: dict[str, Any]) -> Any:
    """A Responses event as the client's types define it: a missing or mistyped field
    fails."""
    kind = EVENT_TYPES[frame["type"]]
    return kind.model_validate(frame)


def broken(request: ModelRequest) -> list[ModelPart]:
    raise ConnectionError("the model is down")


def echo(request: ModelRequest) -> list[ModelPart]:
    """What the model was given, as its answer."""
    seen = " | ".join(f"{m.role}: {m.content}" for m in request.messages)
    return [TextPart(seen), TurnEndPart("end_turn")]


COUNTED = [f" word{i}" for i in range(300)]


def counter(request: ModelRequest) -> list[ModelPart]:
    """An answer that takes a while (``COUNTED`` at 200 a second)."""
    return [*(TextPart(word) for word in COUNTED), TurnEndPart("end_turn")]


AGENTS = [
    AgentSpec(id="guarded", tools=["calculator"], approval_required=["calculator"]),
    AgentSpec(id="broken", model="broken"),
    AgentSpec(id="echo", model="echo", instructions="Echo."),
    AgentSpec(id="counter", model="counter"),
    AgentSpec(id="talker", model="talker"),
]
MODELS = [
    ScriptedModel("broken", broken),
    ScriptedModel("echo", echo),
    ScriptedModel("counter", counter, delay=0.005),
    TALKER,
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = make_settings(tmp_path_factory.mktemp("openai"))
    with serve(settings, agents=AGENTS, models=MODELS) as live:
        yield live


@pytest.fixture
def client(live: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key=live.key, max_retries=0) as client:
        yield client


def native_run(live: LiveServer, run_id: str) -> dict[str, Any]:
    with live.client() as http:
        run: dict[str, Any] = http.get(f"/api/agents/runs/{run_id}").json()
    return run


PREAMBLE = "Let me use the calculator tool."
"""What the offline model says before it calls the calculator: shown live, never stored."""


def test_agents_are_the_models(client: openai.OpenAI) -> None:
    ids = [model.id for model in client.models.list()]
    assert {"demo", "guarded", "broken"} <= set(ids)
    assert client.models.retrieve("demo").owned_by == "agentstream"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("nobody")
    assert caught.value.body == {
        "message": "The model 'nobody' does not exist: it is no agent's id",
        "type": "invalid_request_error",
        "param": "model",
        "code": "not_found",
    }


def test_a_chat_completion_is_the_run_s_answer(live: LiveServer, client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "What is 17 * 23?"}]
    )
    run = native_run(live, "run_" + completion.id.removeprefix("chatcmpl-"))
    assert completion.object == "chat.completion"
    assert completion.model == "demo"
    choice = completion.choices[0]
    assert (choice.finish_reason, choice.message.role) == ("stop", "assistant")
    assert choice.message.content == run["content"]
    assert "391" in run["content"]
    assert choice.message.model_extra == {"reasoning_content": run["reasoning"]}
    assert completion.usage is not None
    assert completion.usage.completion_tokens == run["usage"]["output_tokens"]
    assert completion.usage.total_tokens == (
        run["usage"]["input_tokens"] + run["usage"]["output_tokens"]
    )


def test_a_streamed_chat_completion_shows_the_run_live(
    live: LiveServer, client: openai.OpenAI
) -> None:
    chunks = list(
        client.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "What is 17 * 23?"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    run = native_run(live, "run_" + chunks[0].id.removeprefix("chatcmpl-"))
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = "".join(d.content or "" for d in deltas)
    reasoning = "".join((d.model_extra or {}).get("reasoning_content", "") for d in deltas)
    assert content == f"{PREAMBLE}\n\n{run['content']}"
    assert content.endswith(run["content"])
    assert reasoning.replace("\n\n", "") == run["reasoning"].replace("\n\n", "")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes == [None] * (len(finishes) - 1) + ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == run["usage"]["output_tokens"]
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_the_conversation_so_far_is_the_client_s(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="echo",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": "Hi!"},
            {"role": "developer", "content": "Count."},
            {"role": "user", "content": [{"type": "text", "text": "Write 3 words"}]},
        ],
    )
    assert completion.choices[0].message.content == (
        "system: Echo. | system: Be brief. | user: Hello there | assistant: Hi! | "
        "system: Count. | user: Write 3 words"
    )


def test_a_failed_run_is_the_client_s_error(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="broken", messages=messages)
    assert failed.value.status_code == 500
    assert failed.value.code == "error"
    assert "Internal error" in failed.value.message
    stream = client.chat.completions.create(model="broken", messages=messages, stream=True)
    with pytest.raises(openai.APIError) as streamed:
        list(stream)
    assert streamed.value.code == "error"
    assert "SECRET" not in str(streamed.value.body)


def test_a_call_waiting_for_approval_says_where_to_decide(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "What is 6 * 7?"}]
    with pytest.raises(openai.ConflictError) as waiting:
        client.chat.completions.create(model="guarded", messages=messages)
    assert waiting.value.code == "approval_required"
    assert "/approve" in waiting.value.message
    with pytest.raises(openai.APIError) as streamed:
        list(client.chat.completions.create(model="guarded", messages=messages, stream=True))
    assert streamed.value.code == "approval_required"


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        ({"model": "demo", "messages": []}, "messages"),
        ({"model": "demo", "messages": [{"role": "assistant", "content": "hi"}]}, "messages"),
        ({"model": "demo", "messages": [{"role": "tool", "content": "4"}]}, "messages.0.role"),
        (
            {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "tools": []},
            "tools",
        ),
    ],
)
def test_bad_requests_name_the_parameter(
    client: openai.OpenAI, request_: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.chat.completions.create(**request_)
    assert error_body(refused.value)["param"] == param
    assert error_body(refused.value)["type"] == "invalid_request_error"


def test_a_wrong_key_is_an_authentication_error(live: LiveServer) -> None:
    with (
        openai.OpenAI(base_url=f"{live.url}/v1", api_key="wrong", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.models.list()


def events_of(stream: Any) -> list[Any]:
    """A stream's events, read whole (as ``Any``: the client types them as a union)."""
    return list(stream)


def error_body(error: openai.APIStatusError) -> dict[str, Any]:
    body: dict[str, Any] = error.body  # type: ignore[assignment]
    return body


def well_formed(events: list[Any]) -> None:
    """Numbered in increasing order, created first, one terminal event last, and every
    item and part that was added is done."""
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    terminal = [e for e in events if e.type in ("response.completed", "response.failed")]
    assert terminal == [events[-1]]
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    done = [e.item.id for e in events if e.type == "response.output_item.done"]
    assert sorted(added) == sorted(done)


def typed(live: LiveServer, method: str, path: str, **kwargs: Any) -> list[Any]:
    """The events of a Responses stream read by hand, each checked against the client's
    types (the client itself builds them unchecked)."""
    with live.client() as http, http.stream(method, path, **kwargs) as response:
        assert response.status_code == 200
        return [checked(event.json()) for event in read_events(response)]


def test_a_streamed_response_shows_reasoning_tools_and_text(
    live: LiveServer, client: openai.OpenAI
) -> None:
    events = events_of(client.responses.create(model="demo", input="What is 17 * 23?", stream=True))
    well_formed(events)
    response = events[-1].response
    run = native_run(live, response.id)
    assert (response.status, run["status"]) == ("completed", "completed")
    kinds = [item.type for item in response.output]
    assert kinds.count("mcp_call") == len(run["tool_calls"]) >= 1
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert [(c.name, c.status) for c in calls] == [("calculator", "completed")] * len(calls)
    messages = [item for item in response.output if item.type == "message"]
    assert [m.phase for m in messages] == ["commentary", "final_answer"]
    assert messages[-1].content[0].text == run["content"]
    reasoning = "".join(
        e.delta for e in events if e.type == "response.reasoning_summary_text.delta"
    )
    assert reasoning.replace("\n\n", "") == run["reasoning"].replace("\n\n", "")
    assert response.usage is not None
    assert response.usage.output_tokens == run["usage"]["output_tokens"]
    # The same events, read back once the run is over, pass the client's own types.
    replayed = typed(live, "GET", f"/v1/responses/{response.id}?stream=true")
    well_formed(replayed)
    assert replayed[-1].response.output[-1] == response.output[-1]


def test_every_streamed_event_is_one_the_client_knows(live: LiveServer) -> None:
    for agent in ("demo", "broken", "guarded"):
        body = {"model": agent, "input": "What is 17 * 23?", "stream": True}
        events = typed(live, "POST", "/v1/responses", json=body)
        assert events[0].type == "response.created"


def test_a_response_without_stream_is_the_whole_response(
    live: LiveServer, client: openai.OpenAI
) -> None:
    response = client.responses.create(model="demo", input="Write 5 words")
    assert response.status == "completed"
    assert response.output_text == native_run(live, response.id)["content"]
    assert client.responses.retrieve(response.id).output_text == response.output_text


def test_a_background_response_is_followed_from_after_an_event(client: openai.OpenAI) -> None:
    started = client.responses.create(model="counter", input="count", background=True)
    assert (started.status, started.background) == ("in_progress", True)
    seen: list[Any] = []
    with client.responses.retrieve(started.id, stream=True) as stream:
        for event in stream:
            seen.append(event)
            if len(seen) == 40:
                break
    rest = events_of(
        client.responses.retrieve(started.id, stream=True, starting_after=seen[-1].sequence_number)
    )
    assert rest[0].sequence_number > seen[-1].sequence_number
    events = seen + rest
    well_formed(events)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == "".join(COUNTED)


def test_a_background_response_can_be_cancelled(live: LiveServer, client: openai.OpenAI) -> None:
    started = client.responses.create(model="talker", input="talk", background=True)
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    assert wait_for_status(live, started.id)["status"] == "cancelled"
    with pytest.raises(openai.ConflictError):
        client.responses.cancel(started.id)


def test_previous_response_id_continues_the_conversation(
    live: LiveServer, client: openai.OpenAI
) -> None:
    first = client.responses.create(model="demo", input="Hello there")
    second = client.responses.create(
        model="demo", input="Write 3 words", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    assert native_run(live, second.id)["session_id"] == native_run(live, first.id)["session_id"]
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="demo", input="hi", previous_response_id="run_nope")
    assert error_body(unknown.value)["param"] == "previous_response_id"


def test_a_failed_response_says_so(client: openai.OpenAI) -> None:
    events = events_of(client.responses.create(model="broken", input="hi", stream=True))
    well_formed(events)
    assert events[-1].type == "response.failed"
    assert events[-1].response.status == "failed"
    assert events[-1].response.error.code == "server_error"


def test_a_call_waiting_for_approval_is_an_approval_request(
    live: LiveServer, client: openai.OpenAI
) -> None:
    paused = events_of(
        client.responses.create(model="guarded", input="What is 6 * 7?", stream=True)
    )
    request = paused[-1].item
    assert (paused[-1].type, request.type) == ("response.output_item.done", "mcp_approval_request")
    assert (request.name, request.arguments) == ("calculator", '{"expression": "6 * 7"}')
    response_id = paused[0].response.id
    assert client.responses.retrieve(response_id).status == "in_progress"

    call_id = request.id.removeprefix("mcpr_")
    with live.client() as http:
        approved = http.post(
            f"/api/agents/runs/{response_id}/approve", json={"tool_call_id": call_id}
        )
    assert approved.status_code == 200
    rest = events_of(
        client.responses.retrieve(
            response_id, stream=True, starting_after=paused[-1].sequence_number
        )
    )
    well_formed(paused + rest)
    assert rest[-1].response.status == "completed"
    assert "42" in rest[-1].response.output_text


APP = "http://app.example.com:5173"


def preflight(live: LiveServer, origin: str) -> Any:
    with live.client() as http:
        return http.options(
            "/v1/chat/completions",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )


def test_browsers_may_call_from_the_origins_configured(tmp_path: Path) -> None:
    with serve(make_settings(tmp_path, cors_origins=[APP])) as cors:
        allowed = preflight(cors, APP)
        other = preflight(cors, "https://evil.example")
        with cors.client() as http:
            answer = http.post(
                "/v1/chat/completions",
                headers={"Origin": APP},
                json={"model": "demo", "messages": [{"role": "user", "content": "Hi"}]},
            )
            streamed = http.post(
                "/v1/chat/completions",
                headers={"Origin": APP},
                json={
                    "model": "demo",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "stream": True,
                },
            )
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == APP
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-origin" not in other.headers
    assert answer.headers["access-control-allow-origin"] == APP
    assert "X-Run-Id" in answer.headers["access-control-expose-headers"]
    assert streamed.headers["access-control-allow-origin"] == APP, "a stream's start too"
    assert streamed.content.endswith(b"data: [DONE]\n\n")


def test_no_origin_is_allowed_by_default(live: LiveServer) -> None:
    refused = preflight(live, APP)
    assert "access-control-allow-origin" not in refused.headers


def runs_of(live: LiveServer, agent: str) -> int:
    return int(rows(live, "select count(*) from runs where agent_id = :agent", agent=agent)[0][0])


def test_the_client_does_not_run_a_failed_or_paused_agent_again(live: LiveServer) -> None:
    """The client retries a 409 or 5xx by default: the answer of a run that ran says not to."""
    messages: Any = [{"role": "user", "content": "What is 6 * 7?"}]
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key=live.key) as retrying:
        for agent, error in (
            ("broken", openai.InternalServerError),
            ("guarded", openai.ConflictError),
        ):
            before = runs_of(live, agent)
            with pytest.raises(error):
                retrying.chat.completions.create(model=agent, messages=messages)
            assert runs_of(live, agent) == before + 1


def test_a_continued_response_remembers_the_turns_the_client_sent(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="echo",
        input=[
            {"role": "user", "content": "A"},
            {"role": "assistant", "content": "B"},
            {"role": "user", "content": "C"},
        ],
        instructions="Be brief.",
    )
    second = client.responses.create(
        model="echo", input="D", previous_response_id=first.id, instructions="Count."
    )
    assert (
        first.output_text == "system: Echo. | system: Be brief. | user: A | assistant: B | user: C"
    )
    # The earlier turns are the session's now; the first response's instructions were its own.
    assert second.output_text == (
        f"system: Echo. | system: Count. | user: A | assistant: B | user: C | assistant: "
        f"{first.output_text} | user: D"
    )


def test_a_model_that_cannot_run_is_a_503(
    live: LiveServer, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with live.client() as http:
        http.post("/api/agents", json={"id": "keyless", "model": "gpt-4o-mini"})
    with pytest.raises(openai.InternalServerError) as unavailable:
        client.chat.completions.create(
            model="keyless", messages=[{"role": "user", "content": "hi"}]
        )
    assert unavailable.value.status_code == 503
    assert error_body(unavailable.value) == {
        "message": "Set OPENAI_API_KEY to use gpt-4o-mini (OpenAI)",
        "type": "server_error",
        "param": "model",
        "code": "model_unavailable",
    }
