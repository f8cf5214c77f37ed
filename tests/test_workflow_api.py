"""The native workflow API over real HTTP: definitions, validation errors, the workflow
event stream of a diamond DAG, error edges, conditions, replay, cancel, and restarts."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agentstream.agents import AgentSpec
from agentstream.events import RunFailed
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
from agentstream.runlog import RunLog
from agentstream.runtime.executions import ExecutionManager
from agentstream.runtime.leases import SEAL_GAP
from agentstream.runtime.supervisor import Supervisor
from agentstream.runtime.tools import Tool
from agentstream.sse import ServerSentEvent, SSEDecoder
from agentstream.store import Store
from agentstream.store.database import Database
from agentstream.store.runs import RunQuery
from agentstream.store.workflows import WorkflowStore
from agentstream.views.workflow import WorkflowFrameAdapter
from agentstream.workflows import WorkflowEngine, parse_workflow
from conftest import (
    LiveServer,
    latest_run_id,
    make_settings,
    read_events,
    serve,
    wait_until,
)
from fakes.test_app import call_wait_then_answer, wait
from processes import TAKEOVER_LEASE, server_process

FORWARDED_ONLY = {"content_delta", "reasoning_delta"}


def chatter(request: ModelRequest) -> list[ModelPart]:
    """Six words, streamed ten milliseconds apart: two agents at once interleave."""
    words = request.messages[-1].content.split()[:6]
    return [*(TextPart(f"{word} ") for word in words), TurnEndPart("end_turn")]


def shouter(request: ModelRequest) -> list[ModelPart]:
    """The message in capitals, at once."""
    return [TextPart(request.messages[-1].content.upper()), TurnEndPart("end_turn")]


def coordinate(request: ModelRequest) -> list[ModelPart]:
    """A coordinator: hands the message to all its entities at once, then joins their answers."""
    answers = sorted(json.loads(m.content) for m in request.messages if m.role == "tool")
    if answers:
        return [TextPart("Crew: "), TextPart(" | ".join(answers)), TurnEndPart("end_turn")]
    task = json.dumps({"task": request.messages[-1].content})
    parts: list[ModelPart] = []
    for tool in request.tools:
        call_id = f"call_{tool.name}"
        parts += [
            ToolCallStartPart(call_id, tool.name),
            ToolCallArgsPart(call_id, task),
            ToolCallEndPart(call_id),
        ]
    return [*parts, TurnEndPart("tool_calls")]


AGENTS = [
    AgentSpec(id="talker", model="chatter"),
    AgentSpec(id="waiter", model="scripted-wait", tools=["wait"]),
    AgentSpec(id="shouter", model="shouter"),
    AgentSpec(id="waiter-too", model="scripted-wait", tools=["wait"]),
    AgentSpec(id="crew", model="coordinator", delegates=["talker", "shouter"]),
    AgentSpec(id="stuck", model="coordinator", delegates=["waiter", "waiter-too"]),
]


def serve_workflows(tmp_path: Path, **overrides: Any) -> Any:
    return serve(
        make_settings(tmp_path, run_retention_seconds=0, **overrides),
        tools=[Tool.from_function(wait)],
        models=[
            ScriptedModel("chatter", chatter, delay=0.01),
            ScriptedModel("scripted-wait", call_wait_then_answer),
            ScriptedModel("shouter", shouter),
            ScriptedModel("coordinator", coordinate),
        ],
        agents=AGENTS,
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    with serve_workflows(tmp_path) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    """The same behaviour on both stores."""
    overrides = {}
    if request.param == "postgresql":
        overrides["database_url"] = request.getfixturevalue("postgres_url")
    with serve_workflows(tmp_path, **overrides) as server:
        yield server


def definition(workflow_id: str, blocks: list[dict[str, Any]], edges: list[Any]) -> dict[str, Any]:
    """A definition from blocks and edges; an edge is ``(from, to)`` or a full edge."""
    return {
        "id": workflow_id,
        "blocks": [{"id": "start", "type": "start"}, *blocks],
        "edges": [e if isinstance(e, dict) else {"from": e[0], "to": e[1]} for e in edges],
    }


DIAMOND = definition(
    "diamond",
    [
        {"id": "left", "type": "agent", "agent": "talker", "input": "one two three <start.input>"},
        {"id": "right", "type": "agent", "agent": "talker", "input": "four five six <start.input>"},
        {"id": "join", "type": "template", "template": "<left.content>| <right.content>"},
        {"id": "out", "type": "response", "output": {"answer": "<join.text>"}},
    ],
    [("start", "left"), ("start", "right"), ("left", "join"), ("right", "join"), ("join", "out")],
)

REFUSED_URL = "http://127.0.0.1:9/"
"""Loopback: the HTTP block refuses it (no allow-list), so the block fails deterministically."""


def save(live: LiveServer, body: dict[str, Any]) -> None:
    with live.client() as client:
        response = client.post("/api/workflows", json=body)
    assert response.status_code == 201, response.text


def stream(
    live: LiveServer, workflow_id: str, body: dict[str, Any] | None = None
) -> list[ServerSentEvent]:
    with (
        live.client() as client,
        client.stream(
            "POST", f"/api/workflows/{workflow_id}/run/stream", json=body or {}
        ) as response,
    ):
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        events = read_events(response)
    assert all(e.id is None for e in events), "a POST stream has no id: lines"
    return events


def frames_of(events: list[ServerSentEvent]) -> list[dict[str, Any]]:
    """The frames less their ``seq`` (see ``seqs_of``), so whole frames compare without it."""
    return [{k: v for k, v in e.json().items() if k != "seq"} for e in events]


def seqs_of(events: list[ServerSentEvent]) -> list[int]:
    return [e.json()["seq"] for e in events]


def execution(live: LiveServer, execution_id: str) -> dict[str, Any]:
    with live.client() as client:
        response = client.get(f"/api/workflows/executions/{execution_id}")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def names(frames: list[dict[str, Any]], block_id: str | None = None) -> list[str]:
    return [f["event"] for f in frames if block_id is None or f.get("block_id") == block_id]


def without_repeats(items: list[str]) -> list[str]:
    return [item for i, item in enumerate(items) if i == 0 or items[i - 1] != item]


# --- definitions ---------------------------------------------------------------------------


def test_workflows_are_created_read_listed_replaced_and_deleted(live: LiveServer) -> None:
    with live.client() as client:
        created = client.post("/api/workflows", json=DIAMOND)
        again = client.post("/api/workflows", json=DIAMOND)
        changed = {**DIAMOND, "name": "Diamond"}
        replaced = client.put("/api/workflows/diamond", json=changed)
        mismatched = client.put("/api/workflows/other", json=changed)
        read = client.get("/api/workflows/diamond")
        listed = client.get("/api/workflows")
        deleted = client.delete("/api/workflows/diamond")
        gone = client.get("/api/workflows/diamond")
        deleted_twice = client.delete("/api/workflows/diamond")

    assert created.status_code == 201
    assert created.json()["version"] == 1
    assert created.json()["workflow"]["edges"][0] == {
        "from": "start",
        "to": "left",
        "on": "success",
        "branch": None,
    }
    assert (again.status_code, again.json()["error"]["field"]) == (409, "id")
    assert (replaced.status_code, replaced.json()["version"]) == (200, 2)
    assert (mismatched.status_code, mismatched.json()["error"]["field"]) == (422, "id")
    assert read.json()["workflow"]["name"] == "Diamond"
    assert [w["workflow"]["id"] for w in listed.json()] == ["demo-parallel", "diamond"]
    assert deleted.status_code == 204
    assert gone.status_code == 404
    assert deleted_twice.status_code == 404


def test_of_concurrent_creates_of_one_id_exactly_one_succeeds(live: LiveServer) -> None:
    def create(_: int) -> int:
        with live.client() as client:
            return client.post("/api/workflows", json=DIAMOND).status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = sorted(pool.map(create, range(8)))
    with live.client() as client:
        version = client.get("/api/workflows/diamond").json()["version"]

    assert statuses == [201] + [409] * 7
    assert version == 1


def test_invalid_definitions_are_refused_naming_every_block_at_fault(live: LiveServer) -> None:
    broken = definition(
        "broken",
        [
            {"id": "a", "type": "template", "template": "a"},
            {"id": "b", "type": "template", "template": "b"},
            {"id": "out", "type": "response", "output": "done"},
        ],
        [("start", "a"), ("a", "b"), ("b", "a"), ("b", "ghost"), ("out", "a")],
    )
    unknown_type = definition("typo", [{"id": "c", "type": "teleport"}], [("start", "c")])
    missing = definition(
        "missing",
        [{"id": "t", "type": "template", "template": "<nowhere.text>"}],
        [("start", "t")],
    )
    with live.client() as client:
        many = client.post("/api/workflows", json=broken)
        cycle = client.post(
            "/api/workflows",
            json={**broken, "edges": broken["edges"][:3], "blocks": broken["blocks"][:3]},
        )
        typo = client.put("/api/workflows/typo", json=unknown_type)
        reference = client.post("/api/workflows", json=missing)
        nothing_saved = client.get("/api/workflows")

    assert cycle.status_code == 422
    assert cycle.json()["error"]["field"] in ("blocks.a", "blocks.b"), "names the block"
    assert "part of a cycle" in cycle.json()["error"]["message"]
    assert many.status_code == 422
    error = many.json()["error"]
    assert error["code"] == "invalid_workflow"
    assert error["field"] == "edges.3.to"
    messages = {(i["block_id"], i["field"], i["message"]) for i in error["details"]}
    assert (None, "edges.3.to", "no block 'ghost'") in messages, "every issue, at once"
    assert ("out", "edges.4.from", "a response block ends its branch") in messages
    assert any(
        block in ("a", "b") and "part of a cycle" in message for block, _, message in messages
    )
    assert set(error["details"][0]) == {"block_id", "field", "message"}

    assert typo.status_code == 422
    assert typo.json()["error"]["details"][0]["block_id"] == "c"
    assert "blocks.c" in typo.json()["error"]["field"]

    assert reference.status_code == 422
    assert reference.json()["error"]["field"].startswith("blocks.t")
    assert "nowhere" in reference.json()["error"]["message"]
    assert [w["workflow"]["id"] for w in nothing_saved.json()] == ["demo-parallel"]


# --- streaming -----------------------------------------------------------------------------


def test_a_diamond_streams_both_branches_interleaved_and_ends_complete(
    any_store: LiveServer,
) -> None:
    live = any_store
    save(live, DIAMOND)
    events = stream(live, "diamond", {"input": "go"})
    frames = frames_of(events)
    ids = seqs_of(events)

    assert ids[0] == 1
    assert all(a < b for a, b in itertools.pairwise(ids)), "seqs strictly increase"
    for seq, frame in zip(ids, frames, strict=True):
        model = type(WorkflowFrameAdapter.validate_python({"seq": seq, **frame}))
        assert {"seq", *frame} == set(model.model_fields), "exactly the documented keys"
    execution_id = frames[0]["execution_id"]
    assert frames[0] == {
        "event": "workflow_start",
        "execution_id": execution_id,
        "workflow_id": "diamond",
    }
    answer = "one two three go | four five six go "
    assert frames[-1] == {
        "event": "workflow_complete",
        "execution_id": execution_id,
        "result": {"answer": answer},
    }
    assert names(frames).count("workflow_complete") == 1
    for block, text in (("left", "one two three go "), ("right", "four five six go ")):
        assert without_repeats(names(frames, block)) == [
            "block_started",
            "content_delta",
            "block_chunk",
            "block_output",
            "block_completed",
        ]
        mine = [f for f in frames if f.get("block_id") == block]
        assert "".join(f["delta"] for f in mine if f["event"] == "content_delta") == text
        assert mine[-2] == {"event": "block_output", "block_id": block, "output": {"content": text}}
    deltas = [f["block_id"] for f in frames if f["event"] == "content_delta"]
    first_right, last_right = deltas.index("right"), len(deltas) - deltas[::-1].index("right")
    assert "left" in deltas[first_right:last_right], "the parallel pair runs at once"
    order = [(f["event"], f.get("block_id")) for f in frames]
    join = order.index(("block_started", "join"))
    assert join > order.index(("block_completed", "left"))
    assert join > order.index(("block_completed", "right"))
    assert order[-4:] == [
        ("block_started", "out"),
        ("block_output", "out"),
        ("block_completed", "out"),
        ("workflow_complete", None),
    ]

    record = execution(live, execution_id)
    assert record["status"] == "completed"
    assert record["result"] == {"answer": answer}
    assert record["input"] == "go"
    assert record["workflow_version"] == 1
    assert record["draft"] is False
    persisted = [
        {"seq": e_id, **f}
        for e_id, f in zip(ids, frames, strict=True)
        if f["event"] not in FORWARDED_ONLY
    ]
    assert record["events"] == persisted, "replay: every persisted frame, no deltas"


def test_a_failing_block_short_circuits_the_execution(live: LiveServer) -> None:
    save(
        live,
        definition(
            "fails",
            [
                {"id": "fetch", "type": "http", "url": REFUSED_URL},
                {"id": "out", "type": "response", "output": "<fetch.body>"},
            ],
            [("start", "fetch"), ("fetch", "out")],
        ),
    )
    frames = frames_of(stream(live, "fails"))

    execution_id = frames[0]["execution_id"]
    error = next(f for f in frames if f["event"] == "block_error")
    assert error["block_id"] == "fetch"
    assert error["handled"] is False
    assert "out" not in {f.get("block_id") for f in frames}, "nothing after the failure runs"
    assert frames[-1] == {
        "event": "workflow_error",
        "execution_id": execution_id,
        "error": f"Block 'fetch' failed: {error['error']}",
        "status": "error",
        "block_id": "fetch",
    }
    record = execution(live, execution_id)
    assert (record["status"], record["error"]) == ("error", frames[-1]["error"])


def strict_json(text: str) -> Any:
    """JSON as ``JSON.parse`` reads it: no ``NaN`` or ``Infinity``."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    ("expression", "shown"),
    [
        ("float('inf')", "inf"),
        ("1e308 * 10", "inf"),
        ("float('nan')", "nan"),
        ("[1, {'x': -float('inf')}]", "-inf"),
    ],
)
def test_a_non_finite_result_is_a_block_error_on_both_stores(
    any_store: LiveServer, expression: str, shown: str
) -> None:
    """Streamed and stored as JSON throughout: the block fails, saying why, and the
    execution ends with its terminal frame, live and in the replay."""
    workflow_id = f"infinite-{uuid.uuid4().hex[:8]}"  # the PostgreSQL database is shared
    save(
        any_store,
        definition(
            workflow_id,
            [
                {"id": "f", "type": "function", "expression": expression},
                {"id": "out", "type": "response", "output": "<f.result>"},
            ],
            [("start", "f"), ("f", "out")],
        ),
    )
    frames = [strict_json(e.data) for e in stream(any_store, workflow_id)]

    error = next(f for f in frames if f["event"] == "block_error")
    assert error["block_id"] == "f"
    assert error["error"].startswith("The block's output is not valid JSON: result")
    assert f"{shown} is not a finite number" in error["error"]
    assert frames[-1]["event"] == "workflow_error"
    record = execution(any_store, frames[0]["execution_id"])
    assert record["status"] == "error"
    assert record["events"][-1] | {"seq": None} == frames[-1] | {"seq": None}


