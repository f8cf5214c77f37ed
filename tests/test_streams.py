"""Every surface streams a run the same way, over real HTTP: a stream started by a POST
belongs to its client, so hanging up cancels the run ("Client cancelled request") and gives
a chat's in-flight slot back; a GET follow only watches, so hanging up leaves the run going.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
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
from agentstream.providers.base import ModelPart, ModelRequest, TextPart, TurnEndPart
from agentstream.providers.scripted import ScriptedModel
from agentstream.runlog import RunLog, Take
from agentstream.runtime.tools import Tool
from agentstream.server import create_app, streaming, streams
from agentstream.server.streaming import EventStreamResponse, StreamsOutside
from agentstream.server.streams import DONE, _LiveFrames, encode_events, native
from agentstream.sse import SSEDecoder
from agentstream.views.frames import Frame
from conftest import (
    LiveServer,
    latest_run_id,
    make_settings,
    serve,
    stream_frames,
    wait_for_status,
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


WIDE_TOKENS = 300


def _wide(request: ModelRequest) -> list[ModelPart]:
    """An answer of ``WIDE_TOKENS`` tokens of 32 KiB each, numbered: about 10 MB, more than
    the sockets between a server and its client hold."""
    parts: list[ModelPart] = [
        TextPart(f"{i:05}" + "x" * (32 * 1024 - 5)) for i in range(WIDE_TOKENS)
    ]
    return [*parts, TurnEndPart("end_turn")]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serve(
        make_settings(tmp_path_factory.mktemp("streams")),
        tools=[Tool.from_function(wait)],
        models=[
            ScriptedModel("waiter", call_wait_then_answer),
            ScriptedModel("wide", _wide),
        ],
        agents=[
            AgentSpec(id="waiter", model="waiter", tools=["wait"]),
            AgentSpec(id="wide", model="wide"),
        ],
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

        def write_through(self, write: Callable[[bytes], bool]) -> None:
            raise AssertionError("this test's send is not one to write through to")

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

        def write_through(self, write: Callable[[bytes], bool]) -> None:
            raise AssertionError("this test's send is not one to write through to")

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

    async def next_batch(self, take: Take | None = None) -> list[Event]:
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


class _Client:
    """A server's ``send`` that, like uvicorn's, waits only while the client does not read
    (flow control): each body piece sent, with the task it went out in."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.reading.set()
        self.failing = False
        self.sent: list[tuple[bytes, str]] = []

    async def send(self, message: Message) -> None:
        await self.reading.wait()
        if self.failing:
            raise RuntimeError("the send failed")
        if message["type"] == "http.response.body":
            task = asyncio.current_task()
            self.sent.append((message["body"], task.get_name() if task else ""))


def _token(seq: int) -> TextDelta:
    return TextDelta(run_id="r", seq=seq, ts=0.0, step=1, delta=f"t{seq}")


def _frame(seq: int) -> bytes:
    return f'data: {{"seq":{seq},"event":"content_delta","delta":"t{seq}"}}\n\n'.encode()


async def _append(log: RunLog, *seqs: int) -> None:
    """The run's tokens, appended in a task of its own, named ``run``."""

    async def run() -> None:
        for seq in seqs:
            log.append(_token(seq))

    await asyncio.create_task(run(), name="run")


async def _streaming(
    log: RunLog, client: _Client, render: Callable[[Event], Any] = native, *, ids: bool = False
) -> Any:
    """The response's task, named ``response``, streaming run ``r`` to ``client``, once it
    waits for the run's first event."""
    response = EventStreamResponse(
        _LiveFrames(log.subscribe("r"), render, trailer=DONE, ids=ids), keepalive=5
    )

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        await response(scope, receive, send)

    outside = StreamsOutside(endpoint)({"type": "http"}, _never_disconnects, client.send)
    responding = asyncio.create_task(outside, name="response")
    await asyncio.sleep(0.01)
    return responding


def test_a_waiting_streams_frames_go_out_from_the_runs_task_and_a_slow_clients_from_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """To a server whose ``send`` waits on nothing bound to a task (uvicorn's), a token's
    frame is sent by the run's task as it is appended: one task woken a token, not two. A
    send that has to wait for a slow client goes on in the response's task, before the
    frames that came meanwhile, each once, in order; the run never waits for the client."""
    monkeypatch.setattr(streaming, "SENDS_IN_ANY_TASK", (__name__,))
    monkeypatch.setattr(streams, "BURST", 0.0)  # the tokens here come microseconds apart

    async def scenario() -> list[tuple[bytes, str]]:
        log, client = RunLog(), _Client()
        log.open("r")
        response = await _streaming(log, client)
        await _append(log, 1)
        client.reading.clear()
        await _append(log, 2, 3)
        await asyncio.sleep(0.01)
        assert [body for body, _ in client.sent] == [_frame(1)], "2 waits for the client"
        client.reading.set()
        await asyncio.sleep(0.01)
        await _append(log, 4)
        log.close("r")
        await response
        return client.sent

    assert asyncio.run(scenario()) == [
        (_frame(1), "run"),
        (_frame(2), "response"),
        (_frame(3), "response"),
        (_frame(4), "run"),
        (DONE, "response"),
        (b"", "response"),
    ]


