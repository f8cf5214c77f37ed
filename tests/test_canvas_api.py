"""The canvas execution-events stream over real HTTP: always opted in, and a block with PII
redaction on its output, or reading such an output, is never forwarded live."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentstream.sse import SSEDecoder
from agentstream.views.canvas import LIVE_ONLY
from conftest import LiveServer, make_settings, read_events, serve

EMAIL = "jane.doe@example.com"

WORKFLOW = {
    "id": "contact",
    "blocks": [
        {"id": "start", "type": "start"},
        {
            "id": "private",
            "type": "agent",
            "agent": {"id": "p"},
            "input": "<start.input>",
            "redact_output": True,
        },
        {"id": "public", "type": "agent", "agent": {"id": "q"}, "input": "<start.input>"},
        {"id": "quote", "type": "template", "template": "They wrote: <private.content>"},
        {"id": "echo", "type": "agent", "agent": {"id": "e"}, "input": "<quote.text>"},
        {"id": "out", "type": "response", "output": "<public.content>"},
    ],
    "edges": [
        {"from": "start", "to": "private"},
        {"from": "start", "to": "public"},
        {"from": "private", "to": "quote"},
        {"from": "quote", "to": "echo"},
        {"from": "echo", "to": "out"},
        {"from": "public", "to": "out"},
    ],
}


def execute(server: LiveServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with (
        server.client() as client,
        client.stream("POST", "/api/workflows/contact/execute", json=body) as response,
    ):
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return [json.loads(event.data) for event in read_events(response)]


def test_redacted_block_and_its_readers_stream_nothing_live_and_complete_redacted(
    server: LiveServer,
) -> None:
    with server.client() as client:
        assert client.post("/api/workflows", json=WORKFLOW).status_code == 201

    frames = execute(server, {"input": f"Write to {EMAIL} please"})

    assert frames[0]["type"] == "execution:started"
    assert frames[-1]["type"] == "execution:completed"
    assert all(f["executionId"] == frames[0]["executionId"] for f in frames)
    assert all(f["workflowId"] == "contact" for f in frames)
    live = {(f["type"], f["data"].get("blockId")) for f in frames}
    assert ("stream:chunk", "public") in live
    private = ("private", "quote", "echo")  # quote reads private, echo reads quote
    for block_id in private:
        assert ("stream:chunk", block_id) not in live
    completed = {
        f["data"]["blockId"]: f["data"].get("output")
        for f in frames
        if f["type"] == "block:completed"
    }
    assert EMAIL in completed["public"]["content"]
    assert EMAIL not in json.dumps(completed["private"])
    assert completed["private"]["content"], "redacted, not dropped"
    assert completed["quote"]["text"].startswith("They wrote: ")
    assert completed["echo"]["content"]
    assert EMAIL not in json.dumps([f for f in frames if f["data"].get("blockId") in private])


GREETER = {
    "id": "greeter",
    "blocks": [
        {"id": "start", "type": "start"},
        {"id": "hello", "type": "template", "template": "Hello, <start.input>"},
        {"id": "out", "type": "response", "output": "<hello.text>"},
    ],
    "edges": [{"from": "start", "to": "hello"}, {"from": "hello", "to": "out"}],
}


def test_the_reference_builders_body_runs_the_draft(server: LiveServer) -> None:
    """What the reference builder sends to its execute route streams the draft run."""
    body = {
        "input": "Ada",
        "stream": True,
        "selectedOutputs": ["hello.text"],
        "triggerType": "manual",
        "useDraftState": True,
        "isClientSession": True,
        "includeFileBase64": True,
        "base64MaxBytes": 10_000_000,
    }
    with server.client() as client:
        assert client.post("/api/workflows", json=GREETER).status_code == 201
        with client.stream("POST", "/api/workflows/greeter/execute", json=body) as response:
            assert response.status_code == 200, response.read()
            frames = [json.loads(event.data) for event in read_events(response)]

    assert frames[-1]["type"] == "execution:completed"
    assert frames[-1]["data"] == {"result": "Hello, Ada"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"stream": False}, "stream"),
        ({"stream": "true"}, "stream"),
        ({"selectedOutputs": "hello.text"}, "selectedOutputs"),
        ({"workflowStateOverride": {"blocks": {}, "edges": []}}, "workflowStateOverride"),
        ({"colour": "red"}, "colour"),
    ],
    ids=["no-stream", "string-stream", "outputs-not-a-list", "sim-state", "unknown"],
)
def test_fields_that_cannot_be_honoured_are_refused(
    server: LiveServer, body: dict[str, Any], field: str
) -> None:
    with server.client() as client:
        assert client.post("/api/workflows", json=GREETER).status_code == 201
        response = client.post("/api/workflows/greeter/execute", json=body)
        assert response.status_code == 422
        assert response.json()["error"]["field"] == field
        assert client.get("/api/workflows/greeter/executions").json() == []


def test_a_viewer_that_connects_mid_run_gets_only_what_follows_live(tmp_path: Path) -> None:
    """Spec 000, "Reconnect": stream:chunk, stream:chunk_reset, stream:thinking and
    stream:tool are live-only. A viewer that connects while the run goes on gets what
    already happened without them, then the run as it happens, with them; once the run is
    over, a replay has none, unless it asks for the full history."""
    with (
        serve(make_settings(tmp_path, offline_token_delay=0.02)) as live,
        live.client() as client,
        client.stream(
            "POST", "/api/workflows/demo-parallel/execute", json={"input": "17 * 23"}
        ) as posted,
    ):
        decoder, watched = SSEDecoder(), []
        chunks = posted.iter_bytes()  # held: let go, it would close the stream (a cancel)
        for chunk in chunks:
            watched += [json.loads(e.data) for e in decoder.feed(chunk)]
            if sum(f["type"] == "stream:chunk" for f in watched) >= 3:
                break
        before = max(f["eventId"] for f in watched)
        canvas = f"/api/workflows/executions/{watched[0]['executionId']}/canvas"
        with client.stream("GET", canvas) as joined:
            followed = [json.loads(e.data) for e in read_events(joined)]
        for chunk in chunks:
            watched += [json.loads(e.data) for e in decoder.feed(chunk)]
        replayed = [json.loads(e.data) for e in read_events(client.get(canvas))]
        full = [json.loads(e.data) for e in read_events(client.get(f"{canvas}?full_history=1"))]

    assert followed[0]["type"] == "execution:started"
    assert followed[-1]["type"] == "execution:completed"
    happened = [f for f in followed if f["eventId"] <= before]
    assert [f for f in happened if f["type"] in LIVE_ONLY] == []
    assert {"block:started"} <= {f["type"] for f in happened}
    settled = [f for f in watched if f["type"] not in LIVE_ONLY]
    assert [f for f in followed if f["type"] not in LIVE_ONLY] == settled
    streamed = [f for f in followed if f["type"] in LIVE_ONLY]  # from when it connected on
    assert streamed, "what happened after it connected came live"
    assert streamed == [f for f in watched if f["type"] in LIVE_ONLY][-len(streamed) :]
    assert streamed[0]["eventId"] > before
    assert replayed == settled
    assert full == watched