def test_an_error_edge_handles_a_failure_and_the_execution_completes(live: LiveServer) -> None:
    save(
        live,
        definition(
            "handled",
            [
                {"id": "fetch", "type": "http", "url": REFUSED_URL},
                {"id": "fallback", "type": "template", "template": "fallback: <fetch.error>"},
                {"id": "out", "type": "response", "output": "<fallback.text>"},
            ],
            [
                ("start", "fetch"),
                {"from": "fetch", "to": "fallback", "on": "error"},
                ("fallback", "out"),
            ],
        ),
    )
    frames = frames_of(stream(live, "handled"))

    error = next(f for f in frames if f["event"] == "block_error")
    assert (error["block_id"], error["handled"]) == ("fetch", True)
    assert names(frames, "fallback") == ["block_started", "block_output", "block_completed"]
    assert frames[-1]["event"] == "workflow_complete"
    assert frames[-1]["result"] == f"fallback: {error['error']}"
    assert execution(live, frames[0]["execution_id"])["status"] == "completed"


def test_a_condition_routes_to_one_branch_and_skips_the_other(live: LiveServer) -> None:
    save(
        live,
        definition(
            "routed",
            [
                {
                    "id": "route",
                    "type": "condition",
                    "branches": [{"name": "big", "when": "start.input > 10"}, {"name": "small"}],
                },
                {"id": "big", "type": "response", "output": "big <start.input>"},
                {"id": "small", "type": "response", "output": "small <start.input>"},
            ],
            [
                ("start", "route"),
                {"from": "route", "to": "big", "branch": "big"},
                {"from": "route", "to": "small", "branch": "small"},
            ],
        ),
    )
    big, small = (
        frames_of(stream(live, "routed", {"input": 42})),
        frames_of(stream(live, "routed", {"input": 3})),
    )

    assert {"event": "block_output", "block_id": "route", "output": {"branch": "big"}} in big
    assert names(big, "small") == ["block_skipped"]
    assert big[-1]["result"] == "big 42"
    assert names(small, "big") == ["block_skipped"]
    assert small[-1]["result"] == "small 3"


