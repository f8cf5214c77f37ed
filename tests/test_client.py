"""The Python SDK against a real server, and its parsing against canned streams."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agentstream.client import AsyncClient, Client, RunAccumulator, RunResult, parse_frame
from agentstream.errors import APIConnectionError, APIStatusError, ClientError
from agentstream.views.native import NativeFrame
from conftest import LiveServer, make_settings, serve, wait_until

QUESTION = "What is 17 * 23?"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def events(frames: list[NativeFrame]) -> list[str]:
    return [f.event for f in frames]


def squash(names: list[str]) -> list[str]:
    """Event names with runs of the same delta event collapsed, to compare shapes."""
    return [n for i, n in enumerate(names) if not (i and n == names[i - 1] and "delta" in n)]


EXPECTED_SHAPE = [
    "start",
    "step_started",
    "reasoning_delta",
    "reasoning",
    "content_delta",
    "preamble",
    "tool_call",
    "tool_result",
    "reasoning_summary",
    "step_completed",
    "step_started",
    "reasoning_delta",
    "reasoning",
    "content_delta",
    "reasoning_summary",
    "step_completed",
    "complete",
]


def check_calculator_frames(frames: list[NativeFrame]) -> None:
    assert squash(events(frames)) == EXPECTED_SHAPE
    by_event = {f.event: f for f in frames}
    call, result, complete = by_event["tool_call"], by_event["tool_result"], by_event["complete"]
    assert call.event == "tool_call"
    assert result.event == "tool_result"
    assert (call.tool_name, call.arguments) == ("calculator", {"expression": "17 * 23"})
    assert (result.tool_call_id, result.result, result.status) == (
        call.tool_call_id,
        391,
        "success",
    )
    assert complete.event == "complete"
    assert complete.content == "The answer is 391."


def check_calculator_result(result: RunResult) -> None:
    assert (result.ok, result.status, result.error) == (True, "completed", None)
    assert result.run_id
    assert result.session_id
    assert result.content == "The answer is 391."
    assert "calculator" in result.reasoning
    [call] = result.tool_calls
    assert (call.name, call.arguments, call.status, call.result, call.step) == (
        "calculator",
        {"expression": "17 * 23"},
        "success",
        391,
        1,
    )
    assert result.usage is not None
    assert result.usage.total_tokens > 0


# --- against the live server ---------------------------------------------------------


def test_iter_events_streams_the_whole_run(server: LiveServer) -> None:
    with Client(server.url, server.key) as client:
        check_calculator_frames(list(client.iter_events("demo", QUESTION)))


def test_run_assembles_the_answer_and_keeps_the_session(server: LiveServer) -> None:
    with Client(server.url, server.key) as client:
        first = client.run("demo", QUESTION)
        check_calculator_result(first)
        second = client.run("demo", "Hello", session_id=first.session_id, reasoning=False)
    assert second.ok
    assert second.session_id == first.session_id
    assert second.run_id != first.run_id
    assert second.content.startswith("Hi!")
    assert second.reasoning == ""


def test_get_run_returns_the_assembled_run(server: LiveServer) -> None:
    with Client(server.url, server.key) as client:
        result = client.run("demo", QUESTION)
        stored = client.get_run(result.run_id or "")
    assert (stored["status"], stored["content"]) == ("completed", "The answer is 391.")
    assert stored["session_id"] == result.session_id
    assert [c["result"] for c in stored["tool_calls"]] == [391]
    assert stored["events"][-1]["event"] == "complete"


def test_iter_resume_replays_a_finished_run(server: LiveServer) -> None:
    with Client(server.url, server.key) as client:
        live = list(client.iter_events("demo", QUESTION))
        run_id = live[0].run_id if live[0].event == "start" else ""
        assert list(client.iter_resume(run_id)) == live
        # Every frame carries its seq: resuming after one gives exactly the frames after it.
        for index in (0, len(live) // 2, len(live) - 2):
            assert list(client.iter_resume(run_id, after=live[index].seq)) == live[index + 1 :]
        assert list(client.iter_resume(run_id, after=live[-1].seq)) == []


def test_async_client_streams_and_runs(server: LiveServer) -> None:
    async def main() -> tuple[list[NativeFrame], RunResult, dict[str, Any]]:
        async with AsyncClient(server.url, server.key) as client:
            stream = client.aiter_events("demo", QUESTION)
            async with aclosing(stream):
                frames = [frame async for frame in stream]
            result = await client.arun("demo", QUESTION)
            return frames, result, await client.aget_run(result.run_id or "")

    frames, result, stored = anyio.run(main)
    check_calculator_frames(frames)
    check_calculator_result(result)
    assert stored["id"] == result.run_id


@pytest.mark.anyio
async def test_async_resume_and_cancel_errors(server: LiveServer) -> None:
    async with AsyncClient(server.url, server.key) as client:
        result = await client.arun("demo", "Hello")
        resumed = client.aiter_resume(result.run_id or "")
        async with aclosing(resumed):
            assert [f.event async for f in resumed][-1] == "complete"
        with pytest.raises(APIStatusError) as info:
            await client.acancel(result.run_id or "")
    assert info.value.status_code == 409
    assert "has ended" in info.value.message


def test_leaving_the_stream_cancels_the_run(tmp_path: Path) -> None:
    with (
        serve(make_settings(tmp_path, offline_token_delay=0.05)) as live,
        Client(live.url, live.key) as client,
    ):
        run_id = ""
        for frame in client.iter_events("demo", QUESTION):
            if frame.event == "start":
                run_id = frame.run_id
            if frame.event == "reasoning_delta":
                break  # the iterator is dropped: its stream closes
        wait_until(lambda: client.get_run(run_id)["status"] != "running")
        stored = client.get_run(run_id)
    assert stored["status"] == "cancelled"


def test_cancel_stops_a_live_run(tmp_path: Path) -> None:
    with (
        serve(make_settings(tmp_path, offline_token_delay=0.05)) as live,
        Client(live.url, live.key) as client,
    ):
        accumulator = RunAccumulator()
        for frame in client.iter_events("demo", QUESTION):
            accumulator.feed(frame)
            if frame.event == "start":
                client.cancel(frame.run_id)
        result = accumulator.result()
    assert (result.ok, result.status) == (False, "cancelled")
    assert result.error


def test_bad_key_is_a_401_with_the_servers_message(server: LiveServer) -> None:
    with Client(server.url, "not-a-key") as client, pytest.raises(APIStatusError) as info:
        client.run("demo", QUESTION)
    error = info.value
    assert (error.status_code, error.code) == (401, "unauthorized")
    assert "API key" in error.message
    assert error.headers["www-authenticate"] == "Bearer"
    assert error.body["error"]["message"] == error.message


def test_unknown_agent_is_a_404(server: LiveServer) -> None:
    with Client(server.url, server.key) as client:
        with pytest.raises(APIStatusError) as info:
            list(client.iter_events("nope", QUESTION))
        assert (info.value.status_code, info.value.message) == (404, "No agent 'nope'")
        with pytest.raises(APIStatusError, match="No run 'run_x'"):
            client.get_run("run_x")


def test_closed_port_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        client = Client(f"http://127.0.0.1:{port}", "key")
        with client, pytest.raises(APIConnectionError) as info:
            client.run("demo", QUESTION)
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "agentstream serve --demo" in str(info.value)
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_api_key_defaults_to_env_then_demo_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("apikey"))
        return httpx.Response(200, json={"id": "run_1"})

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENTSTREAM_API_KEY", raising=False)
    monkeypatch.delenv("AGENTSTREAM_DATA_DIR", raising=False)

    def get_run(api_key: str | None = None) -> None:
        with Client(api_key=api_key, transport=httpx.MockTransport(handler)) as client:
            client.get_run("run_1")

    get_run()
    (tmp_path / ".agentstream").mkdir()
    (tmp_path / ".agentstream" / "demo-key").write_text("as_demo\n")
    get_run()
    monkeypatch.setenv("AGENTSTREAM_API_KEY", "as_env")
    get_run()
    get_run("as_given")
    assert seen == [None, "as_demo", "as_env", "as_given"]


# --- canned streams --------------------------------------------------------------------

CANNED = (
    b'id: 1\ndata: {"seq":1,"event":"start","run_id":"run_1","session_id":"ses_1"}\n\n'
    b": keepalive\n\n"
    b'id: 2\ndata: {"seq":2,"event":"from_a_newer_server","entity":"x","task":"y"}\n\n'
    b'id: 3\r\ndata: {"seq":3,"event":"content_delta","delta":"Hi"}\r\n\r\n'
    b'id: 4\ndata: {"seq":4,"event":"complete","run_id":"run_1","content":"Hi",'
    b'"usage":{"input_tokens":1,"output_tokens":1,"total_tokens":2}}\n\n'
)


def canned(body: bytes) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept"] == "text/event-stream"
        pieces = [body[i : i + 7] for i in range(0, len(body), 7)]  # split mid-frame
        return httpx.Response(200, content=iter(pieces))

    return httpx.MockTransport(handler)


def test_unknown_events_are_skipped() -> None:
    with Client(api_key="k", transport=canned(CANNED)) as client:
        assert events(list(client.iter_events("a", "m"))) == ["start", "content_delta", "complete"]
        result = client.run("a", "m")
    assert (result.ok, result.content, result.session_id) == (True, "Hi", "ses_1")


def test_unknown_events_are_skipped_async() -> None:
    class AsyncBody(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for i in range(0, len(CANNED), 7):
                yield CANNED[i : i + 7]

    async def main() -> list[str]:
        transport = httpx.MockTransport(lambda _: httpx.Response(200, stream=AsyncBody()))
        async with AsyncClient(api_key="k", transport=transport) as client:
            return events([f async for f in client.aiter_events("a", "m")])

    assert anyio.run(main) == ["start", "content_delta", "complete"]


@pytest.mark.parametrize(
    "data",
    [b"data: {not json\n\n", b'data: {"no_event": 1}\n\n', b'data: {"event":"start"}\n\n'],
)
def test_malformed_frames_raise(data: bytes) -> None:
    with Client(api_key="k", transport=canned(data)) as client, pytest.raises(ClientError):
        list(client.iter_events("a", "m"))


def test_a_stream_that_ends_early_is_incomplete() -> None:
    body = CANNED.split(b"id: 4")[0]
    with Client(api_key="k", transport=canned(body)) as client:
        result = client.run("a", "m")
    assert (result.ok, result.status, result.content, result.usage) == (
        False,
        "incomplete",
        "Hi",
        None,
    )


def test_accumulator_lets_a_chunk_replace_its_steps_deltas() -> None:
    accumulator = RunAccumulator()
    stream: list[dict[str, Any]] = [
        {"seq": 1, "event": "step_started", "step": 1},
        {"seq": 2, "event": "content_delta", "delta": "Hel"},
        {"seq": 3, "event": "content_delta", "delta": "lo"},
        {"seq": 4, "event": "chunk", "content": "Hello"},
        {"seq": 5, "event": "error", "message": "boom", "status": "timeout"},
    ]
    for data in stream:
        frame = parse_frame(data)
        assert frame is not None
        accumulator.feed(frame)
    result = accumulator.result()
    assert (result.content, result.status, result.error) == ("Hello", "timeout", "boom")


@pytest.mark.anyio
async def test_request_reaches_the_rest_of_the_api(server: LiveServer) -> None:
    async with AsyncClient(server.url, server.key) as client:
        deployments = await client.arequest("GET", "/api/chat-deployments")
        with pytest.raises(APIStatusError) as info:
            await client.arequest("GET", "/api/chat-deployments/nowhere")
    with Client(server.url, server.key) as sync_client:
        assert sync_client.request("GET", "/api/chat-deployments") == deployments
    assert [d["deployment"]["slug"] for d in deployments] == ["two-questions", "your-slug"]
    assert (info.value.status_code, info.value.field) == (404, "slug")
