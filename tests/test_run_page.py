"""The workflow run view in a real browser: a draft run drawn live, then its replay."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import LiveServer, make_settings, serve, sign_in

playwright = pytest.importorskip("playwright.sync_api")


WORKFLOW = {
    "id": "pair",
    "name": "Two agents",
    "blocks": [
        {"id": "start", "type": "start"},
        {
            "id": "calc",
            "type": "agent",
            "agent": {"id": "calc", "tools": ["calculator"], "reasoning": True},
            "input": "What is 17 * 23?",
        },
        {"id": "greet", "type": "agent", "agent": {"id": "greet"}, "input": "<start.input>"},
        {
            "id": "out",
            "type": "response",
            "output": {"calc": "<calc.content>", "greet": "<greet.content>"},
        },
    ],
    "edges": [
        {"from": "start", "to": "calc"},
        {"from": "start", "to": "greet"},
        {"from": "calc", "to": "out"},
        {"from": "greet", "to": "out"},
    ],
}

RECORD_STATES = """
window.stateLog = [];
new MutationObserver((records) => {
  for (const r of records) {
    if (r.attributeName === "data-state" && r.target.classList.contains("block")) {
      window.stateLog.push(`${r.target.dataset.id}:${r.target.dataset.state}`);
    }
  }
}).observe(document, {subtree: true, attributes: true, attributeFilter: ["data-state"]});
"""

FINAL_STATE = """() => ({
  steps: document.getElementById("steps").textContent,
  blocks: Object.fromEntries([...document.querySelectorAll(".block")]
    .map((b) => [b.dataset.id, b.dataset.state])),
  outputs: Object.fromEntries([...document.querySelectorAll(".output")].map((o) => [
    o.dataset.block,
    {
      text: o.querySelector(".text").textContent,
      thinking: !!o.querySelector("details.thinking .thinking-text")?.textContent,
      tools: [...o.querySelectorAll(".tool")].map((t) => [t.textContent, t.dataset.status]),
    },
  ])),
})"""

WITHOUT_THINKING = """() => {
  const copy = document.documentElement.cloneNode(true);
  copy.querySelectorAll(".thinking-text").forEach((node) => node.remove());
  return copy.outerHTML;
}"""
"""The DOM but the model's own thinking, which may well talk about the arguments it chose."""


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The app at a human pace, and the workflow saved."""
    settings = make_settings(tmp_path_factory.mktemp("run"), offline_token_delay=0.01)
    with serve(settings) as live:
        with live.client() as client:
            client.post("/api/workflows", json=WORKFLOW).raise_for_status()
        yield live


@pytest.fixture
def page(page: Any, paced: LiveServer) -> Any:
    """The browser page, signed in to the console and recording block states."""
    sign_in(page, paced)
    page.add_init_script(RECORD_STATES)
    return page


def test_a_draft_run_is_drawn_live_and_its_replay_ends_the_same(
    paced: LiveServer, page: Any, tmp_path: Path
) -> None:
    expect = playwright.expect
    page.goto(f"{paced.url}/console/workflows/pair/run")
    expect(page.locator("h1")).to_have_text("Two agents")
    expect(page.locator(".block")).to_have_count(4)
    expect(page.locator("#edges line")).to_have_count(4)
    expect(page.locator("#steps")).to_have_text("0/4 blocks")

    page.fill("#input", "hello")
    page.click("#run")

    expect(page.locator('.block[data-id="calc"]')).to_have_attribute("data-state", "running")
    expect(page.locator("#steps")).to_have_text("4/4 blocks", timeout=20_000)
    expect(page.locator("#status")).to_have_text("Completed.")
    page.screenshot(path=str(tmp_path / "run.png"))

    log: list[str] = page.evaluate("window.stateLog")
    for block in ("start", "calc", "greet", "out"):
        states = [entry.split(":")[1] for entry in log if entry.startswith(f"{block}:")]
        assert states[-2:] == ["running", "completed"], (block, states)
    # Both agents were running at once: the parallel pair.
    running = {e for e in log[: log.index("calc:completed")] if e.endswith(":running")}
    assert {"calc:running", "greet:running"} <= running

    final = page.evaluate(FINAL_STATE)
    calc, greet = final["outputs"]["calc"], final["outputs"]["greet"]
    assert calc["text"] == "The answer is 391."
    assert calc["thinking"]
    assert calc["tools"] == [["calculator", "success"]]
    assert greet["text"]
    assert not greet["tools"]
    assert set(final["blocks"].values()) == {"completed"}
    assert "expression" not in page.evaluate(WITHOUT_THINKING), "no tool arguments in the DOM"

    with paced.client() as client:
        (latest, *_) = client.get("/api/workflows/pair/executions").json()
    assert latest["draft"] is True

    page.goto(f"{paced.url}/console/executions/{latest['id']}")
    expect(page.locator("#steps")).to_have_text("4/4 blocks")
    expect(page.locator("#status")).to_have_text("Completed.")
    replayed = page.evaluate(FINAL_STATE)
    assert replayed == final
    assert "expression" not in page.evaluate(WITHOUT_THINKING)
