"""The native agent stream over real HTTP: frame order and shapes, replay, sessions."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentstream.agents import AgentSpec
from agentstream.providers.base import (
    Message,
    ModelPart,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
)
from agentstream.providers.scripted import ScriptedModel
from agentstream.store import Store
from agentstream.store.database import Database
from agentstream.views.native import NativeFrameAdapter
from conftest import (
    FORWARDED_ONLY,
    STORES,
    LiveServer,
    make_settings,
    on_its_own_loop,
    rows,
    serve,
    serve_on,
    stream_frames,
)


@pytest.fixture(params=STORES)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    """The same behaviour on both stores."""
    with serve_on(request, tmp_path) as live:
        yield live


def collapse(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Join runs of consecutive deltas of one kind into one frame, to compare whole streams."""
    out: list[dict[str, Any]] = []
    for kind, group in itertools.groupby(frames, key=lambda f: f["event"]):
        items = list(group)
        if kind in ("content_delta", "reasoning_delta"):
            out.append({"event": kind, "delta": "".join(f["delta"] for f in items)})
        else:
            out += items
    return out


def test_tool_run_streams_every_event_in_order(server: LiveServer) -> None:
    ids, frames = stream_frames(server, "demo", {"message": "What is 17 * 23? Think first."})

    assert ids[0] == 1
    assert ids == sorted(set(ids)), "every frame carries its seq, increasing"
    for seq, frame in zip(ids, frames, strict=True):
        model = type(NativeFrameAdapter.validate_python({"seq": seq, **frame}))
        assert {"seq", *frame} == set(model.model_fields), "exactly the documented keys"
    start, complete = frames[0], frames[-1]
    run_id, session_id = start["run_id"], start["session_id"]
    assert run_id.startswith("run_")
    assert session_id.startswith("ses_")
    assert collapse(frames) == [
        {"event": "start", "run_id": run_id, "session_id": session_id},
        {"event": "step_started", "step": 1},
        {
            "event": "reasoning_delta",
            "delta": "The user asks: 'What is 17 * 23? Think first.'. "
            'I should not guess, so I will call calculator with {"expression": "17 * 23"}.',
        },
        {
            "event": "reasoning",
            "text": "The user asks: 'What is 17 * 23? Think first.'. "
            'I should not guess, so I will call calculator with {"expression": "17 * 23"}.',
        },
        {"event": "content_delta", "delta": "Let me use the calculator tool."},
        {"event": "preamble", "step": 1, "text": "Let me use the calculator tool."},
        {
            "event": "tool_call",
            "tool_call_id": "call_2_1",
            "tool_name": "calculator",
            "arguments": {"expression": "17 * 23"},
        },
        {
            "event": "tool_result",
            "tool_call_id": "call_2_1",
            "tool_name": "calculator",
            "result": 391,
            "status": "success",
        },
        {"event": "reasoning_summary", "summary": "Chose to call calculator instead of guessing."},
        {"event": "step_completed", "step": 1},
        {"event": "step_started", "step": 2},
        {
            "event": "reasoning_delta",
            "delta": "I have the tool results now, so I can answer directly from them.",
        },
        {
            "event": "reasoning",
            "text": "I have the tool results now, so I can answer directly from them.",
        },
        {"event": "content_delta", "delta": "\n\nThe answer is 391."},
        {"event": "reasoning_summary", "summary": "Answered from the tool results."},
        {"event": "step_completed", "step": 2},
        {
            "event": "complete",
            "run_id": run_id,
            "content": "The answer is 391.",
            "usage": complete["usage"],
        },
    ]
    usage = complete["usage"]
    assert usage["input_tokens"] > 0
    assert usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["cost_usd"] == 0.0, "the offline model is free, and says so"
    deltas = [f for f in frames if f["event"] == "content_delta"]
    assert len(deltas) > 5, "text streams token by token, not in one piece"


def test_single_turn_generation_ends_with_chunk(server: LiveServer) -> None:
    _, frames = stream_frames(server, "demo", {"message": "Hello there", "reasoning": False})

    answer = "Hi! I'm the offline demo model, a rule-based stand-in for a real LLM."
    assert [f["event"] for f in collapse(frames)] == [
        "start",
        "step_started",
        "content_delta",
        "chunk",
        "step_completed",
        "complete",
    ]
    assert collapse(frames)[2]["delta"] == answer
    assert frames[-3] == {"event": "chunk", "content": answer}
    assert frames[-1]["content"] == answer


