"""Human in the loop: a tool call waits for approval, the run pauses, survives a restart,
and continues once a person decides."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentstream.agents import AgentSpec
from conftest import (
    LiveServer,
    free_port,
    make_settings,
    read_events,
    serve,
    store_environment,
    stream_frames,
    wait_for_status,
    wait_until_up,
)

GUARDED = AgentSpec(id="guarded", tools=["calculator"], approval_required=["calculator"])


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    with serve(make_settings(tmp_path), agents=[GUARDED]) as server:
        yield server


def pause(live: LiveServer, message: str = "What is 6 * 7?") -> tuple[list[int], list[Any]]:
    ids, frames = stream_frames(live, "guarded", {"message": message})
    assert frames[-1]["event"] == "approval_requested"
    return ids, frames


def follow(live: LiveServer, run_id: str, after: int) -> list[Any]:
    with (
        live.client() as client,
        client.stream(
            "GET", f"/api/agents/runs/{run_id}/stream", headers={"Last-Event-ID": str(after)}
        ) as response,
    ):
        return [event.json() for event in read_events(response)]


def test_a_gated_call_pauses_the_run(live: LiveServer) -> None:
    _, frames = pause(live)
    call = frames[-2]
    assert call["event"] == "tool_call"
    assert frames[-1] == {
        "event": "approval_requested",
        "tool_call_id": call["tool_call_id"],
        "tool_name": "calculator",
        "tool_input": {"expression": "6 * 7"},
    }
    with live.client() as client:
        run = client.get(f"/api/agents/runs/{frames[0]['run_id']}").json()
    assert run["status"] == "awaiting_approval"
    assert [(a["tool_call_id"], a["decision"]) for a in run["approvals"]] == [
        (call["tool_call_id"], "pending")
    ]


def test_approving_continues_the_run(live: LiveServer) -> None:
    ids, frames = pause(live)
    run_id, call_id = frames[0]["run_id"], frames[-1]["tool_call_id"]
    with live.client() as client:
        decided = client.post(f"/api/agents/runs/{run_id}/approve", json={"tool_call_id": call_id})
    assert decided.status_code == 200
    assert decided.json()["approvals"][0]["decision"] == "approved"
    assert decided.json()["approvals"][0]["decided_by"] == "demo"

    rest = follow(live, run_id, after=ids[-1])
    assert [f["event"] for f in rest if "delta" not in f] == [
        "tool_result",
        "step_completed",
        "step_started",
        "step_completed",
        "complete",
    ]
    assert rest[0] == {
        "seq": rest[0]["seq"],
        "event": "tool_result",
        "tool_call_id": call_id,
        "tool_name": "calculator",
        "result": 42,
        "status": "success",
    }
    assert rest[-1]["content"] == "The answer is 42."
    text = "".join(f["delta"] for f in rest if f["event"] == "content_delta")
    assert text == "\n\nThe answer is 42.", "set apart from the preamble across the pause"
    with live.client() as client:
        run = client.get(f"/api/agents/runs/{run_id}").json()
    assert run["status"] == "completed"
    assert run["approvals"][0]["decided_at"] is not None
    seqs = [e["seq"] for e in run["events"]]
    assert seqs == sorted(set(seqs)), "the continued run goes on with the same seqs"


def test_denying_tells_the_model_why(live: LiveServer) -> None:
    ids, frames = pause(live)
    run_id, call_id = frames[0]["run_id"], frames[-1]["tool_call_id"]
    with live.client() as client:
        client.post(
            f"/api/agents/runs/{run_id}/deny", json={"tool_call_id": call_id, "reason": "not today"}
        )
    rest = follow(live, run_id, after=ids[-1])
    assert rest[0]["status"] == "error"
    assert rest[0]["result"] == "demo denied this call: not today"
    assert rest[-1]["content"] == "The calculator tool failed: demo denied this call: not today"


def test_decisions_are_checked(live: LiveServer) -> None:
    _, frames = pause(live)
    run_id, call_id = frames[0]["run_id"], frames[-1]["tool_call_id"]
    with live.client() as client:
        wrong = client.post(
            f"/api/agents/runs/{run_id}/approve", json={"tool_call_id": "call_nope"}
        )
        first = client.post(f"/api/agents/runs/{run_id}/approve", json={"tool_call_id": call_id})
        assert wait_for_status(live, run_id)["status"] == "completed"
        twice = client.post(f"/api/agents/runs/{run_id}/approve", json={"tool_call_id": call_id})
        nobody = client.post("/api/agents/runs/run_nope/approve", json={"tool_call_id": call_id})
    assert (wrong.status_code, wrong.json()["error"]["field"]) == (404, "tool_call_id")
    assert first.status_code == 200
    assert twice.status_code == 409
    assert "not waiting for approval (status: completed)" in twice.json()["error"]["message"]
    assert nobody.status_code == 404


def test_a_paused_session_takes_no_new_message(live: LiveServer) -> None:
    _, frames = pause(live)
    with live.client() as client:
        response = client.post(
            "/api/agents/guarded/run/stream",
            json={"message": "hello?", "session_id": frames[0]["session_id"]},
        )
    assert response.status_code == 409
    assert "waiting for approval" in response.json()["error"]["message"]


def test_a_paused_run_survives_a_server_restart(tmp_path: Path) -> None:
    definitions = tmp_path / "agents.yaml"
    definitions.write_text(
        "agents:\n  - {id: guarded, tools: [calculator], approval_required: [calculator]}\n"
    )
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "agentstream",
        "serve",
        "--demo",
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path),
        "--agents",
        str(definitions),
    ]
    env = {
        **os.environ,
        **store_environment(make_settings(tmp_path)),
        "AGENTSTREAM_OFFLINE_TOKEN_DELAY": "0",
    }
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url)
        first = LiveServer(
            url=url,
            key=(tmp_path / "demo-key").read_text().strip(),
            settings=make_settings(tmp_path),
        )
        ids, frames = pause(first)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    settings = make_settings(tmp_path, agents_file=definitions)
    with serve(settings) as second, second.client() as client:
        run_id, call_id = frames[0]["run_id"], frames[-1]["tool_call_id"]
        assert client.get(f"/api/agents/runs/{run_id}").json()["status"] == "awaiting_approval"
        client.post(f"/api/agents/runs/{run_id}/approve", json={"tool_call_id": call_id})
        rest = follow(second, run_id, after=ids[-1])
    assert rest[-1]["content"] == "The answer is 42."


def test_a_paused_run_can_be_cancelled(live: LiveServer) -> None:
    ids, frames = pause(live)
    run_id, session_id = frames[0]["run_id"], frames[0]["session_id"]
    with live.client() as client:
        cancelled = client.post(f"/api/agents/runs/{run_id}/cancel")
        run = client.get(f"/api/agents/runs/{run_id}").json()
        reconnect = client.get(
            f"/api/agents/runs/{run_id}/stream", headers={"Last-Event-ID": str(ids[-1])}
        )
    assert cancelled.json() == {"run_id": run_id, "status": "cancelled"}
    assert run["approvals"][0]["decision"] == "cancelled"
    assert run["events"][-1] == {
        "seq": run["events"][-1]["seq"],
        "event": "error",
        "message": "Run cancelled",
        "status": "cancelled",
    }
    assert reconnect.status_code == 200
    _, after = stream_frames(live, "guarded", {"message": "hi", "session_id": session_id})
    assert after[-1]["event"] == "complete", "the session takes messages again"


def test_reconnecting_to_a_paused_run_gets_204(live: LiveServer) -> None:
    ids, frames = pause(live)
    with live.client() as client:
        response = client.get(
            f"/api/agents/runs/{frames[0]['run_id']}/stream",
            headers={"Last-Event-ID": str(ids[-1])},
        )
    assert response.status_code == 204