@pytest.mark.parametrize("ids", [False, True], ids=["a POST stream", "a follow"])
def test_a_token_written_through_is_the_frame_its_stream_sends_any_other_way(
    monkeypatch: pytest.MonkeyPatch, ids: bool
) -> None:
    """Written through from the run's task, a token goes out as the frame the response's
    task would have sent of it: a follow's with its ``id:`` line."""
    monkeypatch.setattr(streaming, "SENDS_IN_ANY_TASK", (__name__,))
    monkeypatch.setattr(streams, "BURST", 0.0)

    async def scenario() -> list[tuple[bytes, str]]:
        log, client = RunLog(), _Client()
        log.open("r")
        response = await _streaming(log, client, ids=ids)
        await _append(log, 1)
        log.close("r")
        await response
        return client.sent

    written = encode_events([_token(1)], native, ids=ids)
    assert written.startswith(b"id: 1\n") == ids
    assert asyncio.run(scenario())[0] == (written, "run")


def test_a_burst_of_tokens_goes_out_from_the_responses_task_in_one_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An event that comes within ``BURST`` of the one before is not written through: the
    response's task wakes and sends it with the rest of the burst, one write to the socket
    for all of them, not one each (here every event is in a burst)."""
    monkeypatch.setattr(streaming, "SENDS_IN_ANY_TASK", (__name__,))
    monkeypatch.setattr(streams, "BURST", 3600.0)

    async def scenario() -> list[tuple[bytes, str]]:
        log, client = RunLog(), _Client()
        log.open("r")
        response = await _streaming(log, client)
        await _append(log, 1, 2, 3)
        log.close("r")
        await response
        return client.sent

    assert asyncio.run(scenario()) == [
        (_frame(1) + _frame(2) + _frame(3), "response"),
        (DONE, "response"),
        (b"", "response"),
    ]


@pytest.mark.parametrize("failing", ["send", "view"])
def test_what_fails_in_the_runs_task_while_it_writes_a_frame_ends_the_response_not_the_run(
    monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    monkeypatch.setattr(streaming, "SENDS_IN_ANY_TASK", (__name__,))
    monkeypatch.setattr(streams, "BURST", 0.0)

    def render(event: Event) -> Any:
        if failing == "view" and event.seq == 2:
            raise ValueError("no frame")
        return native(event)

    async def scenario() -> None:
        log, client = RunLog(), _Client()
        log.open("r")
        response = await _streaming(log, client, render)
        await _append(log, 1)
        client.failing = failing == "send"
        await _append(log, 2, 3)  # the run goes on
        with pytest.raises(RuntimeError if failing == "send" else ValueError):
            await response
        assert [body for body, _ in client.sent] == [_frame(1)]

    asyncio.run(scenario())


def test_over_uvicorn_a_streams_tokens_go_out_from_the_runs_task_and_a_slow_reader_loses_none(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvicorn's ``send`` is one to write through to: a token's frame goes out from the
    run's task. A client that does not read while its run streams 10 MB (uvicorn's flow
    control stops the sends) holds nothing up: the run completes, and the client then reads
    every frame, once, in order, as a client that kept up did."""
    writers: list[str] = []
    finished: list[None] = []
    write_now, finish = EventStreamResponse._write_now, EventStreamResponse._finish

    def spied_write_now(response: EventStreamResponse, chunk: bytes) -> bool:
        task = asyncio.current_task()
        writers.append(task.get_name() if task else "")
        return write_now(response, chunk)

    async def spied_finish(response: EventStreamResponse) -> None:
        finished.append(None)
        await finish(response)

    monkeypatch.setattr(streams, "BURST", float("-inf"))  # no event is taken for a burst
    monkeypatch.setattr(EventStreamResponse, "_write_now", spied_write_now)
    monkeypatch.setattr(EventStreamResponse, "_finish", spied_finish)
    body = json.dumps({"message": "Go"}).encode()
    url = httpx.URL(live.url)
    request = (
        f"POST /api/agents/wide/run/stream HTTP/1.1\r\nhost: {url.host}\r\n"
        f"apikey: {live.key}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect((url.host, url.port))
        client.sendall(request + body)
        wait_until(lambda: finished)
        run = wait_for_status(live, latest_run_id(live, "wide"))
        assert run["status"] == "completed"
        client.settimeout(10)
        received = bytearray()
        while not received.endswith(b"\r\n0\r\n\r\n"):
            read = client.recv(1 << 16)
            assert read, "the connection closed before the stream's end"
            received += read
    frames = [json.loads(data) for data in re.findall(rb"data: (.*?)\n\n", received)]
    seqs = [frame.pop("seq") for frame in frames]
    assert seqs == sorted(set(seqs))
    tokens = [frame["delta"][:5] for frame in frames if frame["event"] == "content_delta"]
    assert tokens == [f"{i:05}" for i in range(WIDE_TOKENS)]
    _, kept_up = stream_frames(live, "wide", {"message": "Go"})
    assert _without_ids_and_times(frames) == _without_ids_and_times(kept_up)
    assert writers
    assert all(name.startswith("run_") for name in writers)


_RUNS_OWN = ("run_id", "session_id", "ts", "duration_ms")
"""What differs between two runs' frames."""


def _without_ids_and_times(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in f.items() if key not in _RUNS_OWN} for f in frames]


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