def test_an_unknown_workflow_is_404_and_a_bad_body_422(live: LiveServer) -> None:
    save(live, DIAMOND)
    with live.client() as client:
        missing = client.post("/api/workflows/nope/run/stream", json={})
        extra = client.post("/api/workflows/diamond/run/stream", json={"message": "hi"})
        no_execution = client.get("/api/workflows/executions/wfx_nope")
    assert missing.status_code == 404
    assert (extra.status_code, extra.json()["error"]["field"]) == (422, "message")
    assert no_execution.status_code == 404


# --- replay --------------------------------------------------------------------------------


def test_a_finished_execution_replays_its_persisted_frames(live: LiveServer) -> None:
    save(live, DIAMOND)
    events = stream(live, "diamond", {"input": "go"})
    execution_id = events[0].json()["execution_id"]
    persisted = [
        (str(f["seq"]), f)
        for f in map(ServerSentEvent.json, events)
        if f["event"] not in FORWARDED_ONLY
    ]
    url = f"/api/workflows/executions/{execution_id}/stream"
    wait_until(lambda: not _in_log(live, url))

    with live.client() as client:
        whole = client.get(url)
        tail = client.get(url, params={"after": persisted[-3][0]})
        by_header = client.get(url, headers={"Last-Event-ID": persisted[-2][0] or ""})
        past_the_end = client.get(url, params={"after": persisted[-1][0]})

    def decoded(response: httpx.Response) -> list[tuple[str | None, dict[str, Any]]]:
        return [(e.id, e.json()) for e in SSEDecoder().feed(response.content)]

    assert decoded(whole) == persisted
    assert decoded(tail) == persisted[-2:]
    assert decoded(by_header) == persisted[-1:]
    assert past_the_end.status_code == 204


