"""AG-UI, read by its official client (``@ag-ui/client``'s ``HttpAgent.runAgent`` under
Node, ``tests/js/ag_ui.mjs``), whose own verification must pass: a tool-using run with
reasoning, a failing run, an approval interrupt and its resume; and every event checked
against the official Python package's types."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ag_ui.core import Event as AGUIEvent
from pydantic import TypeAdapter

from conftest import LiveServer, make_settings, read_events, run_node, serve
from test_openai_api import AGENTS, MODELS

EVENTS: TypeAdapter[Any] = TypeAdapter(AGUIEvent)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = make_settings(tmp_path_factory.mktemp("ag-ui"))
    with serve(settings, agents=AGENTS, models=MODELS) as live:
        yield live


def drive(node: str, live: LiveServer, agent: str, *runs: dict[str, Any]) -> dict[str, Any]:
    """The runs, made in turn on one new thread by one HttpAgent."""
    args = {
        "url": f"{live.url}/api/agents/{agent}/ag-ui",
        "key": live.key,
        "threadId": str(uuid.uuid4()),
        "runs": list(runs),
    }
    return run_node(node, "ag_ui.mjs", args)  # type: ignore[no-any-return]


def native_run(live: LiveServer, run_id: str) -> dict[str, Any]:
    with live.client() as http:
        run: dict[str, Any] = http.get(f"/api/agents/runs/{run_id}").json()
    return run


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def test_a_tool_using_run_with_reasoning(node: str, live: LiveServer) -> None:
    wanted = f"run_{uuid.uuid4().hex}"
    read = drive(node, live, "demo", {"message": "What is 17 * 23?", "runId": wanted})
    (run,) = read["runs"]
    assert run["error"] is None
    events = run["events"]
    assert events[0]["type"] == "RUN_STARTED"
    assert events[0]["runId"] == wanted  # the client's id was free: it is the run's
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["outcome"] == {"type": "success"}
    stored = native_run(live, wanted)
    assert events[0]["threadId"] == stored["session_id"]
    assert {"REASONING_START", "REASONING_MESSAGE_CONTENT", "REASONING_END"} <= set(kinds(events))
    assert [k for k in kinds(events) if k.startswith("STEP_")] == [
        "STEP_STARTED",
        "STEP_FINISHED",
    ] * 2
    results = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert [r["content"] for r in results] == [str(c["result"]) for c in stored["tool_calls"]]
    assistant = [m for m in read["messages"] if m["role"] == "assistant"]
    assert [m.get("content") for m in assistant if m.get("content")] == [
        "Let me use the calculator tool.",
        stored["content"],
    ]
    assert "Let me use" not in str(stored["events"]), "a preamble is shown live, never stored"
    assert any(m.get("toolCalls") for m in assistant)
    reasoning = [m["content"] for m in read["messages"] if m["role"] == "reasoning"]
    assert "\n\n".join(reasoning) == stored["reasoning"]


def test_delegations_are_steps_inside_the_agent_s_step(node: str, live: LiveServer) -> None:
    read = drive(node, live, "team", {"message": "What is 6 * 7 and what time is it?"})
    (run,) = read["runs"]
    assert run["error"] is None
    steps = [e["stepName"] for e in run["events"] if e["type"] == "STEP_STARTED"]
    delegations = [name for name in steps if name.startswith("delegate:")]
    assert {name.split(":")[1] for name in delegations} == {"mathematician", "timekeeper"}
    said = "".join(
        e["value"]["delta"]
        for e in run["events"]
        if e["type"] == "CUSTOM" and e["name"] == "entity_text"
    )
    stored = native_run(live, run["events"][0]["runId"])
    finished = [f for f in stored["events"] if f["event"] == "delegation_complete"]
    assert all(f["content"] in said for f in finished)


def test_a_taken_run_id_gets_a_new_one(node: str, live: LiveServer) -> None:
    first = drive(node, live, "demo", {"message": "Write 2 words", "runId": "taken-once"})
    second = drive(node, live, "demo", {"message": "Write 2 words", "runId": "taken-once"})
    assert first["runs"][0]["events"][0]["runId"] == "taken-once"
    assert second["runs"][0]["events"][0]["runId"] != "taken-once"
    assert second["runs"][0]["error"] is None


def test_without_a_run_id_the_server_names_the_run(live: LiveServer) -> None:
    body = {
        "threadId": str(uuid.uuid4()),
        "messages": [{"id": "m1", "role": "user", "content": "Write 2 words"}],
    }
    with live.client() as http, http.stream("POST", "/api/agents/demo/ag-ui", json=body) as r:
        events = [e.json() for e in read_events(r)]
    assert events[0]["runId"].startswith("run_")
    assert native_run(live, events[0]["runId"])["status"] == "completed"


def test_a_failing_run_is_a_run_error(node: str, live: LiveServer) -> None:
    (run,) = drive(node, live, "broken", {"message": "hi"})["runs"]
    assert run["events"][-1]["type"] == "RUN_ERROR"
    assert run["events"][-1]["code"] == "error"
    assert "Internal error" in run["events"][-1]["message"]


def test_an_approval_interrupts_and_resume_continues(node: str, live: LiveServer) -> None:
    read = drive(node, live, "guarded", {"message": "What is 6 * 7?"}, {"resume": "resolved"})
    paused, resumed = read["runs"]
    assert paused["error"] is None
    finished = paused["events"][-1]
    assert finished["type"] == "RUN_FINISHED"
    (interrupt,) = finished["outcome"]["interrupts"]
    assert finished["outcome"]["type"] == "interrupt"
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["toolCallId"] == interrupt["id"]
    assert [i["id"] for i in paused["interrupts"]] == [interrupt["id"]]

    assert resumed["error"] is None
    assert resumed["interrupts"] == []
    assert resumed["events"][0]["runId"] == finished["runId"]  # the same run, going on
    assert resumed["events"][-1]["outcome"] == {"type": "success"}
    stored = native_run(live, finished["runId"])
    assert stored["status"] == "completed"
    assert "42" in stored["content"]
    assert stored["approvals"][0]["decision"] == "approved"


def test_a_cancelled_interrupt_denies_the_call(node: str, live: LiveServer) -> None:
    read = drive(node, live, "guarded", {"message": "What is 6 * 7?"}, {"resume": "cancelled"})
    run_id = read["runs"][0]["events"][-1]["runId"]
    assert read["runs"][1]["events"][-1]["outcome"] == {"type": "success"}
    assert native_run(live, run_id)["approvals"][0]["decision"] == "denied"


@pytest.mark.parametrize("agent", ["demo", "broken", "guarded"])
def test_every_event_is_one_the_protocol_defines(live: LiveServer, agent: str) -> None:
    body = {
        "threadId": str(uuid.uuid4()),
        "runId": str(uuid.uuid4()),
        "messages": [{"id": "m1", "role": "user", "content": "What is 17 * 23?"}],
    }
    with live.client() as http, http.stream("POST", f"/api/agents/{agent}/ag-ui", json=body) as r:
        assert r.status_code == 200
        events = [EVENTS.validate_python(e.json()) for e in read_events(r)]
    assert events[0].type == "RUN_STARTED"
    assert events[-1].type in ("RUN_FINISHED", "RUN_ERROR")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"threadId": "t", "runId": "r"}, "messages"),
        ({"runId": "r", "messages": []}, "threadId"),
        ({"threadId": "t", "runId": "r", "messages": []}, "messages"),
        (
            {
                "threadId": "t",
                "runId": "r",
                "messages": [{"id": "a", "role": "assistant", "content": "hi"}],
            },
            "messages",
        ),
        (
            {
                "threadId": "t",
                "runId": "r",
                "messages": [{"id": "m", "role": "user", "content": "hi"}],
                "resume": [{"interruptId": "nope", "status": "resolved"}],
            },
            "resume",
        ),
    ],
)
def test_bad_input_names_the_field(live: LiveServer, body: dict[str, Any], field: str) -> None:
    with live.client() as http:
        refused = http.post("/api/agents/demo/ag-ui", json=body)
    assert 400 <= refused.status_code < 500
    assert refused.json()["error"]["field"] == field


def test_a_key_is_needed(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url) as http:
        refused = http.post("/api/agents/demo/ag-ui", json={})
    assert refused.status_code == 401