@pytest.mark.parametrize("field", ["reasoning", "reasoning_requested"])
def test_reasoning_appears_only_when_requested(server: LiveServer, field: str) -> None:
    """By our name or spec 002's (``reasoning_requested``)."""
    _, without = stream_frames(server, "demo", {"message": "What is 2+2?", field: False})
    _, with_ = stream_frames(server, "demo", {"message": "What is 2+2?", field: True})

    kinds = {f["event"] for f in without}
    assert "reasoning_delta" not in kinds
    assert "reasoning" not in kinds
    assert {"reasoning_delta", "reasoning"} <= {f["event"] for f in with_}


def test_stream_headers_defeat_proxy_buffering(server: LiveServer) -> None:
    with (
        server.client() as client,
        client.stream("POST", "/api/agents/demo/run/stream", json={"message": "hi"}) as response,
    ):
        response.read()
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    assert "content-encoding" not in response.headers


def test_replay_is_the_stream_without_deltas(server: LiveServer) -> None:
    ids, frames = stream_frames(server, "demo", {"message": "What is 6 × 7? And the time?"})
    run_id = frames[0]["run_id"]

    with server.client() as client:
        run = client.get(f"/api/agents/runs/{run_id}").json()

    streamed = [
        {"seq": seq, **frame}
        for seq, frame in zip(ids, frames, strict=True)
        if frame["event"] not in FORWARDED_ONLY
    ]
    assert run["events"] == streamed
    assert run["status"] == "completed"
    assert run["content"] == frames[-1]["content"]
    assert run["content"].startswith("The answer is 42. The current time is ")
    assert "Let me use" not in run["content"], "preamble is never persisted"
    assert run["reasoning"].startswith("The user asks:")
    assert [(c["name"], c["arguments"], c["status"]) for c in run["tool_calls"]] == [
        ("calculator", {"expression": "6 × 7"}, "success"),
        ("current_time", {"timezone": "UTC"}, "success"),
    ]
    assert run["tool_calls"][0]["result"] == 42
    assert run["usage"] == frames[-1]["usage"]
    assert run["input"] == "What is 6 × 7? And the time?"
    assert run["duration_ms"] >= 0
    assert run["finished_at"] >= run["created_at"]


def test_the_preamble_is_shown_live_and_never_persisted(server: LiveServer) -> None:
    """Joining the content_delta frames gives each step's text in turn, a later one after a
    blank line, and a preamble frame has the first step's whole; the record keeps the
    final-turn text only (spec 000: "intermediate preamble is never persisted")."""
    _, frames = stream_frames(server, "demo", {"message": "What is 6 × 7? And the time?"})
    with server.client() as client:
        run = client.get(f"/api/agents/runs/{frames[0]['run_id']}").json()

    live = "".join(f["delta"] for f in frames if f["event"] == "content_delta")
    preamble = "Let me use the calculator and the current_time tool."
    assert live.startswith(f"{preamble}\n\nThe answer is 42. The current time is ")
    assert [(f["step"], f["text"]) for f in frames if f["event"] == "preamble"] == [(1, preamble)]
    assert run["content"] == frames[-1]["content"] == live.removeprefix(f"{preamble}\n\n")
    assert "Let me use" not in json.dumps(run)


def test_session_continues_the_conversation(server: LiveServer) -> None:
    _, first = stream_frames(server, "demo", {"message": "What is 12 * 12?"})
    session_id = first[0]["session_id"]

    _, second = stream_frames(
        server, "demo", {"message": "What did I ask before?", "session_id": session_id}
    )
    _, fresh = stream_frames(server, "demo", {"message": "What did I ask before?"})

    assert second[0]["session_id"] == session_id
    assert second[-1]["content"] == "Earlier you asked: 'What is 12 * 12?'."
    assert fresh[-1]["content"] == "This is the start of our conversation."
    assert second[-1]["usage"]["input_tokens"] > fresh[-1]["usage"]["input_tokens"]


