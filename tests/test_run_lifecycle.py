"""How runs end when they don't end well: cancel, disconnect, timeout, crash; and keepalive."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentstream.agents import AgentSpec
from agentstream.providers.base import (
    ModelPart,
    ModelRequest,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
)
from agentstream.providers.scripted import ScriptedModel
from agentstream.runtime.leases import SEAL_GAP
from agentstream.runtime.supervisor import LiveRun
from agentstream.runtime.tools import Tool
from agentstream.sse import SSEDecoder
from conftest import (
    FORWARDED_ONLY,
    LiveServer,
    make_settings,
    read_events,
    run_events,
    serve,
    stream_frames,
    wait_for_status,
)
from fakes.test_app import call_wait_then_answer, wait
from processes import TAKEOVER_LEASE, server_process


def chatter(request: ModelRequest) -> list[ModelPart]:
    """A long answer, for cancelling mid-stream."""
    return [*(TextPart(f" word{i}") for i in range(10_000)), TurnEndPart("end_turn")]


TALKER = ScriptedModel("talker", chatter, delay=0.01)


@pytest.fixture
def slow_server(tmp_path: Path) -> Iterator[LiveServer]:
    settings = make_settings(tmp_path, keepalive_seconds=0.2)
    agents = [
        AgentSpec(id="waiter", model="scripted-wait", tools=["wait"]),
        AgentSpec(id="hasty", model="scripted-wait", tools=["wait"], timeout_seconds=2),
        AgentSpec(id="talker", model="talker"),
    ]
    with serve(
        settings,
        tools=[Tool.from_function(wait)],
        models=[ScriptedModel("scripted-wait", call_wait_then_answer), TALKER],
        agents=agents,
    ) as live:
        yield live


def open_until(live: LiveServer, agent: str, event: str) -> str:
    """Start a run, read until a frame of kind ``event`` arrives, then hang up. The run id."""
    decoder = SSEDecoder()
    with (
        live.client() as client,
        client.stream(
            "POST", f"/api/agents/{agent}/run/stream", json={"message": "go"}
        ) as response,
    ):
        run_id = ""
        for chunk in response.iter_bytes():
            for sse in decoder.feed(chunk):
                frame = sse.json()
                run_id = run_id or frame["run_id"]
                if frame["event"] == event:
                    return run_id
    raise AssertionError(f"no {event} frame")


def test_disconnect_cancels_the_run_and_settles_tools(slow_server: LiveServer) -> None:
    run_id = open_until(slow_server, "waiter", "tool_call")

    run = wait_for_status(slow_server, run_id)

    assert run["status"] == "cancelled"
    assert run["error"] == "Client cancelled request"
    assert run["content"] is None
    assert [(c["name"], c["status"]) for c in run["tool_calls"]] == [("wait", "cancelled")]
    assert [e["event"] for e in run["events"]][-3:] == ["tool_call", "tool_result", "error"]
    assert run["events"][-1] == {
        "seq": run["events"][-1]["seq"],
        "event": "error",
        "message": "Client cancelled request",
        "status": "cancelled",
    }


def test_disconnect_mid_answer_closes_the_model_stream(slow_server: LiveServer) -> None:
    run_id = open_until(slow_server, "talker", "content_delta")

    run = wait_for_status(slow_server, run_id)

    assert run["status"] == "cancelled"
    assert run["content"] is None
    assert TALKER.open_streams == 0, "the model's stream was closed"
    assert [e["event"] for e in run["events"]] == ["start", "step_started", "error"]


def test_cancel_endpoint_ends_the_stream_with_an_error_frame(slow_server: LiveServer) -> None:
    frames: list[dict[str, Any]] = []
    with (
        slow_server.client() as client,
        client.stream("POST", "/api/agents/waiter/run/stream", json={"message": "go"}) as response,
    ):
        decoder = SSEDecoder()
        for chunk in response.iter_bytes():
            for sse in decoder.feed(chunk):
                frames.append(sse.json())
                if frames[-1]["event"] == "tool_call":
                    cancel = client.post(f"/api/agents/runs/{frames[0]['run_id']}/cancel")

    assert [f["event"] for f in frames][-2:] == ["tool_result", "error"]
    assert frames[-2]["status"] == "cancelled"
    assert cancel.status_code == 200
    assert cancel.json() == {"run_id": frames[0]["run_id"], "status": "cancelled"}
    assert frames[-1] == {
        "seq": frames[-1]["seq"],
        "event": "error",
        "message": "Run cancelled",
        "status": "cancelled",
    }
    with slow_server.client() as client:
        again = client.post(f"/api/agents/runs/{frames[0]['run_id']}/cancel")
    assert again.status_code == 409
    assert wait_for_status(slow_server, frames[0]["run_id"])["status"] == "cancelled"


def test_timeout_is_its_own_outcome(slow_server: LiveServer) -> None:
    _, frames = stream_frames(slow_server, "hasty", {"message": "go"})

    assert frames[-1] == {
        "event": "error",
        "message": "Execution timed out after 2s",
        "status": "timeout",
    }
    assert frames[-2]["event"] == "tool_result"
    assert frames[-2]["status"] == "cancelled"
    run = wait_for_status(slow_server, frames[0]["run_id"])
    assert run["status"] == "timeout"
    assert run["error"] == "Execution timed out after 2s"


def test_keepalive_comment_fills_silence(slow_server: LiveServer) -> None:
    raw = b""
    with (
        slow_server.client() as client,
        client.stream("POST", "/api/agents/hasty/run/stream", json={"message": "go"}) as response,
    ):
        for chunk in response.iter_bytes():
            raw += chunk
    # The tool waits until the 2 s timeout, with keepalive at 0.2 s.
    assert b"\n: keepalive\n\n" in raw
    assert b'"event":"error"' in raw.split(b": keepalive")[-1], "keepalive precedes the end"


def test_resume_from_a_frames_seq(server: LiveServer) -> None:
    """The POST stream has no ``id:`` lines: a client resumes from a frame's ``seq``, and
    gets exactly the frames after it, each with its seq as ``id:`` for EventSource."""
    original = [e.json() for e in run_events(server, "demo", {"message": "What is 3 * 3?"})]
    run_id = original[0]["run_id"]
    middle = original[len(original) // 2]

    with (
        server.client() as client,
        client.stream(
            "GET", f"/api/agents/runs/{run_id}/stream", params={"after": middle["seq"]}
        ) as response,
    ):
        resumed = read_events(response)

    assert [e.json() for e in resumed] == original[len(original) // 2 + 1 :], (
        "live log still holds the deltas"
    )
    assert [e.id for e in resumed] == [str(e.json()["seq"]) for e in resumed]


def test_resume_after_the_live_log_is_gone_serves_persisted_events(tmp_path: Path) -> None:
    with serve(make_settings(tmp_path, run_retention_seconds=0)) as live:
        original = [e.json() for e in run_events(live, "demo", {"message": "What is 3 * 3?"})]
        run_id = original[0]["run_id"]
        wait_for_status(live, run_id)
        with (
            live.client() as client,
            client.stream("GET", f"/api/agents/runs/{run_id}/stream?after=2") as response,
        ):
            resumed = read_events(response)

    persisted = [f for f in original if f["event"] not in FORWARDED_ONLY]
    assert [e.json() for e in resumed] == [f for f in persisted if f["seq"] > 2]
    assert [e.id for e in resumed] == [str(e.json()["seq"]) for e in resumed]


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_run_cut_off_by_a_crash_ends_with_its_terminal_event(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """On SQLite the restarted server owns the database, so it knows at once that the run's
    process is dead; on PostgreSQL, shared by design, it waits for that process's lease."""
    database_url = request.getfixturevalue("postgres_url") if store == "postgresql" else None
    with (
        server_process(
            make_settings(tmp_path, database_url=database_url, lease_seconds=TAKEOVER_LEASE)
        ) as crashed,
        crashed.live.client() as client,
        client.stream("POST", "/api/agents/waiter/run/stream", json={"message": "go"}) as response,
    ):
        decoder = SSEDecoder()
        seen: list[dict[str, Any]] = []
        chunks = response.iter_bytes()  # held: an iterator let go closes the connection,
        for chunk in chunks:  # and the run would be cancelled (its tool settled) before the crash
            seen += [e.json() for e in decoder.feed(chunk)]
            if any(frame["event"] == "tool_call" for frame in seen):
                break
        crashed.kill()
    run_id = seen[0]["run_id"]

    with serve(crashed.live.settings) as restarted, restarted.client() as client:
        run = wait_for_status(restarted, run_id)
        replay = read_events(client.get(f"/api/agents/runs/{run_id}/stream"))
        last_seen = seen[-1]["seq"]  # the tool call, the last event before the crash
        end = last_seen + SEAL_GAP  # past anything the server could have sent its viewers
        resumed = client.get(
            f"/api/agents/runs/{run_id}/stream", headers={"Last-Event-ID": str(last_seen)}
        )
        done = client.get(f"/api/agents/runs/{run_id}/stream", headers={"Last-Event-ID": str(end)})

    stopped = "The server stopped during the run"
    terminal = {"event": "error", "status": "interrupted", "message": stopped}
    assert (run["status"], run["error"]) == ("interrupted", stopped)
    assert run["events"][-2]["event"] == "tool_call"
    ended = {"seq": end, **terminal}
    assert run["events"][-1] == ended
    assert [e.json() for e in replay][-1] == ended
    assert [e.json()["event"] for e in replay].count("error") == 1
    assert [(e.id, e.json()) for e in SSEDecoder().feed(resumed.content)] == [(str(end), ended)]
    assert done.status_code == 204, "after the terminal event there is nothing more"