def _in_log(live: LiveServer, url: str) -> bool:
    """Whether the live log still holds the execution (its stream then has deltas)."""
    with live.client() as client:
        body = client.get(url).text
    return "content_delta" in body


def test_a_running_execution_can_be_followed_live_from_a_seq(live: LiveServer) -> None:
    save(live, _waiting())
    with (
        live.client() as client,
        client.stream("POST", "/api/workflows/waits/run/stream", json={}) as response,
    ):
        frames = _until_tool_call(response)
        execution_id = frames[0]["execution_id"]
        with client.stream(
            "GET", f"/api/workflows/executions/{execution_id}/stream", params={"after": 1}
        ) as follower:
            assert follower.status_code == 200
            chunks = follower.iter_bytes()
            decoder = SSEDecoder()
            seen: list[ServerSentEvent] = []
            while not any(e.json()["event"] == "tool_call" for e in seen):
                seen += decoder.feed(next(chunks))
            client.post(f"/api/workflows/executions/{execution_id}/cancel")
            for chunk in chunks:
                seen += decoder.feed(chunk)
    assert int(seen[0].id or 0) == 2
    assert seen[-1].json()["event"] == "workflow_error"
    assert seen[-1].json()["status"] == "cancelled"


# --- cancel --------------------------------------------------------------------------------


