"""Every surface across the processes of a cluster: a run started on one process is
followed live from the other (``GET …`` with ``Last-Event-ID`` or ``?after=``) in the frames
of that surface, exactly as the starting client got them, and cancelled through the other.
Native agent runs are in ``test_cluster.py``; here the native workflow API, the canvas and
the public chat."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from agentstream.sse import ServerSentEvent
from agentstream.views.canvas import LIVE_ONLY
from cluster_fixtures import events, posted, rest, until
from fakes.test_app import COUNTED
from processes import ServerProcess


def one_agent_block(workflow_id: str, block_id: str, agent: str) -> dict[str, Any]:
    """A workflow of one block running ``agent`` on the workflow's input."""
    block = {"id": block_id, "type": "agent", "agent": agent, "input": "<start.input>"}
    return {
        "id": workflow_id,
        "blocks": [{"id": "start", "type": "start"}, block],
        "edges": [{"from": "start", "to": block_id}],
    }


COUNTING = one_agent_block("counting", "count", "counter")
"""Sixty tokens from an agent block, 50 ms apart: long enough to join halfway."""

WAITING = one_agent_block("waiting", "wait", "waiter")
"""An agent block whose tool waits 30 s."""

COUNTED_TEXT = "".join(f"{n} " for n in range(1, COUNTED + 1))
V1 = {"X-Sim-Stream-Protocol": "agent-events-v1"}


@pytest.fixture
def workflows(two: list[ServerProcess]) -> list[ServerProcess]:
    """The two processes, with the workflows saved (in the database both use)."""
    with two[0].live.client() as client:
        for definition in (COUNTING, WAITING):
            created = client.post("/api/workflows", json=definition)
            assert created.status_code == 201, created.text
    return two


@pytest.fixture
def chats(two: list[ServerProcess]) -> list[ServerProcess]:
    """The two processes, with ``counting`` and ``waiting`` chats deployed."""
    with two[0].live.client() as client:
        for deployment in (
            {"slug": "counting", "agent_id": "counter"},
            {"slug": "waiting", "agent_id": "waiter", "include_tool_calls": True},
        ):
            created = client.post("/api/chat-deployments", json=deployment)
            assert created.status_code == 201, created.text
    return two


