"""Every surface's frames, whole, against snapshots: what each client receives, byte for
byte but for generated ids and times (masked), live and replayed.

The snapshots pin the wire: a change to any frame of any surface shows up here as a diff.
After a deliberate change, regenerate them with ``AGENTSTREAM_UPDATE_SNAPSHOTS=1`` and read
the diff before committing it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentstream.agents import AgentSpec
from conftest import LiveServer, make_settings, serve

SNAPSHOTS = Path(__file__).with_name("snapshots")

AGENTS = [
    AgentSpec(id="counter", tools=["calculator"], reasoning=True),
    AgentSpec(id="boss", delegates=["counter"], reasoning=True),
]

WORKFLOW = {
    "id": "chain",
    "blocks": [
        {"id": "start", "type": "start"},
        {"id": "ask", "type": "agent", "agent": "counter", "input": "What is <start.input>?"},
        {"id": "double", "type": "function", "expression": "len(ask['content']) * 2"},
        {
            "id": "route",
            "type": "condition",
            "branches": [{"name": "long", "when": "double['result'] > 10"}, {"name": "short"}],
        },
        {"id": "loud", "type": "template", "template": "Long: <ask.content>"},
        {"id": "quiet", "type": "template", "template": "Short: <ask.content>"},
        {"id": "broken", "type": "function", "expression": "1 / 0"},
        {"id": "rescue", "type": "template", "template": "Rescued: <broken.error>"},
        {"id": "out", "type": "response", "output": {"said": "<loud.text>"}},
    ],
    "edges": [
        {"from": "start", "to": "ask"},
        {"from": "ask", "to": "double"},
        {"from": "double", "to": "route"},
        {"from": "route", "to": "loud", "branch": "long"},
        {"from": "route", "to": "quiet", "branch": "short"},
        {"from": "loud", "to": "broken"},
        {"from": "broken", "to": "rescue", "on": "error"},
        {"from": "rescue", "to": "out"},
    ],
}

FAILING = {
    "id": "fails",
    "blocks": [
        {"id": "start", "type": "start"},
        {"id": "ask", "type": "agent", "agent": "counter", "input": "What is <start.input>?"},
        {"id": "boom", "type": "function", "expression": "1 / 0"},
    ],
    "edges": [{"from": "start", "to": "ask"}, {"from": "ask", "to": "boom"}],
}

CHATS = [
    {"slug": "agent-all", "agent_id": "counter", "include_thinking": True,
     "include_tool_calls": True},
    {"slug": "agent-none", "agent_id": "counter"},
    {"slug": "flow-chat", "workflow_id": "chain", "output_blocks": ["ask", "loud"],
     "include_tool_calls": True},
]  # fmt: skip

QUESTION = "17 * 23"
HEADER = {"X-Sim-Stream-Protocol": "agent-events-v1"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The live log keeps nothing once a run ends, so a GET replays from the store."""
    settings = make_settings(tmp_path_factory.mktemp("snapshots"), run_retention_seconds=0)
    with serve(settings, agents=AGENTS) as server, server.client() as client:
        for body in (WORKFLOW, FAILING):
            assert client.post("/api/workflows", json=body).status_code == 201
        for body in CHATS:
            assert client.post("/api/chat-deployments", json=body).status_code == 201
        yield server


def test_native_agent_run_live_replayed_and_stored(live: LiveServer) -> None:
    with live.client() as client:
        posted = _stream(client, "/api/agents/counter/run/stream", {"message": QUESTION + "?"})
        run_id = json.loads(posted.frames[0])["run_id"]
        replayed = _stream(client, f"/api/agents/runs/{run_id}/stream")
        record = client.get(f"/api/agents/runs/{run_id}").json()
    _check("native_agent", {"post": posted.text, "replay": replayed.text, "record": record})


def test_native_orchestration_live_and_replayed(live: LiveServer) -> None:
    with live.client() as client:
        posted = _stream(client, "/api/agents/boss/run/stream", {"message": QUESTION + "?"})
        run_id = json.loads(posted.frames[0])["run_id"]
        replayed = _stream(client, f"/api/agents/runs/{run_id}/stream")
    _check("native_orchestration", {"post": posted.text, "replay": replayed.text})


