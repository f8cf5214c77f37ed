"""Sessions: a conversation's runs and memory can be read, and forgotten."""

from __future__ import annotations

from pathlib import Path

from conftest import LiveServer, make_settings, serve, stream_frames


def test_a_session_lists_its_runs_and_memory(server: LiveServer) -> None:
    _, first = stream_frames(server, "demo", {"message": "What is 2 * 3?"})
    session_id = first[0]["session_id"]
    _, second = stream_frames(server, "demo", {"message": "hi", "session_id": session_id})

    with server.client() as client:
        session = client.get(f"/api/sessions/{session_id}").json()

    assert session["agent_id"] == "demo"
    assert [(r["id"], r["status"], r["content"]) for r in session["runs"]] == [
        (first[0]["run_id"], "completed", "The answer is 6."),
        (second[0]["run_id"], "completed", second[-1]["content"]),
    ]
    assert [(m["role"], m["content"]) for m in session["messages"]] == [
        ("user", "What is 2 * 3?"),
        ("assistant", ""),
        ("tool", "6"),
        ("assistant", "The answer is 6."),
        ("user", "hi"),
        ("assistant", second[-1]["content"]),
    ]
    assert session["messages"][1]["tool_calls"][0]["name"] == "calculator"


def test_deleting_a_session_forgets_everything(server: LiveServer) -> None:
    _, frames = stream_frames(server, "demo", {"message": "What is 2 * 3?"})
    session_id, run_id = frames[0]["session_id"], frames[0]["run_id"]

    with server.client() as client:
        deleted = client.delete(f"/api/sessions/{session_id}")
        session = client.get(f"/api/sessions/{session_id}")
        run = client.get(f"/api/agents/runs/{run_id}")
        again = client.delete(f"/api/sessions/{session_id}")
        continued = client.post(
            "/api/agents/demo/run/stream", json={"message": "hi", "session_id": session_id}
        )

    assert deleted.status_code == 204
    assert session.status_code == 404
    assert run.status_code == 404, "its runs go with it"
    assert again.status_code == 404
    assert continued.status_code == 404


def test_a_session_with_a_run_going_cannot_be_deleted(tmp_path: Path) -> None:
    with serve(make_settings(tmp_path, offline_token_delay=0.05)) as paced:
        _, first = stream_frames(paced, "demo", {"message": "hi", "reasoning": False})
        session_id = first[0]["session_id"]
        body = {"message": "Write 100 words", "session_id": session_id}
        with (
            paced.client() as client,
            client.stream("POST", "/api/agents/demo/run/stream", json=body) as response,
        ):
            chunks = response.iter_bytes()  # held: dropping it would close the stream
            next(chunks)  # the run has started, and takes 5 s
            refused = client.delete(f"/api/sessions/{session_id}")
    assert refused.status_code == 409
    assert refused.json()["error"]["field"] == "session_id"
