"""Each streaming operation documents its frames, and real streams keep to the document:
every frame of an agent run, a public chat (with and without the protocol header, agent and
workflow deployments), a workflow execution and a canvas run, live and followed, is valid
against the schema its operation documents, with no field the schema does not name."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from conftest import LiveServer, read_events

PROTOCOLS = ("OpenAI", "Vercel AI SDK", "AG-UI")
"""The third-party protocols, whose schemas their specifications hold."""


def streaming(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): operation["responses"]["200"]["content"]["text/event-stream"]
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
        if "text/event-stream" in operation["responses"].get("200", {}).get("content", {})
    }


def closed(schema: Any) -> Any:
    """``schema`` with every object closed to fields it does not name: a field a view
    sends that its frame model lacks is drift, even where clients must ignore new ones."""
    if isinstance(schema, dict):
        schema = {key: closed(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [closed(value) for value in schema]
    return schema


class Frames:
    """Streams read from a live server, checked against its OpenAPI document."""

    def __init__(self, live: LiveServer) -> None:
        self.live = live
        self.document = httpx.get(f"{live.url}/openapi.json").json()
        self.components = closed(copy.deepcopy(self.document["components"]))
        self.seen: dict[str, set[str]] = {}

    def stream(
        self,
        method: str,
        path: str,
        url: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> list[Any]:
        """The frames of ``url`` (an operation at ``path``), each validated; POST streams
        have no ``id:`` lines, followed ones one per frame."""
        schema = streaming(self.document)[method, path]["schema"]
        events_valid = Draft202012Validator(schema)
        frame_schema = schema["properties"]["data"]["contentSchema"]
        validator = Draft202012Validator({**frame_schema, "components": self.components})
        with (
            self.live.client(timeout=30) as client,
            client.stream(method.upper(), url, json=body, headers=headers) as response,
        ):
            assert response.status_code == 200, response.read()
            assert response.headers["content-type"].startswith("text/event-stream")
            events = read_events(response)
        assert events
        frames = []
        for event in events:
            assert (event.id is None) == (method == "post"), (path, event)
            shown = {"data": event.data, "event": event.event}
            if event.id is not None:
                shown["id"] = event.id
            assert events_valid.is_valid(shown), (path, shown)
            frame = event.json()
            errors = sorted(validator.iter_errors(frame), key=lambda e: e.path)
            assert not errors, (path, frame, [e.message for e in errors][:3])
            frames.append(frame)
            kind = frame.get("event") or frame.get("type") if isinstance(frame, dict) else frame
            self.seen.setdefault(path, set()).add(str(kind))
        return frames


@pytest.fixture
def frames(server: LiveServer) -> Frames:
    return Frames(server)


def test_every_streaming_operation_documents_its_frames(frames: Frames) -> None:
    streams = streaming(frames.document)
    assert len(streams) >= 12
    for (method, path), media in streams.items():
        schema = media["schema"]["properties"]["data"]  # one event's: its data
        if "contentSchema" in schema:  # generated from the view's frame models
            assert schema["contentMediaType"] == "application/json"
            name = schema["contentSchema"]["$ref"].rsplit("/", 1)[1]
            assert name in {"NativeFrame", "WorkflowFrame", "ChatFrame", "CanvasFrame"}
            component = frames.document["components"]["schemas"][name]
            assert "oneOf" in component or "anyOf" in component, name
        else:
            assert any(p in schema["description"] for p in PROTOCOLS), (method, path)
        operation = frames.document["paths"][path][method]
        framing = operation["responses"]["200"]["description"]
        assert "`data:`" in framing, (method, path)
        assert ("`id: <seq>`" in framing) == (method == "get" and "contentSchema" in schema), path


def test_agent_run_frames_match_the_document(frames: Frames) -> None:
    body = {"message": "What is 17 * 23? Think first.", "reasoning": True}
    live = frames.stream(
        "post", "/api/agents/{agent_id}/run/stream", "/api/agents/demo/run/stream", body=body
    )
    run_id = live[0]["run_id"]
    followed = frames.stream(
        "get", "/api/agents/runs/{run_id}/stream", f"/api/agents/runs/{run_id}/stream"
    )
    assert followed[-1]["event"] == live[-1]["event"] == "complete"
    for event in ("start", "reasoning_delta", "tool_call", "tool_result", "content_delta"):
        assert event in frames.seen["/api/agents/{agent_id}/run/stream"], event


@pytest.mark.parametrize("protocol", [True, False], ids=["agent-events-v1", "legacy"])
def test_public_chat_frames_match_the_document(frames: Frames, protocol: bool) -> None:
    headers = {"X-Sim-Stream-Protocol": "agent-events-v1"} if protocol else {}
    for slug, message in [("your-slug", "Think first: what is 17 * 23?"), ("two-questions", "2+2")]:
        with frames.live.client() as client:  # the run to follow afterwards, by its header
            with client.stream(
                "POST", f"/api/chat/{slug}", json={"input": message}, headers=headers
            ) as response:
                response.read()
            run_id = response.headers["x-run-id"]
            conversation = response.headers["x-conversation-id"]
        sent = frames.stream(
            "post",
            "/api/chat/{slug}",
            f"/api/chat/{slug}",
            body={"input": message},
            headers=headers,
        )
        assert sent[-1] == "[DONE]"
        followed = frames.stream(
            "get",
            "/api/chat/{slug}/runs/{run_id}/stream",
            f"/api/chat/{slug}/runs/{run_id}/stream?conversationId={conversation}",
            headers=headers,
        )
        assert followed[-2]["event"] == "final"
    seen = frames.seen["/api/chat/{slug}"]
    if protocol:
        assert {"tool", "thinking", "chunk_reset", "final"} <= seen
    else:
        assert seen == {"None", "final", "[DONE]"}  # settled text, the envelope, the end


def test_workflow_and_canvas_frames_match_the_document(frames: Frames) -> None:
    body = {"input": "17 * 23"}
    run = frames.stream(
        "post",
        "/api/workflows/{workflow_id}/run/stream",
        "/api/workflows/demo-parallel/run/stream",
        body=body,
    )
    execution_id = run[0]["execution_id"]
    frames.stream(
        "get",
        "/api/workflows/executions/{execution_id}/stream",
        f"/api/workflows/executions/{execution_id}/stream",
    )
    canvas = frames.stream(
        "post",
        "/api/workflows/{workflow_id}/execute",
        "/api/workflows/demo-parallel/execute",
        body=body,
    )
    frames.stream(
        "get",
        "/api/workflows/executions/{execution_id}/canvas",
        f"/api/workflows/executions/{canvas[0]['executionId']}/canvas",
    )
    assert run[-1]["event"] == "workflow_complete"
    assert canvas[-1]["type"] == "execution:completed"
    assert {"block:started", "stream:chunk", "stream:tool", "block:completed"} <= frames.seen[
        "/api/workflows/{workflow_id}/execute"
    ]