@pytest.mark.parametrize("workflow", ["chain", "fails"])
def test_native_workflow_and_canvas_live_and_replayed(live: LiveServer, workflow: str) -> None:
    body = {"input": QUESTION}
    with live.client() as client:
        posted = _stream(client, f"/api/workflows/{workflow}/run/stream", body)
        execution_id = json.loads(posted.frames[0])["execution_id"]
        replayed = _stream(client, f"/api/workflows/executions/{execution_id}/stream")
        record = client.get(f"/api/workflows/executions/{execution_id}").json()
        canvas = _stream(client, f"/api/workflows/{workflow}/execute", body)
        canvas_id = json.loads(canvas.frames[0])["executionId"]
        canvas_replay = _stream(client, f"/api/workflows/executions/{canvas_id}/canvas")
    _check(
        f"workflow_{workflow}",
        {
            "post": posted.text,
            "replay": replayed.text,
            "record": record,
            "canvas": canvas.text,
            "canvas_replay": canvas_replay.text,
        },
    )


@pytest.mark.parametrize("slug", ["agent-all", "agent-none", "flow-chat"])
def test_public_chat_with_and_without_the_protocol_header(live: LiveServer, slug: str) -> None:
    body = {"input": QUESTION + "?"}
    with httpx.Client(base_url=live.url, timeout=10) as anonymous:
        opted_in = _stream(anonymous, f"/api/chat/{slug}", body, headers=HEADER)
        legacy = _stream(anonymous, f"/api/chat/{slug}", body)
    _check(f"chat_{slug}", {"header": opted_in.text, "legacy": legacy.text})


class _Body:
    def __init__(self, text: str) -> None:
        self.text = text

    @property
    def frames(self) -> list[str]:
        return [line[len("data: ") :] for line in self.text.split("\n") if line.startswith("data:")]


def _stream(
    client: httpx.Client,
    path: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> _Body:
    """The whole response body of a stream, as text."""
    method = "GET" if body is None else "POST"
    response = client.request(method, path, json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return _Body(response.text)


_IDS = re.compile(r"\b(?:(run|ses|wfx|cnv|ctx)_)?[0-9a-f]{32}\b")
_TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")
_TIME_KEYS = {"ts", "timestamp", "created_at", "finished_at", "started_at", "duration_ms"}


def _check(name: str, captured: dict[str, Any]) -> None:
    """Compare with the snapshot ``name``, ids and times masked consistently."""
    masked = _Mask()(captured)
    path = SNAPSHOTS / f"{name}.json"
    text = json.dumps(masked, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    if os.environ.get("AGENTSTREAM_UPDATE_SNAPSHOTS"):
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no snapshot {path.name}: run with AGENTSTREAM_UPDATE_SNAPSHOTS=1"
    assert json.loads(text) == json.loads(path.read_text(encoding="utf-8"))


class _Mask:
    """Replaces each generated id by a placeholder numbered by first appearance (so two
    frames naming one run still agree), and every time by ``<time>``."""

    def __init__(self) -> None:
        self._ids: dict[str, str] = {}

    def __call__(self, value: Any, key: str | None = None) -> Any:
        if key in _TIME_KEYS and value is not None:
            return "<time>"
        if isinstance(value, dict):
            return {k: self(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str):
            return self._text(value)
        return value

    def _text(self, text: str) -> str:
        text = _IDS.sub(self._id, text)
        text = _TIMES.sub("<time>", text)
        # Frames inside a body: mask the times they carry as numbers too.
        return re.sub(r'"(ts|timestamp)":\s*[0-9.e+]+', r'"\1":"<time>"', text)

    def _id(self, match: re.Match[str]) -> str:
        found = match.group(0)
        if found not in self._ids:
            self._ids[found] = f"<{match.group(1) or 'id'}:{len(self._ids) + 1}>"
        return self._ids[found]
