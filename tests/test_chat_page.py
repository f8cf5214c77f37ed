"""The hosted chat page in a real browser: headless Chromium from the Debian packages."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from agentstream.agents import AgentSpec
from agentstream.providers.base import ModelPart, ModelRequest, TextPart, TurnEndPart
from agentstream.providers.scripted import ScriptedModel
from conftest import (
    LiveServer,
    latest_run_id,
    make_settings,
    screenshot,
    serve,
    wait_for_status,
)
from fakes.server import run_app
from test_knowledge import HANDBOOK, create_base, upload

playwright = pytest.importorskip("playwright.sync_api")
if TYPE_CHECKING:
    from playwright.sync_api import Page


RECORD_ANSWERS = """
window.answerStates = [];
new MutationObserver(() => {
  const answers = document.querySelectorAll(".assistant .answer");
  const text = answers.length ? answers[answers.length - 1].textContent : null;
  if (text !== null && text !== window.answerStates.at(-1)) window.answerStates.push(text);
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The demo at a human pace, so there is time to see streaming and press Stop."""
    settings = make_settings(tmp_path_factory.mktemp("page"), offline_token_delay=0.05)
    with serve(settings) as live:
        yield live


def test_streams_the_answer_with_thinking_and_tools(paced: LiveServer, page: Page) -> None:
    requests: list[dict[str, str]] = []
    page.on(
        "request",
        lambda r: (
            requests.append(r.headers)
            if r.method == "POST" and r.url.endswith("/api/chat/your-slug")
            else None
        ),
    )
    page.add_init_script(RECORD_ANSWERS)
    page.goto(f"{paced.url}/chat/your-slug")
    playwright.expect(page.locator("h1")).to_have_text("agentstream demo")

    page.fill("#input", "What is 17 * 23?")
    page.press("#input", "Enter")

    answer = page.locator(".assistant .answer").last
    thinking = page.locator(".assistant details.thinking").last
    playwright.expect(thinking).to_be_visible()
    playwright.expect(thinking).to_contain_text("calculator")
    screenshot(page, "chat-mid-stream.png")
    playwright.expect(page.locator(".tool").last).to_have_attribute("data-status", "success")
    playwright.expect(page.locator(".tool").last).to_have_text("calculator")
    playwright.expect(answer).to_have_text("The answer is 391.")
    playwright.expect(page.locator("#send")).to_be_visible()
    screenshot(page, "chat-finished.png")

    states: list[str] = page.evaluate("window.answerStates")
    assert requests[0]["x-sim-stream-protocol"] == "agent-events-v1"
    preamble = states.index("Let me use the calculator tool.")
    assert "" in states[preamble:], "chunk_reset cleared the preamble"
    assert states[-1] == "The answer is 391."
    assert len(states) > 6, "text appeared token by token"


def test_a_workflow_deployment_shows_its_blocks_one_after_the_other(
    paced: LiveServer, page: Page
) -> None:
    page.add_init_script(RECORD_ANSWERS)
    page.goto(f"{paced.url}/chat/two-questions")
    playwright.expect(page.locator("h1")).to_have_text("Two questions at once")
    page.fill("#input", "17 * 23")
    page.press("#input", "Enter")

    answer = page.locator(".assistant .answer").last
    playwright.expect(answer).to_contain_text("The current time is")
    playwright.expect(page.locator("#send")).to_be_visible()
    blocks = answer.locator(".block")
    playwright.expect(blocks).to_have_count(2)  # one after the other, each its own
    playwright.expect(blocks.nth(0)).to_have_text("The answer is 391.")
    playwright.expect(blocks.nth(1)).to_contain_text("The current time is")
    states = [state.replace("\n", "") for state in page.evaluate("window.answerStates")]
    assert "The answer is 391.Let me use the current_time tool." in states
    assert "The answer is 391." in states, "the clock block's reset kept the first block's text"


def test_text_arrives_token_by_token(paced: LiveServer, page: Page) -> None:
    page.goto(f"{paced.url}/chat/your-slug")
    page.fill("#input", "Write 60 words")
    page.press("#input", "Enter")
    answer = page.locator(".assistant .answer").last
    playwright.expect(answer).to_contain_text("word3 ")
    assert "word60" not in (answer.text_content() or ""), "seen mid-stream, not all at once"
    playwright.expect(answer).to_contain_text("word60")


def test_stop_aborts_mid_stream(paced: LiveServer, page: Page) -> None:
    page.goto(f"{paced.url}/chat/your-slug")
    page.fill("#input", "Write 400 words")
    page.press("#input", "Enter")
    answer = page.locator(".assistant .answer").last
    playwright.expect(answer).to_contain_text("word5 ")

    page.click("#stop")

    playwright.expect(page.locator(".assistant.stopped .stopped-note")).to_have_text("Stopped")
    playwright.expect(page.locator("#send")).to_be_visible()
    assert "word400" not in (answer.text_content() or "")
    run = wait_for_status(paced, latest_run_id(paced))
    assert run["input"] == "Write 400 words"
    assert (run["status"], run["error"]) == ("cancelled", "Client cancelled request")


def until(page: Page, condition: str, timeout: float = 10) -> None:
    """Wait for a JavaScript ``condition`` on the page (``wait_for_function`` would evaluate
    it in the page, which its Content-Security-Policy forbids)."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(condition):
        assert time.monotonic() < deadline, f"not so after {timeout} s: {condition}"
        page.wait_for_timeout(50)


def test_thinking_folds_away_once_the_answer_begins(paced: LiveServer, page: Page) -> None:
    page.goto(f"{paced.url}/chat/your-slug")
    page.fill("#input", "What is 17 * 23?")
    page.press("#input", "Enter")
    thinking = page.locator(".assistant details.thinking").last
    playwright.expect(thinking).to_have_attribute("open", "")  # open while it thinks
    playwright.expect(page.locator(".assistant .answer").last).to_have_text("The answer is 391.")
    playwright.expect(thinking).not_to_have_attribute("open", "")
    playwright.expect(thinking.locator("summary")).to_have_text(re.compile(r"Thought for \d+ s"))
    playwright.expect(thinking).to_contain_text("calculator")  # still there, to open


def test_the_page_follows_the_stream_unless_the_reader_scrolls_up(
    paced: LiveServer, page: Page
) -> None:
    page.set_viewport_size({"width": 390, "height": 500})
    page.goto(f"{paced.url}/chat/your-slug")
    page.fill("#input", "Write 160 words")
    page.press("#input", "Enter")
    until(page, "document.documentElement.scrollHeight > innerHeight + 300")
    until(page, "innerHeight + scrollY >= document.documentElement.scrollHeight - 60")
    composer = page.locator("#composer").bounding_box()
    assert composer is not None
    assert composer["y"] + composer["height"] <= 500, "the input stays pinned in view"

    page.mouse.wheel(0, -2000)  # the reader scrolls up to read
    until(page, "scrollY < 50")
    page.wait_for_timeout(600)  # more tokens arrive
    assert page.evaluate("scrollY") < 50, "left where the reader scrolled"
    playwright.expect(page.locator(".assistant .answer").last).to_contain_text("word160")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, "nothing wider than the phone"


def test_a_reload_keeps_the_conversation_and_new_chat_starts_one(
    paced: LiveServer, page: Page
) -> None:
    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    page.goto(f"{paced.url}/chat/your-slug")
    page.fill("#input", "Write 3 words")
    page.press("#input", "Enter")
    playwright.expect(page.locator(".assistant .answer").last).to_have_text(" word1 word2 word3")
    playwright.expect(page.locator("#send")).to_be_visible()
    first = page.evaluate("sessionStorage.getItem('agentstream:conversation:your-slug')")

    page.reload()
    playwright.expect(page.locator(".message.user")).to_have_text(["Write 3 words"])
    playwright.expect(page.locator(".message.assistant").last).to_have_text(" word1 word2 word3")
    page.fill("#input", "What did I ask before?")
    page.press("#input", "Enter")  # the same conversation, which the server remembers
    playwright.expect(page.locator(".assistant .answer").last).to_contain_text("Write 3 words")

    page.click("#new-chat")
    playwright.expect(page.locator(".message.user")).to_have_count(0)
    second = page.evaluate("sessionStorage.getItem('agentstream:conversation:your-slug')")
    assert second != first
    page.reload()
    playwright.expect(page.locator(".message.user")).to_have_count(0)
    assert missing == [], "no asset is missing (the favicon included)"


def test_password_page_signs_in_and_shows_errors(paced: LiveServer, page: Page) -> None:
    with paced.client() as client:
        client.post(
            "/api/chat-deployments",
            json={
                "slug": "locked",
                "agent_id": "demo",
                "access": "password",
                "password": "open sesame",
                "title": "Locked",
            },
        )
    page.goto(f"{paced.url}/chat/locked")
    playwright.expect(page.locator("#signin")).to_be_visible()
    playwright.expect(page.locator("#composer")).to_be_hidden()

    page.fill("#signin-secret", "wrong one")
    page.click("#signin button")
    playwright.expect(page.locator("#status")).to_have_text("Wrong password")

    page.fill("#signin-secret", "open sesame")
    page.click("#signin button")
    playwright.expect(page.locator("#composer")).to_be_visible()
    page.fill("#input", "hello")
    page.press("#input", "Enter")
    playwright.expect(page.locator(".assistant .answer").last).to_contain_text("Hi!")


def test_unknown_chat_shows_a_readable_error(paced: LiveServer, page: Page) -> None:
    page.goto(f"{paced.url}/chat/nowhere")
    playwright.expect(page.locator("#status")).to_have_text("No chat deployment 'nowhere'")


def test_an_answer_waiting_for_approval_shows_so(paced: LiveServer, page: Page) -> None:
    with paced.client() as client:
        agent = {"id": "careful", "tools": ["calculator"], "approval_required": ["calculator"]}
        assert client.post("/api/agents", json=agent).status_code == 201
        deployment = {"slug": "careful", "agent_id": "careful", "includeToolCalls": True}
        assert client.post("/api/chat-deployments", json=deployment).status_code == 201
    page.goto(f"{paced.url}/chat/careful")
    page.fill("#input", "What is 6 * 7?")
    page.press("#input", "Enter")

    playwright.expect(page.locator(".assistant .waiting").last).to_have_text(
        "The answer is waiting for an approval."
    )
    tool = page.locator(".tool").last
    playwright.expect(tool).to_have_attribute("data-status", "awaiting_approval")
    playwright.expect(tool).to_have_text("calculator")
    playwright.expect(page.locator("#send")).to_be_visible()

    page.fill("#input", "Well?")
    page.press("#input", "Enter")
    playwright.expect(page.locator(".assistant .error").last).to_contain_text(
        "The answer to your last message is waiting for an approval."
    )


ANSWER_MARKDOWN = [
    "## Plan\n\n",
    "Some **bold** and `code`, ",
    "a [link](https://example.com) and [another](javascript:window.pwned=1).\n\n",
    "<script>window.pwned = 2</script>\n\n",
    '<img src="x" onerror="window.pwned = 3">\n\n',
    "```python\nprint(1)\n```\n\n",
    "| a | b |\n|---|---|\n| 1 | 2 |\n",
]


def writes_markdown(request: ModelRequest) -> list[ModelPart]:
    return [*(TextPart(piece) for piece in ANSWER_MARKDOWN), TurnEndPart("end_turn")]


@pytest.fixture(scope="module")
def markdown_chat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = make_settings(tmp_path_factory.mktemp("markdown"))
    agents = [AgentSpec(id="writer", model="writer")]
    models = [ScriptedModel("writer", writes_markdown, delay=0.3)]
    with serve(settings, agents=agents, models=models) as live:
        with live.client() as client:
            client.post("/api/chat-deployments", json={"slug": "writer", "agent_id": "writer"})
        yield live


def test_answers_are_markdown_rendered_as_they_stream_and_nothing_in_them_runs(
    markdown_chat: LiveServer, page: Page
) -> None:
    page.goto(f"{markdown_chat.url}/chat/writer")
    page.fill("#input", "Plan it")
    page.press("#input", "Enter")
    answer = page.locator(".assistant .answer").last
    playwright.expect(answer.locator("h2")).to_have_text("Plan")
    playwright.expect(answer.locator("strong")).to_have_text("bold")
    assert page.locator("#stop").is_visible(), "rendered while it streams"

    playwright.expect(answer.locator("table td").first).to_have_text("1")
    playwright.expect(answer.locator("pre code")).to_have_text("print(1)\n")
    playwright.expect(answer.locator("button.copy")).to_have_count(1)
    playwright.expect(answer.locator("a")).to_have_count(1)  # no javascript: link
    link = answer.locator("a")
    playwright.expect(link).to_have_attribute("href", "https://example.com")
    playwright.expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
    assert answer.locator("script, img[onerror]").count() == 0
    playwright.expect(answer).to_contain_text("<script>window.pwned = 2</script>")  # as text
    assert page.evaluate("window.pwned") is None

    page.reload()  # the conversation comes back rendered
    playwright.expect(page.locator(".assistant .answer").last.locator("strong")).to_have_text(
        "bold"
    )


def test_the_renderer_is_for_the_chat_s_visitors(markdown_chat: LiveServer) -> None:
    with markdown_chat.client() as client:
        client.post(
            "/api/chat-deployments",
            json={
                "slug": "closed",
                "agent_id": "writer",
                "access": "password",
                "password": "open sesame",
            },
        )
    with httpx.Client(base_url=markdown_chat.url) as visitor:
        rendered = visitor.post("/api/chat/writer/markdown", json={"text": "**x** <b>y</b>"})
        closed = visitor.post("/api/chat/closed/markdown", json={"text": "x"})
        unknown = visitor.post("/api/chat/nowhere/markdown", json={"text": "x"})
        bad = visitor.post("/api/chat/writer/markdown", json={"text": 5})
    assert rendered.json() == {"html": "<p><strong>x</strong> &lt;b&gt;y&lt;/b&gt;</p>"}
    assert (closed.status_code, unknown.status_code) == (401, 404)
    assert (bad.status_code, bad.json()["error"]["field"]) == (422, "text")


LOGO = (
    "data:image/svg+xml;base64,"
    + base64.b64encode(
        b'<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40">'
        b'<circle cx="20" cy="20" r="18" fill="#c2410c"/></svg>'
    ).decode()
)


def test_a_deployment_s_logo_colour_and_suggested_prompts(paced: LiveServer, page: Page) -> None:
    branded = {
        "slug": "branded",
        "agent_id": "demo",
        "title": "Acme help",
        "accent_color": "#c2410c",
        "logo_url": LOGO,
        "suggested_prompts": ["What is 6 * 7?", "Write 3 words"],
    }
    with paced.client() as client:
        assert client.post("/api/chat-deployments", json=branded).status_code == 201
        wrong = client.post(
            "/api/chat-deployments",
            json={**branded, "slug": "wrong", "accent_color": "orange"},
        )
    assert (wrong.status_code, wrong.json()["error"]["field"]) == (422, "accent_color")

    page.goto(f"{paced.url}/chat/branded")
    playwright.expect(page.locator("#logo")).to_be_visible()
    assert page.evaluate("document.getElementById('logo').naturalWidth") == 40, "it loaded"
    prompts = page.locator("#prompts button")
    playwright.expect(prompts).to_have_text(["What is 6 * 7?", "Write 3 words"])
    colour = page.evaluate("getComputedStyle(document.getElementById('send')).backgroundColor")
    assert colour == "rgb(194, 65, 12)"

    prompts.first.click()
    playwright.expect(page.locator(".message.user")).to_have_text(["What is 6 * 7?"])
    playwright.expect(page.locator("#prompts")).to_be_hidden()
    playwright.expect(page.locator(".assistant .answer").last).to_contain_text("42")
    page.click("#new-chat")
    playwright.expect(prompts).to_have_count(2)


@pytest.mark.parametrize(
    "logo",
    [
        "javascript:alert(1)",
        "http://cdn.example/logo.png",
        "data:text/html;base64,PHA+",
        "x",
        "https://例え.jp/logo.png",  # not ASCII: a header cannot carry it
        "https://a.test;sandbox/logo.png",  # would add a directive to the page's policy
        "https://a.test,b.test/logo.png",
        "https://user:secret@a.test/logo.png",
        "https://a.test/logo\\.png",
        "https://a.test/\x01.png",
    ],
)
def test_a_logo_is_an_https_or_image_data_url(paced: LiveServer, logo: str) -> None:
    with paced.client() as client:
        refused = client.post(
            "/api/chat-deployments", json={"slug": "bad-logo", "agent_id": "demo", "logo_url": logo}
        )
    assert (refused.status_code, refused.json()["error"]["field"]) == (422, "logo_url")


def test_the_page_admits_images_from_the_logo_s_origin_only(paced: LiveServer) -> None:
    hosted = {"slug": "hosted-logo", "agent_id": "demo", "logo_url": "https://cdn.acme.test/l.png"}
    with paced.client() as client:
        assert client.post("/api/chat-deployments", json=hosted).status_code == 201
    policies = {
        slug: httpx.get(f"{paced.url}/chat/{slug}").headers["content-security-policy"]
        for slug in ("hosted-logo", "your-slug")
    }
    assert "img-src 'self' data: https://cdn.acme.test;" in policies["hosted-logo"]
    assert "img-src 'self' data:;" in policies["your-slug"]


def test_the_widget_opens_the_chat_on_a_site_the_deployment_allows(
    paced: LiveServer, page: Page
) -> None:
    """A page of another origin (another port) includes the script; only the origins the
    deployment lists may frame the chat."""

    async def site(request: Request) -> HTMLResponse:
        slug = request.path_params["slug"]
        return HTMLResponse(
            f"<!doctype html><title>Shop</title><h1>Shop</h1>"
            f'<script src="{paced.url}/chat/{slug}/widget.js" async></script>'
        )

    shop = Starlette(routes=[Route("/{slug}", site)])
    with run_app(shop, name="The shop") as shop_url:
        with paced.client() as client:
            embedded = {"slug": "embedded", "agent_id": "demo", "embed_origins": [shop_url]}
            assert client.post("/api/chat-deployments", json=embedded).status_code == 201
            wrong = {**embedded, "slug": "wrong", "embed_origins": ["https://shop.example/path"]}
            refused = client.post("/api/chat-deployments", json=wrong)
        assert (refused.status_code, refused.json()["error"]["field"]) == (
            422,
            "embed_origins.0",
        )
        with paced.client() as client:
            allowed = httpx.get(f"{paced.url}/chat/embedded")
            closed = httpx.get(f"{paced.url}/chat/your-slug")
        assert f"frame-ancestors {shop_url}" in allowed.headers["content-security-policy"]
        assert "x-frame-options" not in allowed.headers
        assert "frame-ancestors 'none'" in closed.headers["content-security-policy"]
        assert closed.headers["x-frame-options"] == "DENY"

        page.goto(f"{shop_url}/embedded")
        page.click("#agentstream-launcher")
        chat = page.frame_locator("#agentstream-chat")
        playwright.expect(chat.locator("#input")).to_be_visible()
        chat.locator("#input").fill("What is 17 * 23?")
        chat.locator("#input").press("Enter")
        playwright.expect(chat.locator(".assistant .answer").last).to_contain_text("391")
        page.click("#agentstream-launcher")
        playwright.expect(page.locator("#agentstream-chat")).to_be_hidden()


def test_an_answer_s_sources_show_as_cards_when_the_deployment_allows(
    markdown_chat: LiveServer, page: Page
) -> None:
    with markdown_chat.client(timeout=60) as client:
        kb = create_base(client)
        assert upload(client, kb["id"], "handbook.md", HANDBOOK.encode()).status_code == 201
        agent = {"id": "librarian", "model": "offline", "knowledge_bases": [kb["id"]]}
        assert client.post("/api/agents", json=agent).status_code == 201
        for slug, cited in (("cited", True), ("uncited", False)):
            deployment = {"slug": slug, "agent_id": "librarian", "includeCitations": cited}
            assert client.post("/api/chat-deployments", json=deployment).status_code == 201

    page.goto(f"{markdown_chat.url}/chat/cited")
    page.fill("#input", "How early must flights be booked?")
    page.press("#input", "Enter")
    card = page.locator(".assistant .source").first
    playwright.expect(card.locator(".source-title")).to_have_text("[1] handbook.md")
    playwright.expect(card.locator(".source-excerpt")).to_contain_text("fourteen days")
    playwright.expect(page.locator(".assistant .answer").last).to_contain_text("[1]")
    page.reload()  # the cards come back with the conversation
    playwright.expect(page.locator(".assistant .source").first).to_contain_text("handbook.md")

    page.goto(f"{markdown_chat.url}/chat/uncited")
    page.fill("#input", "How early must flights be booked?")
    page.press("#input", "Enter")
    playwright.expect(page.locator(".assistant .answer").last).to_contain_text("[1]")
    playwright.expect(page.locator("#send")).to_be_visible()
    assert page.locator(".source").count() == 0