def _waiting() -> dict[str, Any]:
    return definition(
        "waits",
        [
            {"id": "slow", "type": "agent", "agent": "waiter", "input": "go"},
            {"id": "out", "type": "response", "output": "<slow.content>"},
        ],
        [("start", "slow"), ("slow", "out")],
    )


def _until_tool_call(response: httpx.Response) -> list[dict[str, Any]]:
    """Read frames until the agent block's slow tool is running."""
    assert response.status_code == 200, response.read()
    decoder = SSEDecoder()
    frames: list[dict[str, Any]] = []
    for chunk in response.iter_bytes():
        frames += [e.json() for e in decoder.feed(chunk)]
        if "tool_call" in names(frames):
            return frames
    raise AssertionError(f"no tool call in {frames}")


def test_cancel_stops_a_running_execution_and_records_it(live: LiveServer) -> None:
    save(live, _waiting())
    with (
        live.client() as client,
        client.stream("POST", "/api/workflows/waits/run/stream", json={}) as response,
    ):
        chunks = response.iter_bytes()  # held: dropping it would close the stream
        decoder = SSEDecoder()
        frames: list[dict[str, Any]] = []
        while "tool_call" not in names(frames):
            frames += [e.json() for e in decoder.feed(next(chunks))]
        execution_id = frames[0]["execution_id"]
        cancelled = client.post(f"/api/workflows/executions/{execution_id}/cancel")
        for chunk in chunks:
            frames += [e.json() for e in decoder.feed(chunk)]
        again = client.post(f"/api/workflows/executions/{execution_id}/cancel")

    assert cancelled.json() == {"execution_id": execution_id, "status": "cancelled"}
    assert (again.status_code, again.json()["error"]["code"]) == (409, "conflict")
    result = next(f for f in frames if f["event"] == "tool_result")
    assert (result["block_id"], result["status"]) == ("slow", "cancelled")
    assert frames[-1] == {
        "seq": frames[-1]["seq"],
        "event": "workflow_error",
        "execution_id": execution_id,
        "error": "Execution cancelled",
        "status": "cancelled",
        "block_id": None,
    }
    assert [f["event"] for f in frames].count("workflow_error") == 1
    record = execution(live, execution_id)
    assert (record["status"], record["error"]) == ("cancelled", "Execution cancelled")
    assert record["events"][-1]["event"] == "workflow_error"