def test_stopping_the_server_ends_its_live_runs_and_keeps_paused_ones(tmp_path: Path) -> None:
    """A run going when the server stops in good order ends with its terminal event; a run
    waiting for approval is not going: it stays paused across the restart."""
    started = threading.Event()

    async def wait_for_the_stop() -> str:
        started.set()
        await anyio.sleep_forever()
        return "never"

    guarded = AgentSpec(
        id="guarded", model="scripted-wait", tools=["wait"], approval_required=["wait"]
    )
    app = {
        "tools": [Tool.from_function(wait_for_the_stop, name="wait")],
        "models": [ScriptedModel("scripted-wait", call_wait_then_answer)],
        "agents": [guarded],
    }
    with serve(make_settings(tmp_path), **app) as live, live.client() as client:
        _, going = stream_frames(live, "guarded", {"message": "go"})
        _, paused = stream_frames(live, "guarded", {"message": "go"})
        approved = client.post(
            f"/api/agents/runs/{going[0]['run_id']}/approve",
            json={"tool_call_id": going[-1]["tool_call_id"]},
        )
        assert approved.json()["status"] == "running"
        assert started.wait(10), "the approved call runs, with no viewer"

    with serve(make_settings(tmp_path), **app) as restarted, restarted.client() as client:
        stopped = client.get(f"/api/agents/runs/{going[0]['run_id']}").json()
        waiting = client.get(f"/api/agents/runs/{paused[0]['run_id']}").json()
        replay = read_events(client.get(f"/api/agents/runs/{going[0]['run_id']}/stream"))

    message = "The server stopped during the run"
    assert (stopped["status"], stopped["error"]) == ("interrupted", message)
    assert [{k: v for k, v in e.json().items() if k != "seq"} for e in replay][-2:] == [
        {
            "event": "tool_result",
            "tool_call_id": going[-1]["tool_call_id"],
            "tool_name": "wait",
            "result": None,
            "status": "cancelled",
        },
        {"event": "error", "status": "interrupted", "message": message},
    ]
    assert (waiting["status"], waiting["events"][-1]["event"]) == (
        "awaiting_approval",
        "approval_requested",
    )


