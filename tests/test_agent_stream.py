"""The native agent stream over real HTTP: frame order and shapes, replay, sessions."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentstream.providers.base import Message
from agentstream.store import Store
from agentstream.views.native import NativeFrameAdapter
from conftest import LiveServer, make_settings, serve, stream_frames


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    """The same behaviour on both stores."""
    overrides = {}
    if request.param == "postgresql":
        overrides["database_url"] = request.getfixturevalue("postgres_url")
    with serve(make_settings(tmp_path, **overrides)) as live:
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
    for frame in frames:
        model = type(NativeFrameAdapter.validate_python(frame))
        assert set(frame) == set(model.model_fields), "exactly the documented keys"
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
        {"event": "content_delta", "delta": "The answer is 391."},
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
        if frame["event"] not in ("content_delta", "reasoning_delta")
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
    with closing(sqlite3.connect(tmp_path / "agentstream.db")) as db:
        rows = dict(db.execute("select run_id, count(*) from run_events group by run_id"))
    assert rows[short[1][0]["run_id"]] == rows[long[1][0]["run_id"]] == 5
    assert len(long[1]) > 2000


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
