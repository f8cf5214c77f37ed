"""Every surface streams a run the same way, over real HTTP: a stream started by a POST
belongs to its client, so hanging up cancels the run ("Client cancelled request") and gives
a chat's in-flight slot back; a GET follow only watches, so hanging up leaves the run going.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Request, Response
from starlette.types import Message, Receive, Scope, Send

from agentstream.agents import AgentSpec
from agentstream.events import Event, TextDelta
from agentstream.providers.scripted import ScriptedModel
from agentstream.runtime.tools import Tool
from agentstream.server import create_app
from agentstream.server.streaming import EventStreamResponse, StreamsOutside
from agentstream.server.streams import DONE, _LiveFrames, native
from agentstream.sse import SSEDecoder
from agentstream.views.frames import Frame
from conftest import (
    LiveServer,
    latest_run_id,
    make_settings,
    serve,
    wait_until,
)
from fakes.server import run_app
from fakes.test_app import call_wait_then_answer, wait

CHAT = {"X-Sim-Stream-Protocol": "agent-events-v1"}

WAITS = {
    "id": "waits",
    "blocks": [
        {"id": "start", "type": "start"},
        {"id": "slow", "type": "agent", "agent": "waiter", "input": "go"},
    ],
    "edges": [{"from": "start", "to": "slow"}],
}
"""A workflow whose one block waits on a slow tool: live until cancelled."""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serve(
        make_settings(tmp_path_factory.mktemp("streams")),
        tools=[Tool.from_function(wait)],
        models=[ScriptedModel("waiter", call_wait_then_answer)],
        agents=[AgentSpec(id="waiter", model="waiter", tools=["wait"])],
    ) as server:
        with server.client() as admin:
            admin.post("/api/workflows", json=WAITS).raise_for_status()
            for target in (
                {"agent_id": "waiter"},
                {"workflow_id": "waits", "output_blocks": ["slow"]},
            ):
                slug = "agent-chat" if "agent_id" in target else "workflow-chat"
                deployment = {"slug": slug, "concurrent_runs_per_client": 1, **target}
                admin.post("/api/chat-deployments", json=deployment).raise_for_status()
        yield server


Ending = tuple[str, str | None]
"""A run's (or execution's) status and error."""


def run_ending(live: LiveServer, run_id: str) -> Ending:
    with live.client() as client:
        run = client.get(f"/api/agents/runs/{run_id}").json()
    return run["status"], run["error"]


def execution_ending(live: LiveServer, execution_id: str) -> Ending:
    with live.client() as client:
        record = client.get(f"/api/workflows/executions/{execution_id}").json()
    return record["status"], record["error"]


def newest_execution(live: LiveServer) -> str:
    with live.client() as client:
        newest: str = client.get("/api/workflows/waits/executions").json()[0]["id"]
    return newest


def started(response: httpx.Response) -> tuple[Iterator[bytes], bytes]:
    """The stream's chunks, and its first: by then the run is going. Dropping the iterator
    hangs up."""
    assert response.status_code == 200, response.read()
    chunks = response.iter_bytes()
    return chunks, next(chunks)


Surface = tuple[str, dict[str, Any], dict[str, str], Callable[[LiveServer, httpx.Response], Ending]]

POSTS: dict[str, Surface] = {
    "native agent": (
        "/api/agents/waiter/run/stream",
        {"message": "go"},
        {},
        lambda live, _: run_ending(live, latest_run_id(live, "waiter")),
    ),
    "native workflow": (
        "/api/workflows/waits/run/stream",
        {},
        {},
        lambda live, response: execution_ending(live, response.headers["x-execution-id"]),
    ),
    "canvas": (
        "/api/workflows/waits/execute",
        {},
        {},
        lambda live, response: execution_ending(live, response.headers["x-execution-id"]),
    ),
    "agent chat": (
        "/api/chat/agent-chat",
        {"input": "go"},
        CHAT,
        lambda live, _: run_ending(live, latest_run_id(live, "waiter")),
    ),
    "workflow chat": (
        "/api/chat/workflow-chat",
        {"input": "go"},
        CHAT,
        lambda live, _: execution_ending(live, newest_execution(live)),
    ),
}


@pytest.mark.parametrize("surface", list(POSTS))
def test_hanging_up_a_post_stream_cancels_its_run(live: LiveServer, surface: str) -> None:
    path, body, headers, ending = POSTS[surface]
    with live.client() as client, client.stream("POST", path, json=body, headers=headers) as sent:
        started(sent)
        response = sent

    wait_until(lambda: ending(live, response)[0] != "running")
    assert ending(live, response) == ("cancelled", "Client cancelled request")


@pytest.mark.parametrize("slug", ["agent-chat", "workflow-chat"])
def test_hanging_up_gives_the_chats_slot_back(live: LiveServer, slug: str) -> None:
    path, body, headers, ending = POSTS[slug.replace("-", " ")]
    with live.client() as client:
        with client.stream("POST", path, json=body, headers=headers) as first:
            _held, _ = started(first)  # held: dropping the iterator would hang up
            refused = client.post(path, json=body, headers=headers)
        wait_until(lambda: ending(live, first)[0] != "running")
        with client.stream("POST", path, json=body, headers=headers) as again:
            started(again)
        wait_until(lambda: ending(live, again)[0] != "running")

    assert refused.status_code == 429, "one answer at a time for this client"
    assert again.status_code == 200


FOLLOWS = {
    "native agent": (
        "/api/agents/waiter/run/stream",
        {"message": "go"},
        "/api/agents/runs/{}/stream",
        "/api/agents/runs/{}/cancel",
        "Run cancelled",
    ),
    "native workflow": (
        "/api/workflows/waits/run/stream",
        {},
        "/api/workflows/executions/{}/stream",
        "/api/workflows/executions/{}/cancel",
        "Execution cancelled",
    ),
    "canvas": (
        "/api/workflows/waits/run/stream",
        {},
        "/api/workflows/executions/{}/canvas",
        "/api/workflows/executions/{}/cancel",
        "Execution cancelled",
    ),
}


@pytest.mark.parametrize("surface", list(FOLLOWS))
def test_hanging_up_a_follow_leaves_the_run_going(live: LiveServer, surface: str) -> None:
    path, body, follow, cancel, reason = FOLLOWS[surface]
    with live.client() as client, client.stream("POST", path, json=body) as sent:
        chunks, first = started(sent)
        run_id = sent.headers.get("x-execution-id") or latest_run_id(live, "waiter")
        with client.stream("GET", follow.format(run_id)) as follower:
            _, replayed = started(follower)
        cancelled = client.post(cancel.format(run_id))
        rest = b"".join(chunks)

    assert replayed.startswith(b"id: 1\n")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert b"Client cancelled request" not in first + rest
    assert f'"{reason}"'.encode() in rest, "ended by the cancel endpoint, not by the follower"


@pytest.mark.parametrize("surface", list(POSTS))
def test_a_stream_starts_through_the_middleware(live: LiveServer, surface: str) -> None:
    """The response's start crosses the middleware (its request id); its body does not."""
    path, body, headers, _ = POSTS[surface]
    with (
        live.client() as client,
        client.stream(
            "POST", path, json=body, headers={**headers, "X-Request-Id": "from-the-client"}
        ) as sent,
    ):
        started(sent)
    assert sent.headers["x-request-id"] == "from-the-client"
    assert sent.headers["content-type"] == "text/event-stream; charset=utf-8"