def test_unknown_session_is_refused(server: LiveServer) -> None:
    with server.client() as client:
        response = client.post(
            "/api/agents/demo/run/stream", json={"message": "hi", "session_id": "ses_nope"}
        )
    assert response.status_code == 404
    assert response.json()["error"]["field"] == "session_id"


def test_token_count_does_not_change_database_writes(tmp_path: Path) -> None:
    """Deltas never reach the database: 5 tokens or 2,000, the same rows are written."""
    with serve(make_settings(tmp_path)) as live:
        short = stream_frames(live, "demo", {"message": "Write 5 words", "reasoning": False})
        long = stream_frames(live, "demo", {"message": "Write 2000 words", "reasoning": False})
        written = dict(rows(live, "select run_id, count(*) from run_events group by run_id"))
    assert written[short[1][0]["run_id"]] == written[long[1][0]["run_id"]] == 5
    assert len(long[1]) > 2000


def test_a_run_is_recorded_with_its_first_steps_start_in_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run start is one write: the run, its ``start`` and its first ``step_started``. The
    agent loop does not write that step's start again; later steps write their own."""
    writes: list[list[str]] = []
    create_run, append_events = Store.create_run, Store.append_events

    async def created(store: Store, **fields: Any) -> None:
        writes.append(["run", *(type(event).__name__ for event in fields["first_events"])])
        await create_run(store, **fields)

    async def appended(store: Store, *events: Any) -> None:
        writes.append([type(event).__name__ for event in events])
        await append_events(store, *events)

    monkeypatch.setattr(Store, "create_run", created)
    monkeypatch.setattr(Store, "append_events", appended)
    with serve(make_settings(tmp_path)) as live:
        ids, frames = stream_frames(live, "demo", {"message": "What is 17 * 23?"})
        with live.client() as client:
            stored = client.get(f"/api/agents/runs/{frames[0]['run_id']}").json()["events"]
    assert writes[0] == ["run", "RunStarted", "StepStarted"]
    assert [write for write in writes if "StepStarted" in write] == [
        ["run", "RunStarted", "StepStarted"],
        ["StepStarted"],  # the second step's, after the calculator's
    ]
    assert ids == sorted(set(ids))
    started = [(e["seq"], e["step"]) for e in stored if e["event"] == "step_started"]
    assert [step for _, step in started] == [1, 2]
    assert started[0][0] == 2 < started[1][0]
    assert [f["step"] for f in frames if f["event"] == "step_started"] == [1, 2]