def test_disconnecting_cancels_the_execution(live: LiveServer) -> None:
    save(live, _waiting())
    with (
        live.client() as client,
        client.stream("POST", "/api/workflows/waits/run/stream", json={}) as response,
    ):
        frames = _until_tool_call(response)
    execution_id = frames[0]["execution_id"]

    wait_until(lambda: execution(live, execution_id)["status"] != "running")
    record = execution(live, execution_id)
    assert (record["status"], record["error"]) == ("cancelled", "Client cancelled request")


def test_an_execution_past_its_timeout_ends_with_status_timeout(tmp_path: Path) -> None:
    with serve_workflows(tmp_path, workflow_timeout_seconds=0.5) as live:
        save(live, _waiting())
        frames = frames_of(stream(live, "waits"))
        record = execution(live, frames[0]["execution_id"])
    assert frames[-1]["event"] == "workflow_error"
    assert frames[-1]["error"] == "Execution timed out after 0.5s"
    assert (record["status"], record["error"]) == ("timeout", "Execution timed out after 0.5s")


def test_a_timeout_ends_the_canvas_stream_with_an_error_not_a_cancel(tmp_path: Path) -> None:
    with serve_workflows(tmp_path, workflow_timeout_seconds=0.5) as live:
        save(live, _waiting())
        with live.client() as client:
            response = client.post("/api/workflows/waits/execute", json={})
    types = [event.json()["type"] for event in SSEDecoder().feed(response.content)]
    assert "execution:cancelled" not in types
    last = SSEDecoder().feed(response.content)[-1].json()
    assert (last["type"], last["data"]) == (
        "execution:error",
        {"error": "Execution timed out after 0.5s"},
    )


# --- restarts ------------------------------------------------------------------------------


def test_an_execution_cut_off_by_a_crash_is_marked_interrupted(tmp_path: Path) -> None:
    """On SQLite at once; on PostgreSQL (``make test-postgresql``) once the dead process's
    lease has run out, as for an agent run (test_run_lifecycle)."""
    with server_process(make_settings(tmp_path, lease_seconds=TAKEOVER_LEASE)) as crashed:
        save(crashed.live, _waiting())
        with (
            crashed.live.client() as client,
            client.stream("POST", "/api/workflows/waits/run/stream", json={}) as response,
        ):
            execution_id = _until_tool_call(response)[0]["execution_id"]
            crashed.kill()

    with serve_workflows(tmp_path, lease_seconds=TAKEOVER_LEASE) as restarted:
        wait_until(lambda: execution(restarted, execution_id)["status"] != "running")
        record = execution(restarted, execution_id)
        with restarted.client() as client:
            cancel = client.post(f"/api/workflows/executions/{execution_id}/cancel")
            replay = client.get(f"/api/workflows/executions/{execution_id}/stream")
            canvas = client.get(f"/api/workflows/executions/{execution_id}/canvas")
    stopped = "The server stopped during the run"
    assert (record["status"], record["error"]) == ("interrupted", stopped)
    assert cancel.status_code == 409
    replayed = frames_of(SSEDecoder().feed(replay.content))  # ends as every stream does
    assert names(replayed).count("workflow_error") == 1
    assert replayed[-1] == {
        "event": "workflow_error",
        "execution_id": execution_id,
        "error": stopped,
        "status": "cancelled",
        "block_id": None,
    }
    assert record["events"][-1]["seq"] == record["events"][-2]["seq"] + SEAL_GAP
    last = SSEDecoder().feed(canvas.content)[-1].json()
    assert (last["type"], last["data"]) == ("execution:error", {"error": stopped})


def test_the_demo_workflow_runs_the_demo_agent_twice_at_once(live: LiveServer) -> None:
    frames = frames_of(stream(live, "demo-parallel", {"input": "17 * 23"}))

    started = [f["block_id"] for f in frames if f["event"] == "block_started"]
    assert started[:1] == ["start"]
    assert set(started[1:3]) == {"arithmetic", "clock"}
    calls = [(f["block_id"], f["tool_name"]) for f in frames if f["event"] == "tool_call"]
    assert sorted(calls) == [("arithmetic", "calculator"), ("clock", "current_time")]
    call_ids = sorted(f["tool_call_id"] for f in frames if f["event"] == "tool_call")
    assert call_ids == ["arithmetic:call_2_1", "clock:call_2_1"], (
        "the model numbers calls per run: in the execution each is scoped to its block"
    )
    assert frames[-1]["event"] == "workflow_complete"
    assert frames[-1]["result"]["report"].startswith("The answer is 391.\n")


