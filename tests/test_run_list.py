"""``GET /api/agents/runs``: agent runs newest first, filtered and a page at a time, on
either store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import STORES, LiveServer, run_events, serve_on


@pytest.fixture(params=STORES)
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    with serve_on(request, tmp_path) as live:
        yield live


def listed(live: LiveServer, **params: Any) -> dict[str, Any]:
    with live.client() as client:
        response = client.get("/api/agents/runs", params=params)
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    return page


def test_runs_are_listed_newest_first_a_page_at_a_time(live: LiveServer) -> None:
    agent = f"lister-{uuid.uuid4().hex[:8]}"
    with live.client() as client:
        assert client.post("/api/agents", json={"id": agent}).status_code == 201
    started = [run_events(live, agent, {"message": f"Write {n} words"}) for n in range(1, 6)]
    ids = [events[0].json()["run_id"] for events in started]

    first = listed(live, agent_id=agent, limit=2)
    assert [r["id"] for r in first["runs"]] == ids[::-1][:2]
    pages = [first]
    while pages[-1]["next_cursor"]:
        pages.append(listed(live, agent_id=agent, limit=2, cursor=pages[-1]["next_cursor"]))
    seen = [r["id"] for page in pages for r in page["runs"]]
    assert seen == ids[::-1], "every run once, newest first"
    run = first["runs"][0]
    assert (run["agent_id"], run["status"], run["input"]) == (agent, "completed", "Write 5 words")
    assert run["usage"]["output_tokens"] > 0

    assert listed(live, agent_id=agent, status="error")["runs"] == []
    assert len(listed(live, agent_id=agent, status="completed")["runs"]) == 5
    last = first["runs"][0]["created_at"]
    assert [r["id"] for r in listed(live, agent_id=agent, since=last)["runs"]] == [ids[-1]]
    assert listed(live, agent_id=agent, until="2000-01-01T00:00:00")["runs"] == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "done"}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": 201}, "limit"),
        ({"since": "yesterday"}, "since"),
        ({"cursor": "not-a-cursor"}, "cursor"),
    ],
)
def test_bad_filters_name_the_field(live: LiveServer, params: dict[str, Any], field: str) -> None:
    with live.client() as client:
        refused = client.get("/api/agents/runs", params=params)
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == field