REQUEST = ContextVar("request", default="none")
"""As the request id of a request's log lines."""


async def _never_disconnects() -> Message:
    await asyncio.sleep(10)
    return {"type": "http.disconnect"}


def test_a_streams_body_goes_out_once_the_middleware_has_returned() -> None:
    """``StreamsOutside`` sends the body to the server's own ``send``: a live stream keeps
    none of the middleware's coroutines, nor what they put in the scope, alive, and its
    frames skip their ``send``; the body still runs in the request's context."""
    ended: list[str] = []
    seen: list[str] = []

    class Chunks:
        over = False

        def __init__(self) -> None:
            self.chunks = [b"data: 2\n\n", b"data: 3\n\n"]

        async def next_batch(self) -> bytes:
            seen.append(f"next batch for request {REQUEST.get()}")
            return self.chunks.pop(0)

        def encode(self, batch: bytes) -> bytes:
            self.over = not self.chunks
            return batch

        def close(self) -> None:
            seen.append("frames closed")

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        response = EventStreamResponse(
            Chunks(), first=b"data: 1\n\n", keepalive=5, on_end=lambda: ended.append("end")
        )
        await response(scope, receive, send)

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        scope["fastapi_astack"] = "what the stack keeps for the request"

        async def wrapped(message: Message) -> None:
            seen.append(f"middleware saw {message['type']}")
            await send(message)

        token = REQUEST.set("r1")
        try:
            await endpoint(scope, receive, wrapped)
        finally:
            REQUEST.reset(token)
        seen.append("middleware returned")

    async def server_send(message: Message) -> None:
        seen.append(f"sent {message['type']} {message.get('body', b'')!r}")

    servers_scope: Scope = {"type": "http"}
    asyncio.run(StreamsOutside(middleware)(servers_scope, _never_disconnects, server_send))

    assert seen == [
        "middleware saw http.response.start",
        "sent http.response.start b''",
        "middleware returned",
        "sent http.response.body b'data: 1\\n\\n'",
        "next batch for request r1",
        "sent http.response.body b'data: 2\\n\\n'",
        "next batch for request r1",
        "sent http.response.body b'data: 3\\n\\n'",
        "sent http.response.body b''",
        "frames closed",
    ]
    assert ended == ["end"]
    assert servers_scope == {"type": "http"}, "the connection keeps none of it"