def frames_until(
    stream: Iterator[ServerSentEvent], stop: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The next frames, up to and with the first for which ``stop`` holds."""
    frames = []
    for event in stream:
        frames.append(event.json())
        if stop(frames[-1]):
            break
    return frames


def followed(
    client: httpx.Client, path: str, after: int, *, header: bool = True
) -> list[ServerSentEvent]:
    """The whole stream of a GET follow from after ``after``: with ``Last-Event-ID``, or
    ``?after=``."""
    if header:
        request = client.stream("GET", path, headers={"Last-Event-ID": str(after)})
    else:
        request = client.stream("GET", path, params={"after": after})
    with request as response:
        assert response.status_code == 200, response.read()
        return list(events(response))


def test_a_workflow_execution_is_followed_live_from_the_other_process(
    workflows: list[ServerProcess],
) -> None:
    a, b = workflows
    with posted(a, b, "/api/workflows/counting/run/stream", {"input": "go"}) as post:
        seen = frames_until(post.events, lambda f: f.get("delta") == "10 ")
        execution_id, joined_at = seen[0]["execution_id"], seen[-1]["seq"]
        path = f"/api/workflows/executions/{execution_id}/stream"
        live = followed(post.on_b, path, joined_at)
        everything = seen + rest(post.events)
        # and once it is over, from its last token, with ?after=
        last_delta = max(f["seq"] for f in everything if f["event"] == "content_delta")
        late = followed(post.on_b, path, last_delta, header=False)

    assert everything[-1]["event"] == "workflow_complete"
    deltas = [f["delta"] for f in everything if f["event"] == "content_delta"]
    assert "".join(deltas) == COUNTED_TEXT
    for after, got in ((joined_at, live), (last_delta, late)):
        assert [e.json() for e in got] == [f for f in everything if f["seq"] > after]
        assert [e.id for e in got] == [str(e.json()["seq"]) for e in got]
    assert late[-1].json()["event"] == "workflow_complete"


def test_the_canvas_of_an_execution_is_followed_from_the_other_process_frame_for_frame(
    workflows: list[ServerProcess],
) -> None:
    """Joined on the other process mid-run, the canvas gives the frames from then on, the
    live-only stream:* frames for what happens after it connected only (spec 000); asked
    for the full history, every frame a viewer that watched got."""
    a, b = workflows
    with posted(a, b, "/api/workflows/counting/execute", {"input": "go"}) as post:
        seen = frames_until(post.events, lambda f: f["data"].get("chunk") == "10 ")
        execution_id, joined_at = seen[0]["executionId"], seen[-1]["eventId"]
        path = f"/api/workflows/executions/{execution_id}/canvas"
        live = followed(post.on_b, path, joined_at)
        everything = seen + rest(post.events)
        last_chunk = max(f["eventId"] for f in everything if f["type"] == "stream:chunk")
        late = followed(post.on_b, path, last_chunk, header=False)
        # After its last token the canvas still owes the block's stream:done, which only
        # a view that saw the tokens knows about.
        late_full = followed(post.on_b, f"{path}?full_history=1", last_chunk)

    assert [f["type"] for f in everything][-3:] == [
        "stream:done",
        "block:completed",
        "execution:completed",
    ]
    chunks = [f["data"]["chunk"] for f in everything if f["type"] == "stream:chunk"]
    assert "".join(chunks) == COUNTED_TEXT
    after_joining = [f for f in everything if f["eventId"] > joined_at]
    streamed = [e.json() for e in live if e.json()["type"] in LIVE_ONLY]
    assert streamed, "the tokens after it connected came live"
    assert streamed == [f for f in after_joining if f["type"] in LIVE_ONLY][-len(streamed) :]
    assert [e.json() for e in live if e.json()["type"] not in LIVE_ONLY] == [
        f for f in after_joining if f["type"] not in LIVE_ONLY
    ]
    assert [e.json()["type"] for e in late] == ["block:completed", "execution:completed"]
    assert [e.json() for e in late_full] == [f for f in everything if f["eventId"] > last_chunk]
    for got in (live, late, late_full):
        assert [e.id for e in got] == [str(e.json()["eventId"]) for e in got]


def test_a_workflow_execution_is_cancelled_through_the_other_process(
    workflows: list[ServerProcess],
) -> None:
    a, b = workflows
    with posted(a, b, "/api/workflows/waiting/run/stream", {"input": "go"}) as post:
        execution_id = until(post.events, "tool_call")[0]["execution_id"]
        cancelled = post.on_b.post(f"/api/workflows/executions/{execution_id}/cancel")
        after = rest(post.events)
        again = post.on_b.post(f"/api/workflows/executions/{execution_id}/cancel")
        record = post.on_b.get(f"/api/workflows/executions/{execution_id}").json()

    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json() == {"execution_id": execution_id, "status": "cancelled"}
    [settled] = [f for f in after if f["event"] == "tool_result"]
    assert settled["status"] == "cancelled"
    assert after[-1] == {
        "event": "workflow_error",
        "execution_id": execution_id,
        "error": "Execution cancelled",
        "status": "cancelled",
        "block_id": None,
        "seq": after[-1]["seq"],
    }
    assert record["status"] == "cancelled"
    assert record["events"][-1] == after[-1], "stored as its viewers saw it"
    assert again.status_code == 409, "it has ended"


def answer_path(posted: httpx.Response, slug: str) -> tuple[str, dict[str, str]]:
    """Where to follow the answer a chat message streams, from its headers."""
    path = f"/api/chat/{slug}/runs/{posted.headers['x-run-id']}/stream"
    return path, {"conversationId": posted.headers["x-conversation-id"]}


def test_a_chat_answer_is_followed_and_resumed_on_the_other_process(
    chats: list[ServerProcess],
) -> None:
    a, b = chats
    with (
        httpx.Client(base_url=a.live.url, timeout=10) as on_a,
        httpx.Client(base_url=b.live.url, timeout=10) as on_b,
        on_a.stream("POST", "/api/chat/counting", json={"input": "go"}, headers=V1) as posted,
    ):
        from_a = events(posted)
        seen = [next(from_a).json() for _ in range(10)]
        path, params = answer_path(posted, "counting")
        # joining halfway: a legacy client, and one that drops after 20 frames and resumes
        with on_b.stream("GET", path, params=params) as legacy_follow:
            with on_b.stream("GET", path, params=params, headers=V1) as first:
                part = list(itertools.islice(events(first), 20))
            with on_b.stream(
                "GET", path, params=params, headers={**V1, "Last-Event-ID": part[-1].id or ""}
            ) as second:
                resumed = part + list(events(second))
            legacy = list(events(legacy_follow))
        everything = seen + rest(from_a)

    assert everything[-2:] == [
        {
            "event": "final",
            "data": {
                "success": True,
                "conversationId": posted.headers["x-conversation-id"],
                "output": {"content": COUNTED_TEXT, "toolCalls": []},
            },
        },
        "[DONE]",
    ]
    assert "".join(f["chunk"] for f in everything if "chunk" in f) == COUNTED_TEXT
    assert [e.json() for e in resumed] == everything, "no frame missing, none twice"
    chunk_ids = [int(e.id or "") for e in resumed if "chunk" in e.json()]
    assert chunk_ids == sorted(set(chunk_ids)), "one id per token, increasing"
    assert second.headers["x-sim-stream-protocol"] == "agent-events-v1"
    assert [e.json() for e in legacy] == [
        {"blockId": "counter", "chunk": COUNTED_TEXT},
        everything[-2],
        "[DONE]",
    ]


def test_a_chat_client_leaving_cancels_the_answer_for_its_followers_on_the_other_process(
    chats: list[ServerProcess],
) -> None:
    a, b = chats
    with (
        httpx.Client(base_url=a.live.url, timeout=10) as on_a,
        httpx.Client(base_url=b.live.url, timeout=10) as on_b,
    ):
        visitor = contextlib.ExitStack()
        with visitor:
            posted = visitor.enter_context(
                on_a.stream("POST", "/api/chat/waiting", json={"input": "go"}, headers=V1)
            )
            frames_until(events(posted), lambda f: f.get("phase") == "start")
            path, params = answer_path(posted, "waiting")
            with on_b.stream("GET", path, params=params, headers=V1) as following:
                from_b = events(following)
                before = frames_until(from_b, lambda f: f.get("phase") == "start")
                visitor.close()  # Stop: the run on A is cancelled, B's follower sees it end
                after = rest(from_b)
        with b.live.client() as admin:
            run = admin.get(f"/api/agents/runs/{posted.headers['x-run-id']}").json()

    call = before[-1]["id"]
    assert after == [
        {
            "blockId": "waiter",
            "event": "tool",
            "phase": "end",
            "id": call,
            "name": "wait",
            "status": "cancelled",
        },
        {"event": "error", "error": "Client cancelled request"},
        "[DONE]",
    ]
    assert (run["status"], run["error"]) == ("cancelled", "Client cancelled request")