def test_a_run_start_reads_the_definitions_counter_once_and_uses_an_edit_at_once(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run start looks up its key and its agent on one read of the definitions' counter;
    an agent edited through the API, or by another connection to the database (another
    process, a command), is the next run's."""
    counted: list[str] = []
    read_value = Database.read_value

    async def counting(db: Database, sql: str) -> Any:
        counted.append(sql)
        return await read_value(db, sql)

    monkeypatch.setattr(Database, "read_value", counting)
    body = {"message": "Write 3 words", "reasoning": False}
    with server.client() as http:
        edited = http.patch("/api/agents/demo", json={"instructions": "Edited."})
        assert edited.status_code == 200, edited.text
        counted.clear()
        frames = stream_frames(server, "demo", body)[1]
        assert len(counted) == 1
        version = http.get(f"/api/agents/runs/{frames[0]['run_id']}").json()["agent_version"]
        assert version == edited.json()["version"]

        async def edit_elsewhere() -> int:
            store = await Store.open(server.settings.database)
            try:
                stored = await store.get_agent("demo")
                assert stored is not None
                spec = stored.spec.model_copy(update={"instructions": "Elsewhere."})
                return (await store.put_agent(spec)).version
            finally:
                await store.close()

        elsewhere = on_its_own_loop(edit_elsewhere)
        assert elsewhere == version + 1
        frames = stream_frames(server, "demo", body)[1]
        run = http.get(f"/api/agents/runs/{frames[0]['run_id']}").json()
        assert run["agent_version"] == elsewhere


def test_memory_holds_no_preamble(server: LiveServer) -> None:
    _, frames = stream_frames(server, "demo", {"message": "What is 8 * 8?"})

    async def memory() -> list[Message]:
        store = await Store.open(server.settings.database)
        try:
            return await store.history(frames[0]["session_id"])
        finally:
            await store.close()

    messages = anyio.run(memory)
    assert [(m.role, m.content) for m in messages] == [
        ("user", "What is 8 * 8?"),
        ("assistant", ""),  # the tool call, without its preamble
        ("tool", "64"),
        ("assistant", "The answer is 64."),
    ]
    assert messages[1].tool_calls[0].arguments == {"expression": "8 * 8"}


def same_id_each_turn(request: ModelRequest) -> list[ModelPart]:
    """A model that numbers its calls per turn: its second turn's call reuses the first's id."""
    done = sum(m.role == "tool" for m in request.messages)
    if done == 2:
        return [TextPart("Both done."), TurnEndPart("end_turn")]
    return [
        ToolCallStartPart("call_0", "calculator"),
        ToolCallArgsPart("call_0", f'{{"expression": "{done} + 1"}}'),
        ToolCallEndPart("call_0"),
        TurnEndPart("tool_calls"),
    ]


def test_tool_call_ids_are_unique_in_a_run_and_the_model_gets_its_own_back(
    tmp_path: Path,
) -> None:
    seen: list[ModelRequest] = []

    def model(request: ModelRequest) -> list[ModelPart]:
        seen.append(request)
        return same_id_each_turn(request)

    agent = AgentSpec(id="counter", model="per-turn-ids", tools=["calculator"])
    with serve(
        make_settings(tmp_path), models=[ScriptedModel("per-turn-ids", model)], agents=[agent]
    ) as live:
        _, frames = stream_frames(live, "counter", {"message": "go"})
        with live.client() as client:
            run = client.get(f"/api/agents/runs/{frames[0]['run_id']}").json()

    calls = [(f["event"], f["tool_call_id"]) for f in frames if "tool_call_id" in f]
    assert calls == [
        ("tool_call", "call_0"),
        ("tool_result", "call_0"),
        ("tool_call", "call_0-2"),
        ("tool_result", "call_0-2"),
    ]
    assert [(c["id"], c["result"]) for c in run["tool_calls"]] == [("call_0", 1), ("call_0-2", 2)]
    history = seen[-1].messages
    assert [c.id for m in history for c in m.tool_calls] == ["call_0", "call_0"]
    assert [m.tool_call_id for m in history if m.role == "tool"] == ["call_0", "call_0"], (
        "each result answers the id the model gave"
    )


def test_a_turn_that_thinks_again_after_answering_records_its_first_thoughts_once(
    tmp_path: Path,
) -> None:
    """Reasoning is recorded whole at the first part that is not reasoning; what a model
    thinks after that streams live only, and no second ``reasoning`` frame follows."""
    parts: list[ModelPart] = [
        ReasoningPart("Hmm, "),
        ReasoningPart("two."),
        TextPart("It is "),
        ReasoningPart("Sure?"),
        TextPart("two."),
        TurnEndPart("end_turn"),
    ]
    agent = AgentSpec(id="second-thoughts", model="second-thoughts", reasoning=True)
    with serve(
        make_settings(tmp_path),
        models=[ScriptedModel("second-thoughts", lambda _: parts)],
        agents=[agent],
    ) as live:
        _, frames = stream_frames(live, "second-thoughts", {"message": "1+1?"})
        with live.client() as client:
            run = client.get(f"/api/agents/runs/{frames[0]['run_id']}").json()

    assert [f for f in frames if f["event"] not in ("start", "step_started")][:6] == [
        {"event": "reasoning_delta", "delta": "Hmm, "},
        {"event": "reasoning_delta", "delta": "two."},
        {"event": "reasoning", "text": "Hmm, two."},
        {"event": "content_delta", "delta": "It is "},
        {"event": "reasoning_delta", "delta": "Sure?"},
        {"event": "content_delta", "delta": "two."},
    ]
    assert [f for f in frames if f["event"] == "reasoning"] == [
        {"event": "reasoning", "text": "Hmm, two."}
    ]
    assert [e for e in run["events"] if e["event"] == "reasoning"] == [
        {"seq": 5, "event": "reasoning", "text": "Hmm, two."}
    ]