def leaky(request: ModelRequest) -> list[ModelPart]:
    raise ConnectionError("https://api.example.com/v1?key=sk-SECRET-123 refused")


def test_unexpected_errors_stay_out_of_streams(tmp_path: Path) -> None:
    agents = [AgentSpec(id="leaky", model="leaky")]
    with serve(
        make_settings(tmp_path), models=[ScriptedModel("leaky", leaky)], agents=agents
    ) as live:
        _, frames = stream_frames(live, "leaky", {"message": "hi"})
        run_id = frames[0]["run_id"]
        with live.client() as client:
            client.post("/api/chat-deployments", json={"slug": "leaky", "agent_id": "leaky"})
            chat = client.post("/api/chat/leaky", json={"input": "hi"}).text
            run = client.get(f"/api/agents/runs/{run_id}").json()

    assert frames[-1] == {
        "event": "error",
        "status": "error",
        "message": f"Internal error; the server log has the details of run {run_id}",
    }
    assert "SECRET" not in chat
    assert '"event":"error"' in chat
    assert run["status"] == "error"
    assert run["error"] == "ConnectionError: https://api.example.com/v1?key=sk-SECRET-123 refused"


def test_a_store_failure_still_ends_the_stream(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("agentstream.store.store.Store.finish_run", broken)
    _, frames = stream_frames(server, "demo", {"message": "hi"})

    assert frames[-1]["event"] == "error"
    assert frames[-1]["message"].startswith("The run's outcome could not be saved")
    assert [f["event"] for f in frames].count("complete") == 0


def test_reconnecting_event_source_resumes_from_its_header(server: LiveServer) -> None:
    original = [e.json() for e in run_events(server, "demo", {"message": "What is 3 * 3?"})]
    run_id = original[0]["run_id"]
    last = str(original[-1]["seq"])
    url = f"/api/agents/runs/{run_id}/stream?after=0"
    with server.client() as client:
        with client.stream("GET", url, headers={"Last-Event-ID": str(original[3]["seq"])}) as r:
            resumed = read_events(r)
        done = client.get(url, headers={"Last-Event-ID": last})

    assert [e.json() for e in resumed] == original[4:], "the header wins over the URL's ?after=0"
    assert done.status_code == 204, "nothing more: an EventSource stops reconnecting"


def test_a_late_viewer_gets_every_token_a_long_run_streamed(server: LiveServer) -> None:
    """The live log packs a run's older tokens to keep them small: followed from its start
    after it ended, a run of hundreds of tokens gives the very frames its client got live."""
    body = {"message": "Write 500 words", "reasoning": True}
    original = [e.json() for e in run_events(server, "demo", body)]
    assert sum(f["event"] == "content_delta" for f in original) == 500
    with server.client() as client:
        url = f"/api/agents/runs/{original[0]['run_id']}/stream?after=0"
        with client.stream("GET", url) as response:
            followed = read_events(response)
    assert [e.json() for e in followed] == original
    assert [e.id for e in followed] == [str(f["seq"]) for f in original]


def blocking_wait(seconds: float = 30.0) -> str:
    """A sync tool that blocks its thread."""
    time.sleep(seconds)
    return "waited"


def call_blocking(request: ModelRequest) -> list[ModelPart]:
    return [
        ToolCallStartPart("b1", "blocking_wait"),
        ToolCallArgsPart("b1", "{}"),
        ToolCallEndPart("b1"),
        TurnEndPart("tool_calls"),
    ]


def test_timeout_does_not_wait_for_a_blocked_sync_tool(tmp_path: Path) -> None:
    agent = AgentSpec(id="blocked", model="blocking", tools=["blocking_wait"], timeout_seconds=0.3)
    with serve(
        make_settings(tmp_path),
        tools=[Tool.from_function(blocking_wait)],
        models=[ScriptedModel("blocking", call_blocking)],
        agents=[agent],
    ) as live:
        _, frames = stream_frames(live, "blocked", {"message": "go"})
    assert frames[-1]["status"] == "timeout"
    assert frames[-2] == {
        "event": "tool_result",
        "tool_call_id": "b1",
        "tool_name": "blocking_wait",
        "result": None,
        "status": "cancelled",
    }


def test_concurrent_messages_on_one_session_get_one_run(server: LiveServer) -> None:
    import concurrent.futures

    _, first = stream_frames(server, "demo", {"message": "hi"})
    body = {"message": "Write 300 words", "session_id": first[0]["session_id"]}

    def post() -> int:
        with server.client() as client:
            return client.post("/api/agents/demo/run/stream", json=body).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = sorted(pool.map(lambda _: post(), range(8)))
    assert statuses.count(200) >= 1
    assert set(statuses) <= {200, 409}, statuses
    _, later = stream_frames(server, "demo", {"message": "hi"})
    assert later[-1]["event"] == "complete", "the server still runs runs"


def test_whoever_waits_for_a_run_is_told_when_its_ending_is_recorded() -> None:
    """Before the end or after it: the supervisor makes a run's ``done`` event only when
    someone asks (most runs end with nobody waiting)."""

    async def check() -> tuple[bool, bool, bool]:
        early, late = LiveRun("r1"), LiveRun("r2")
        waiting = early.done
        set_before = waiting.is_set()
        early.record_ended()
        late.record_ended()
        with anyio.fail_after(1):
            await waiting.wait()
            await late.done.wait()
        return set_before, waiting.is_set(), late.done.is_set()

    assert anyio.run(check) == (False, True, True)