def test_a_stream_the_app_fails_after_is_ended_as_if_its_client_had_left() -> None:
    """The stack raised after the response started (a failing teardown): its body is never
    sent, and what a client's leaving does (cancel the run, give a chat's slot back) is
    done."""
    calls: list[str] = []

    class Frames:
        over = False

        async def next_batch(self) -> bytes:
            calls.append("next batch")
            return b"data: 2\n\n"

        def encode(self, batch: bytes) -> bytes:
            return batch

        def close(self) -> None:
            calls.append("frames closed")

    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        await EventStreamResponse(
            Frames(),
            first=b"data: 1\n\n",
            keepalive=5,
            on_disconnect=lambda: calls.append("disconnect"),
            on_end=lambda: calls.append("end"),
        )(scope, receive, send)
        raise RuntimeError("a teardown failed")

    async def server_send(message: Message) -> None:
        calls.append(message["type"])

    with pytest.raises(RuntimeError, match="a teardown failed"):
        asyncio.run(StreamsOutside(failing)({"type": "http"}, _never_disconnects, server_send))
    assert calls == ["http.response.start", "disconnect", "frames closed", "end"]


class _Viewing:
    """A subscription to a run with one token, then nothing more: ``ended`` says whether
    the run's end was read (or the viewer lost the shared log first)."""

    starts_after = 0
    head = 0

    def __init__(self, ended: bool) -> None:
        self.ended = ended
        self.batches: list[list[Event]] = [
            [TextDelta(run_id="r", seq=1, ts=0.0, step=1, delta="hi")]
        ]
        self.closed = 0

    async def next_batch(self) -> list[Event]:
        return self.batches.pop() if self.batches else []

    def close(self) -> None:
        self.closed += 1


def _body(response: EventStreamResponse) -> list[bytes]:
    """The body pieces ``response`` sends, sent from ``StreamsOutside``."""
    sent: list[bytes] = []

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        await response(scope, receive, send)

    async def server_send(message: Message) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    asyncio.run(StreamsOutside(endpoint)({"type": "http"}, _never_disconnects, server_send))
    return sent


@pytest.mark.parametrize("ended", [True, False], ids=["the run ended", "the shared log lost"])
def test_a_streams_trailer_follows_the_runs_end_only(ended: bool) -> None:
    """``[DONE]`` tells the client the answer is whole: a viewer that lost the shared log
    before the run's end (cluster mode) stops without it, and its client resumes."""
    viewing = _Viewing(ended)
    response = EventStreamResponse(_LiveFrames(viewing, native, trailer=DONE), keepalive=5)
    token = b'data: {"seq":1,"event":"content_delta","delta":"hi"}\n\n'
    assert _body(response) == [token, *([DONE] if ended else []), b""]
    assert viewing.closed


def test_a_viewer_whose_frames_fail_stops_viewing() -> None:
    """A view that raises ends the response; the subscription is closed all the same (an
    open one would keep the run's tokens from being packed)."""
    viewing = _Viewing(ended=True)

    def failing(event: Event) -> list[Frame]:
        raise ValueError("no frame")

    with pytest.raises(ValueError, match="no frame"):
        _body(EventStreamResponse(_LiveFrames(viewing, failing), keepalive=5))
    assert viewing.closed


def test_an_app_an_embedder_adds_http_middleware_to_still_streams(tmp_path: Path) -> None:
    """``@app.middleware("http")`` (Starlette's ``BaseHTTPMiddleware``) ends a response when
    the stack returns: with it, streams are sent from within the stack, as before."""
    settings = make_settings(tmp_path)
    app = create_app(settings)

    @app.middleware("http")
    async def tag(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Any:
        response = await call_next(request)
        response.headers["X-Tagged"] = "yes"
        return response

    key = settings.demo_key_file
    with run_app(app, name="The server", lifespan="on") as url:
        answer = httpx.post(
            f"{url}/api/agents/demo/run/stream",
            headers={"apikey": key.read_text().strip()},
            json={"message": "hi"},
            timeout=30,
        )
    frames = [event.json() for event in SSEDecoder().feed(answer.content)]
    assert answer.headers["x-tagged"] == "yes"
    assert (frames[0]["event"], frames[-1]["event"]) == ("start", "complete")
