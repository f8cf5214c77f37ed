"""The AI SDK's UI message stream, read by the SDK itself (``ai@6``'s
``DefaultChatTransport`` under Node, ``tests/js/ai_sdk.mjs``): every chunk passes the SDK's
schema, and the message it assembles is the stored run's. Tools with reasoning, a failure,
an approval and its decision, a dropped connection resumed, and Stop."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from conftest import LiveServer, make_settings, run_node, serve, wait_for_status
from test_openai_api import AGENTS, COUNTED, MODELS


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = make_settings(tmp_path_factory.mktemp("ai-sdk"))
    with serve(settings, agents=AGENTS, models=MODELS) as live:
        yield live


def user(text: str) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:8]}",
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }


def send(
    node: str, live: LiveServer, agent: str, chat_id: str, messages: list[Any], **more: Any
) -> dict[str, Any]:
    api = f"{live.url}/api/agents/{agent}/ui-messages"
    args = {"command": "send", "api": api, "key": live.key, "chatId": chat_id, "messages": messages}
    return run_node(node, "ai_sdk.mjs", {**args, **more})  # type: ignore[no-any-return]


def reconnect(node: str, live: LiveServer, agent: str, chat_id: str) -> dict[str, Any]:
    api = f"{live.url}/api/agents/{agent}/ui-messages"
    args = {"command": "reconnect", "api": api, "key": live.key, "chatId": chat_id}
    return run_node(node, "ai_sdk.mjs", args)  # type: ignore[no-any-return]


def native_run(live: LiveServer, run_id: str) -> dict[str, Any]:
    with live.client() as http:
        run: dict[str, Any] = http.get(f"/api/agents/runs/{run_id}").json()
    return run


def texts(message: dict[str, Any]) -> list[str]:
    return [part["text"] for part in message["parts"] if part["type"] == "text"]


def test_a_tool_using_answer_with_reasoning(node: str, live: LiveServer) -> None:
    read = send(node, live, "demo", "chat-tools", [user("What is 17 * 23?")])
    assert read["error"] is None
    message = read["message"]
    run = native_run(live, message["id"])
    assert run["session_id"] == "chat-tools"
    kinds = [chunk["type"] for chunk in read["chunks"]]
    assert kinds[:2] == ["start", "start-step"]
    assert kinds[-2:] == ["finish-step", "finish"]
    assert read["chunks"][-1]["finishReason"] == "stop"
    assert texts(message) == ["Let me use the calculator tool.", run["content"]]
    assert "Let me use" not in str(run["events"]), "a preamble is shown live, never stored"
    reasoning = [part["text"] for part in message["parts"] if part["type"] == "reasoning"]
    assert "\n\n".join(reasoning) == run["reasoning"]
    tools = [part for part in message["parts"] if part["type"] == "dynamic-tool"]
    assert [(t["toolName"], t["state"], t["output"]) for t in tools] == [
        ("calculator", "output-available", call["result"]) for call in run["tool_calls"]
    ]
    assert all(tool["providerExecuted"] for tool in tools)


def test_the_stream_is_what_the_sdk_expects_on_the_wire(live: LiveServer) -> None:
    body = {"id": "chat-wire", "messages": [user("Write 3 words")], "trigger": "submit-message"}
    with live.client() as http:
        answer = http.post("/api/agents/demo/ui-messages", json=body)
    assert answer.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert answer.headers["x-accel-buffering"] == "no"
    assert answer.text.endswith("data: [DONE]\n\n")


def test_a_stream_that_ended_before_it_was_read_still_ends_with_done(live: LiveServer) -> None:
    body = {"id": "chat-fast", "messages": [user("hi")]}
    with live.client() as http:
        failed = http.post("/api/agents/broken/ui-messages", json=body)
    assert failed.text.endswith("data: [DONE]\n\n")
    assert '"type":"error"' in failed.text


def test_a_decision_on_an_unknown_call_is_refused(node: str, live: LiveServer) -> None:
    question = user("What is 6 * 7?")
    message = send(node, live, "guarded", "chat-unknown", [question])["message"]
    tool = next(part for part in message["parts"] if part["type"] == "dynamic-tool")
    tool["state"] = "approval-responded"
    tool["approval"] = {"id": "call_nope", "approved": True}
    with live.client() as http:
        refused = http.post(
            "/api/agents/guarded/ui-messages",
            json={"id": "chat-unknown", "messages": [question, message]},
        )
        elsewhere = http.post(
            "/api/agents/demo/ui-messages",
            json={"id": "chat-unknown", "messages": [question, message]},
        )
    assert refused.status_code == 404
    assert refused.json()["error"]["field"] == "messages"
    assert elsewhere.status_code == 404  # the answer is not the demo agent's


def test_a_failure_is_an_error_chunk(node: str, live: LiveServer) -> None:
    read = send(node, live, "broken", "chat-broken", [user("hi")])
    assert read["chunks"][-1]["type"] == "error"
    assert read["error"] == read["chunks"][-1]["errorText"]
    assert "Internal error" in read["error"]


def test_an_approval_is_asked_and_the_decision_continues_the_answer(
    node: str, live: LiveServer
) -> None:
    question = user("What is 6 * 7?")
    asked = send(node, live, "guarded", "chat-guarded", [question])
    assert asked["chunks"][-1] == {"type": "finish", "finishReason": "tool-calls"}
    message = asked["message"]
    tool = next(part for part in message["parts"] if part["type"] == "dynamic-tool")
    assert tool["state"] == "approval-requested"
    # What useChat's addToolApprovalResponse does to the message, then sends it.
    tool["state"] = "approval-responded"
    tool["approval"] = {**tool["approval"], "approved": True}
    answered = send(
        node,
        live,
        "guarded",
        "chat-guarded",
        [question, message],
        message=message,
        messageId=message["id"],
    )
    assert answered["error"] is None
    assert answered["chunks"][0] == {"type": "start", "messageId": message["id"]}
    final = answered["message"]
    run = native_run(live, message["id"])
    assert run["status"] == "completed"
    assert texts(final)[-1] == run["content"]
    assert "42" in run["content"]
    assert [a["decided_by"] for a in run["approvals"]] == ["demo"]


def test_a_dropped_connection_resumes_from_the_message_s_start(node: str, live: LiveServer) -> None:
    dropped = send(node, live, "counter", "chat-drop", [user("count")], dropAfter=20)
    assert len(dropped["chunks"]) == 20
    resumed = reconnect(node, live, "counter", "chat-drop")
    assert resumed["error"] is None
    assert resumed["chunks"][:3] == dropped["chunks"][:3]  # from the start of the message
    assert "".join(texts(resumed["message"])) == "".join(COUNTED)
    run = wait_for_status(live, resumed["message"]["id"])
    assert run["status"] == "completed"  # leaving did not stop it
    assert reconnect(node, live, "counter", "chat-drop")["chunks"] == []  # 204: nothing going


def test_stop_ends_the_answer(node: str, live: LiveServer) -> None:
    send(node, live, "talker", "chat-stop", [user("talk")], dropAfter=5)
    with live.client() as http:
        stopped = http.post("/api/agents/talker/ui-messages/chat-stop/stop")
        again = http.post("/api/agents/talker/ui-messages/chat-stop/stop")
    assert stopped.status_code == 200
    assert stopped.json()["status"] == "cancelled"
    assert again.status_code == 409
    assert reconnect(node, live, "talker", "chat-stop")["chunks"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"id": "c", "messages": []}, "messages"),
        ({"id": "c", "messages": [{"id": "m", "role": "user", "parts": []}]}, "messages"),
        ({"id": "c", "messages": [user("hi")], "trigger": "regenerate-message"}, "trigger"),
        ({"id": "", "messages": [user("hi")]}, "id"),
    ],
)
def test_bad_requests_name_the_field(live: LiveServer, body: dict[str, Any], field: str) -> None:
    with live.client() as http:
        refused = http.post("/api/agents/demo/ui-messages", json=body)
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == field


def test_a_key_is_needed(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url) as http:
        refused = http.post(
            "/api/agents/demo/ui-messages", json={"id": "c", "messages": [user("hi")]}
        )
        resume = http.get("/api/agents/demo/ui-messages/c/stream")
    assert (refused.status_code, resume.status_code) == (401, 401)