def test_tool_call_ids_are_unique_in_the_canvas_and_the_chat_of_an_execution(
    live: LiveServer,
) -> None:
    """The two agent blocks of ``demo-parallel`` each make their run's first call, which the
    offline model numbers alike: the page must still show two tools, not one."""
    with live.client() as client:
        canvas = client.post("/api/workflows/demo-parallel/execute", json={"input": "17 * 23"})
        chat = client.post(
            "/api/chat/two-questions",
            json={"input": "17 * 23"},
            headers={"X-Sim-Stream-Protocol": "agent-events-v1"},
        )
    canvas_tools = [
        (f["data"]["phase"], f["data"]["id"])
        for f in (e.json() for e in SSEDecoder().feed(canvas.content))
        if f["type"] == "stream:tool"
    ]
    *chat_frames, final, _ = (e.json() for e in SSEDecoder().feed(chat.content))
    chat_tools = [(f["phase"], f["id"]) for f in chat_frames if f.get("event") == "tool"]
    expected = ["arithmetic:call_2_1", "clock:call_2_1"]
    for tools in (canvas_tools, chat_tools):
        assert sorted(call_id for phase, call_id in tools if phase == "start") == expected
        assert sorted(call_id for phase, call_id in tools if phase == "end") == expected
    assert sorted(c["id"] for c in final["data"]["output"]["toolCalls"]) == expected


# --- orchestration blocks ------------------------------------------------------------------


def _orchestrating(workflow_id: str, coordinator: str) -> dict[str, Any]:
    return definition(
        workflow_id,
        [
            {
                "id": "team",
                "type": "orchestration",
                "orchestration": coordinator,
                "input": "<start.input>",
            },
            {"id": "out", "type": "response", "output": "<team.content>"},
        ],
        [("start", "team"), ("team", "out")],
    )


def get_run(live: LiveServer, run_id: str) -> dict[str, Any]:
    with live.client() as client:
        response = client.get(f"/api/agents/runs/{run_id}")
    assert response.status_code == 200, response.text
    run: dict[str, Any] = response.json()
    return run


def entity_runs(coordinator: dict[str, Any]) -> dict[str, str]:
    """The run of each entity a coordinator's run delegated to, by entity."""
    events = coordinator["events"]
    return {e["entity"]: e["entity_run_id"] for e in events if e["event"] == "delegation_start"}


def test_an_orchestration_block_answers_with_the_coordinators_synthesis(
    live: LiveServer,
) -> None:
    save(live, _orchestrating("crewed", "crew"))
    frames = frames_of(stream(live, "crewed", {"input": "north wall shut"}))

    synthesis = "Crew: NORTH WALL SHUT | north wall shut "
    assert frames[-1]["event"] == "workflow_complete"
    assert frames[-1]["result"] == synthesis
    mine = [f for f in frames if f.get("block_id") == "team"]
    assert mine[-2] == {
        "event": "block_output",
        "block_id": "team",
        "output": {"content": synthesis},
    }
    content = "".join(f["delta"] for f in mine if f["event"] == "content_delta")
    assert content == synthesis, "entity text is not the block's content"
    results = {f["tool_name"]: f["result"] for f in mine if f["event"] == "tool_result"}
    assert results == {
        "delegate_to_talker": "north wall shut ",
        "delegate_to_shouter": "NORTH WALL SHUT",
    }, "each delegation is a tool call of the block, its result the entity's answer"

    coordinator = get_run(live, latest_run_id(live, "crew"))
    assert (coordinator["status"], coordinator["content"]) == ("completed", synthesis)
    assert coordinator["input"] == "north wall shut"
    execution_id = frames[0]["execution_id"]
    assert coordinator["parent_run_id"] == execution_id, "the execution started it"
    runs = entity_runs(coordinator)
    assert set(runs) == {"talker", "shouter"}
    for entity, run_id in runs.items():
        run = get_run(live, run_id)
        assert (run["agent_id"], run["status"]) == (entity, "completed")
        assert run["content"] == results[f"delegate_to_{entity}"]
        assert run["parent_run_id"] == coordinator["id"], "the coordinator started it"
    with live.client() as client:
        started = client.get("/api/agents/runs", params={"parent_run_id": execution_id}).json()
        delegated = client.get("/api/agents/runs", params={"parent_run_id": coordinator["id"]})
    assert [r["id"] for r in started["runs"]] == [coordinator["id"]]
    assert {r["id"] for r in delegated.json()["runs"]} == set(runs.values())


