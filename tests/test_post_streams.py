"""Streams started by a POST are ``data: <json>`` frames and nothing else, so the common
hand-rolled parser (split on blank lines, keep the parts that start with ``data: ``) reads
every frame; where to resume from travels inside the frames."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentstream.sse import SSEDecoder
from conftest import LiveServer

CHAT = {"X-Sim-Stream-Protocol": "agent-events-v1"}

POSTS: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "native agent": ("/api/agents/demo/run/stream", {"message": "What is 17 * 23?"}, {}),
    "native workflow": ("/api/workflows/demo-parallel/run/stream", {"input": "17 * 23"}, {}),
    "public chat": ("/api/chat/your-slug", {"input": "What is 17 * 23?"}, CHAT),
    "public workflow chat": ("/api/chat/two-questions", {"input": "17 * 23"}, CHAT),
    "legacy public chat": ("/api/chat/your-slug", {"input": "What is 17 * 23?"}, {}),
    "canvas": ("/api/workflows/demo-parallel/execute", {"input": "17 * 23"}, {}),
}


def naive_frames(body: str) -> list[Any]:
    """The parser of the reference chat client, and of many a hand-rolled one."""
    parts = body.split("\n\n")
    return [json.loads(part.removeprefix("data: ")) for part in parts if part.startswith("data: ")]


def post(server: LiveServer, surface: str) -> str:
    path, body, headers = POSTS[surface]
    with server.client() as client:
        response = client.post(path, json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.text


@pytest.mark.parametrize("surface", list(POSTS))
def test_a_naive_parser_reads_every_frame(server: LiveServer, surface: str) -> None:
    body = post(server, surface)

    decoded = [event.json() for event in SSEDecoder().feed(body.encode())]
    assert len(decoded) >= 3
    assert naive_frames(body) == decoded
    lines = [line for line in body.split("\n") if line]
    assert all(line.startswith("data: ") for line in lines), "no id:, event: or other lines"


@pytest.mark.parametrize("surface", ["native agent", "native workflow"])
def test_native_frames_carry_their_seq(server: LiveServer, surface: str) -> None:
    frames = naive_frames(post(server, surface))

    assert [frame["seq"] for frame in frames] == sorted({frame["seq"] for frame in frames})
    assert frames[0]["seq"] == 1


def test_canvas_frames_carry_their_event_id(server: LiveServer) -> None:
    frames = naive_frames(post(server, "canvas"))

    ids = [frame["eventId"] for frame in frames if "eventId" in frame]
    assert ids == sorted(set(ids))
    assert ids[0] == 1
