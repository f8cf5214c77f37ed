"""The console in a real browser (headless Chromium from the Debian packages): signing in
and out, the lists, a run followed live, an approval given from its page, and knowledge
bases made, filled and searched."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agentstream.agents import AgentSpec
from conftest import (
    LiveServer,
    make_settings,
    run_events,
    screenshot,
    serve,
    sign_in,
    wait_for_status,
)

playwright = pytest.importorskip("playwright.sync_api")
if TYPE_CHECKING:
    from playwright.sync_api import Page

EMBEDDING = 60_000
"""ms: with the embeddings extra, the first upload and search load the model."""
GUARDED = AgentSpec(id="guarded", tools=["calculator"], approval_required=["calculator"])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The demo at a human pace (time to watch a run live), with an agent whose calculator
    waits for approval."""
    settings = make_settings(tmp_path_factory.mktemp("console"), offline_token_delay=0.03)
    with serve(settings, agents=[GUARDED]) as server:
        yield server


def expect(locator: Any) -> Any:
    return playwright.expect(locator)


def test_sign_in_lists_the_runs_and_sign_out_ends_the_session(live: LiveServer, page: Page) -> None:
    ran = [run_events(live, "demo", {"message": m})[0].json()["run_id"] for m in ("hi", "17 * 23")]
    page.goto(f"{live.url}/console")
    expect(page.locator("#signin")).to_be_visible()
    page.fill("#signin-key", "as_wrong")
    page.click("#signin button")
    expect(page.locator("#status")).to_have_text("Not an API key of this server")

    page.fill("#signin-key", live.key)
    page.click("#signin button")
    expect(page.locator("#who")).to_have_text("Signed in with the key “demo”")
    expect(page.locator('#nav [aria-current="page"]')).to_have_text("Runs")
    for run_id in ran:
        expect(page.locator(f'a[href="/console/runs/{run_id}"]')).to_be_visible()
    assert page.evaluate("document.cookie") == "", "the session cookie is HttpOnly"
    assert live.key not in page.evaluate("JSON.stringify({...localStorage, ...sessionStorage})")

    page.select_option('select[name="status"]', "error")
    page.click("form.filters button")
    expect(page).to_have_url(f"{live.url}/console?status=error")
    expect(page.locator(".empty")).to_have_text("No runs match.")

    page.click("#sign-out")
    expect(page.locator("#signin")).to_be_visible()
    assert page.request.get(f"{live.url}/api/console/session").status == 401


def test_the_lists_link_a_session_to_its_runs(live: LiveServer, page: Page) -> None:
    first = run_events(live, "demo", {"message": "hello"})[0].json()
    run_events(live, "demo", {"message": "and again", "session_id": first["session_id"]})
    sign_in(page, live)
    page.goto(f"{live.url}/console/sessions?agent_id=demo")
    page.click(f'a[href="/console/sessions/{first["session_id"]}"]')
    expect(page.locator("#view h1 .id")).to_have_text(first["session_id"])
    rows = page.locator("table").first.locator("tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("hello")

    page.goto(f"{live.url}/console/executions")
    expect(page.locator(".card h3")).to_contain_text(["Two questions at once"])
    expect(page.locator('.card a[href="/console/workflows/demo-parallel/run"]')).to_be_visible()


def start_slow_run(live: LiveServer, message: str) -> str:
    """Start a run whose answer streams for a while, in the background; its id."""
    started = threading.Event()
    run: dict[str, str] = {}

    def stream() -> None:
        with (
            live.client(timeout=60) as client,
            client.stream("POST", "/api/agents/demo/run/stream", json={"message": message}) as r,
        ):
            for line in r.iter_lines():
                if line.startswith("data:") and not run:
                    run["id"] = json.loads(line[5:])["run_id"]
                    started.set()

    threading.Thread(target=stream, daemon=True).start()
    assert started.wait(10)
    return run["id"]


def test_a_live_run_is_followed_to_its_end(live: LiveServer, page: Page) -> None:
    run_id = start_slow_run(live, "Write 120 words about the sea")
    sign_in(page, live)
    page.goto(f"{live.url}/console/runs/{run_id}")
    expect(page.locator("#view h1 .status")).to_have_text("running")
    answer = page.locator(".answer.live")
    expect(answer).not_to_be_empty()
    growing = answer.text_content() or ""
    screenshot(page, "console-run-live.png")

    expect(page.locator("#view h1 .status")).to_have_text("completed", timeout=30_000)
    record = wait_for_status(live, run_id)
    expect(page.locator(".answer")).to_have_text(record["content"])
    assert record["content"].startswith(growing.strip()[:20])
    names = page.locator("ol.events .name").all_text_contents()
    assert (names[0], names[-1]) == ("start", "complete")
    assert "content_delta" not in names, "deltas grow the answer, not the event list"
    expect(page.locator("table").first.locator("tbody tr")).to_have_count(len(record["steps"]))
    screenshot(page, "console-run.png")


def test_a_paused_run_is_approved_from_its_page(live: LiveServer, page: Page) -> None:
    frames = [e.json() for e in run_events(live, "guarded", {"message": "What is 6 * 7?"})]
    assert frames[-1]["event"] == "approval_requested"
    run_id = frames[0]["run_id"]
    sign_in(page, live)
    page.goto(f"{live.url}/console/runs/{run_id}")
    card = page.locator(".approval")
    expect(card.locator("strong")).to_have_text("calculator")
    expect(card.locator("pre")).to_contain_text('"expression"')  # full arguments, signed in
    card.locator("button", has_text="Approve").click()

    expect(page.locator("#view h1 .status")).to_have_text("completed", timeout=20_000)
    expect(page.locator(".approval")).to_have_count(0)
    run = wait_for_status(live, run_id)
    [approval] = run["approvals"]
    assert (approval["decision"], approval["decided_by"]) == ("approved", "demo")
    expect(page.locator("ol.events .name").last).to_have_text("complete")


def test_a_knowledge_base_is_made_filled_and_searched(
    live: LiveServer, page: Page, tmp_path: Path
) -> None:
    sign_in(page, live)
    page.goto(f"{live.url}/console/knowledge")
    page.fill('form.inline input[placeholder="Name"]', "Garden notes")
    page.click("form.inline button")
    expect(page.locator("#view h1")).to_have_text("Garden notes")

    notes = tmp_path / "tomatoes.txt"
    notes.write_text("Tomatoes need six hours of sun and deep watering twice a week.\n")
    page.set_input_files('input[type="file"]', str(notes))
    page.click("form.inline button:has-text('Upload')")
    documents = page.locator("table").first.locator("tbody tr")
    expect(documents).to_have_count(1, timeout=EMBEDDING)
    expect(documents.first).to_contain_text("tomatoes.txt")

    page.fill('input[placeholder="Try a search"]', "how much sun do tomatoes need")
    page.click("form.inline button:has-text('Search')")
    expect(page.locator("table").last.locator("tbody tr").first).to_contain_text(
        "six hours of sun", timeout=EMBEDDING
    )