def test_an_orchestration_block_refuses_an_agent_that_delegates_to_no_one(
    live: LiveServer,
) -> None:
    save(live, _orchestrating("solo", "talker"))
    frames = frames_of(stream(live, "solo", {"input": "hi"}))

    error = next(f for f in frames if f["event"] == "block_error")
    assert (error["block_id"], error["error"]) == (
        "team",
        "Agent 'talker' is not an orchestration: it delegates to no one",
    )
    assert frames[-1]["event"] == "workflow_error"
    with pytest.raises(AssertionError, match="no run of talker"):
        latest_run_id(live, "talker")


def test_cancelling_the_workflow_mid_orchestration_cancels_coordinator_and_entities(
    live: LiveServer,
) -> None:
    save(live, _orchestrating("stalled", "stuck"))
    with (
        live.client() as client,
        client.stream(
            "POST", "/api/workflows/stalled/run/stream", json={"input": "go"}
        ) as response,
    ):
        chunks = response.iter_bytes()  # held: dropping it would close the stream
        decoder = SSEDecoder()
        frames: list[dict[str, Any]] = []
        while names(frames).count("tool_call") < 2:
            frames += [e.json() for e in decoder.feed(next(chunks))]
        execution_id = frames[0]["execution_id"]
        coordinator_id = latest_run_id(live, "stuck")
        wait_until(lambda: len(entity_runs(get_run(live, coordinator_id))) == 2)
        runs = entity_runs(get_run(live, coordinator_id))
        wait_until(lambda: all(_in_tool(get_run(live, run_id)) for run_id in runs.values()))
        cancelled = client.post(f"/api/workflows/executions/{execution_id}/cancel")
        for chunk in chunks:
            frames += [e.json() for e in decoder.feed(chunk)]

    assert cancelled.json() == {"execution_id": execution_id, "status": "cancelled"}
    assert frames[-1]["event"] == "workflow_error"
    assert frames[-1]["status"] == "cancelled"
    ends = [(f["tool_name"], f["status"]) for f in frames if f["event"] == "tool_result"]
    assert sorted(ends) == [
        ("delegate_to_waiter", "cancelled"),
        ("delegate_to_waiter-too", "cancelled"),
    ]
    # The block waited for the coordinator's run to end, which waited for its entities'.
    ended = execution(live, execution_id)["finished_at"]
    coordinator = get_run(live, coordinator_id)
    assert (coordinator["status"], coordinator["error"]) == (
        "cancelled",
        "Cancelled with its workflow execution",
    )
    assert coordinator["finished_at"] <= ended
    for run_id in runs.values():
        entity = get_run(live, run_id)
        assert (entity["status"], entity["error"]) == (
            "cancelled",
            "Cancelled with its coordinator's run",
        )
        assert [(c["name"], c["status"]) for c in entity["tool_calls"]] == [("wait", "cancelled")]
        assert entity["finished_at"] <= coordinator["finished_at"]


def _in_tool(run: dict[str, Any]) -> bool:
    """The run is going, inside its one tool call."""
    return run["status"] == "running" and [c["status"] for c in run["tool_calls"]] == [None]


# --- the execution manager -----------------------------------------------------------------


class RecordingThenWaiting(WorkflowStore):
    """Records an execution, then holds the starter until told to go on."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.recorded = anyio.Event()
        self.go_on = anyio.Event()

    async def create_execution(self, *args: Any, **kwargs: Any) -> None:
        await super().create_execution(*args, **kwargs)
        self.recorded.set()
        await self.go_on.wait()


@pytest.mark.anyio
async def test_a_start_cancelled_once_recorded_still_runs_the_execution_to_a_truthful_end(
    tmp_path: Path,
) -> None:
    store = await Store.open(make_settings(tmp_path).database)
    workflows = RecordingThenWaiting(store.db)
    flow = parse_workflow(
        definition("echo", [{"id": "out", "type": "response", "output": 1}], [("start", "out")])
    )
    try:
        async with Supervisor(RunLog()) as supervisor:
            executions = ExecutionManager(
                engine=WorkflowEngine(), store=workflows, supervisor=supervisor, timeout_seconds=60
            )
            async with anyio.create_task_group() as starter:
                starter.start_soon(executions.start, flow)
                await workflows.recorded.wait()
                starter.cancel_scope.cancel()  # the client went away
                workflows.go_on.set()
            [record] = await workflows.list_executions(RunQuery(workflow_id="echo"))
            assert record.id in supervisor.log, "recorded, so started"
            following = supervisor.log.subscribe(record.id)
            with anyio.fail_after(10):
                events = [event async for event in following]
        assert isinstance(events[-1], RunFailed)
        assert events[-1].status == "cancelled"
        stored = await workflows.get_execution(record.id)
        assert stored is not None
        assert stored.status == "cancelled"
    finally:
        await store.close()
