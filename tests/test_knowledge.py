"""Knowledge bases over real HTTP: documents in (text, Markdown, PDF), passages out, and an
agent whose answer cites what its knowledge_search call retrieved."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fpdf import FPDF

from agentstream.config import Settings
from conftest import LiveServer, make_settings, serve, stream_frames

HANDBOOK = """# Travel policy

Employees book flights through the travel desk at least fourteen days before departure.
Economy class is the rule for flights under six hours.

# Expenses

Meals abroad are reimbursed up to forty euros a day. Keep every receipt for the audit.
"""

GARDEN = """Tomatoes need at least six hours of direct sun each day. Water them deeply twice a week.

Basil grows well beside tomatoes and keeps some pests away."""

PDF_PAGES = [
    "The lighthouse keeper lit the lamp every evening at dusk.",
    "Ships passing the rocky cape relied on the beam to stay clear of the reef.",
]


def pdf_bytes(pages: list[str]) -> bytes:
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 10, text)
    return bytes(pdf.output())


@dataclass(frozen=True)
class Mode:
    database: str
    embeddings: bool


LIVE_MODES = [
    pytest.param(Mode("sqlite", embeddings=False), id="sqlite-full_text"),
    pytest.param(Mode("postgresql", embeddings=False), id="postgresql-full_text"),
    pytest.param(Mode("sqlite", embeddings=True), id="sqlite-hybrid", marks=pytest.mark.embeddings),
    pytest.param(
        Mode("postgresql", embeddings=True), id="postgresql-hybrid", marks=pytest.mark.embeddings
    ),
]


def settings_for(request: pytest.FixtureRequest, tmp_path: Path, database: str) -> Settings:
    overrides = {}
    if database == "postgresql":
        overrides["database_url"] = request.getfixturevalue("postgres_url")
    return make_settings(tmp_path, **overrides)


@pytest.fixture(params=["sqlite", "postgresql"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    """Full-text search (no embeddings, as in the default install), on either store."""
    with serve(settings_for(request, tmp_path, request.param), embeddings=False) as server:
        yield server


@pytest.fixture(params=LIVE_MODES)
def either(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    """Full-text or hybrid search, on either store: what must hold whichever it is."""
    mode: Mode = request.param
    settings = settings_for(request, tmp_path, mode.database)
    with serve(settings, embeddings=mode.embeddings) as server:
        yield server


def create_base(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/api/knowledge-bases", json={"name": "Docs", **body})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def upload(
    client: httpx.Client, kb_id: str, filename: str, data: bytes, content_type: str = ""
) -> httpx.Response:
    files = {"file": (filename, data, content_type or "application/octet-stream")}
    return client.post(f"/api/knowledge-bases/{kb_id}/documents", files=files)


def search(client: httpx.Client, kb_id: str, query: str, top_k: int = 3) -> list[dict[str, Any]]:
    response = client.post(
        f"/api/knowledge-bases/{kb_id}/search", json={"query": query, "top_k": top_k}
    )
    assert response.status_code == 200, response.text
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def upload_all(client: httpx.Client, kb_id: str) -> None:
    for filename, data in [
        ("handbook.md", HANDBOOK.encode()),
        ("garden.txt", GARDEN.encode()),
        ("lighthouse.pdf", pdf_bytes(PDF_PAGES)),
    ]:
        response = upload(client, kb_id, filename, data)
        assert response.status_code == 201, response.text


def test_documents_of_every_kind_are_searchable(either: LiveServer) -> None:
    with either.client(timeout=120) as client:
        kb = create_base(client, description="Company and hobby notes")
        upload_all(client, kb["id"])

        detail = client.get(f"/api/knowledge-bases/{kb['id']}").json()
        assert [d["name"] for d in detail["document_list"]] == [
            "handbook.md",
            "garden.txt",
            "lighthouse.pdf",
        ]
        assert [d["media_type"] for d in detail["document_list"]] == [
            "text/markdown",
            "text/plain",
            "application/pdf",
        ]
        assert detail["documents"] == 3
        assert detail["chunks"] == sum(d["chunk_count"] for d in detail["document_list"])
        assert detail["embedding_model"] == "all-MiniLM-L6-v2"

        # Words of the passage, in other forms (stemmed): "meal", "reimburse".
        best = search(client, kb["id"], "Is my meal reimbursed?")[0]
        assert best["document_name"] == "handbook.md"
        assert "forty euros" in best["text"]
        assert best["text"].startswith("# Expenses"), "a heading opens its own chunk"

        best = search(client, kb["id"], "Which herb grows beside tomatoes?")[0]
        assert best["document_name"] == "garden.txt"
        assert "Basil" in best["text"]

        best = search(client, kb["id"], "What kept ships clear of the reef?")[0]
        assert (best["document_name"], best["page"]) == ("lighthouse.pdf", 2)

        results = search(client, kb["id"], "garden vegetables sunlight water", top_k=5)
        scores = [r["score"] for r in results]
        assert scores == sorted(scores, reverse=True)
        assert [r["number"] for r in results] == list(range(1, len(results) + 1))
        assert {r["knowledge_base_id"] for r in results} == {kb["id"]}


MEANING = [
    # (query with no word of its passage, document, what the passage says)
    ("How much can I spend on food when travelling?", "handbook.md", "forty euros"),
    ("Which plant should go next to my vegetables?", "garden.txt", "Basil"),
    ("What warned sailors about dangerous stones?", "lighthouse.pdf", "reef"),
]


@pytest.mark.embeddings
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_hybrid_search_finds_passages_by_meaning_where_full_text_cannot(
    request: pytest.FixtureRequest, tmp_path: Path, database: str
) -> None:
    settings = settings_for(request, tmp_path, database)
    with serve(settings, embeddings=True) as hybrid, hybrid.client(timeout=120) as client:
        kb = create_base(client)["id"]
        upload_all(client, kb)
        for query, document, passage in MEANING:
            found = search(client, kb, query)
            assert any(r["document_name"] == document and passage in r["text"] for r in found), (
                query,
                found,
            )

    with serve(settings, embeddings=False) as full_text, full_text.client() as client:
        for query, _, passage in MEANING:
            assert not any(passage in r["text"] for r in search(client, kb, query)), query


@pytest.mark.embeddings
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_base_filled_without_embeddings_becomes_hybrid_once_they_are_installed(
    request: pytest.FixtureRequest, tmp_path: Path, database: str
) -> None:
    settings = settings_for(request, tmp_path, database)
    query, document, passage = MEANING[0]
    with serve(settings, embeddings=False) as before, before.client(timeout=120) as client:
        kb = create_base(client)["id"]
        upload_all(client, kb)
        assert not any(passage in r["text"] for r in search(client, kb, query))

    # The extra installed: the first search computes the missing vectors and keeps them.
    with serve(settings, embeddings=True) as after, after.client(timeout=120) as client:
        found = search(client, kb, query)
        assert any(r["document_name"] == document and passage in r["text"] for r in found)
        upload(client, kb, "more.txt", b"Receipts go to the finance team every month.")

    # The extra removed again: the base, vectors and all, is searched by full text.
    with serve(settings, embeddings=False) as without, without.client() as client:
        best = search(client, kb, "finance receipts")[0]
        assert best["document_name"] == "more.txt"


def test_a_deleted_document_is_no_longer_found(either: LiveServer) -> None:
    with either.client(timeout=120) as client:
        kb = create_base(client)
        garden = upload(client, kb["id"], "garden.txt", GARDEN.encode()).json()
        upload(client, kb["id"], "handbook.md", HANDBOOK.encode())
        assert search(client, kb["id"], "tomatoes")[0]["document_name"] == "garden.txt"

        deleted = client.delete(f"/api/knowledge-bases/{kb['id']}/documents/{garden['id']}")
        assert deleted.status_code == 204
        # The chunks stored next may take the deleted ones' ids: the index must not match
        # them by the deleted text.
        upload(client, kb["id"], "lighthouse.pdf", pdf_bytes(PDF_PAGES))
        names = {r["document_name"] for r in search(client, kb["id"], "tomatoes", top_k=10)}
        assert "garden.txt" not in names
        assert not any(
            "tomato" in r["text"].lower() for r in search(client, kb["id"], "tomatoes", top_k=10)
        )

        assert client.delete(f"/api/knowledge-bases/{kb['id']}").status_code == 204
        assert client.get(f"/api/knowledge-bases/{kb['id']}").status_code == 404
        again = create_base(client)
        upload(client, again["id"], "other.txt", b"Nothing about vegetables.")
        found = search(client, again["id"], "lighthouse reef handbook flights tomatoes")
        assert {r["document_name"] for r in found} <= {"other.txt"}


@pytest.mark.parametrize(
    "query",
    [
        'tomatoes" OR "',
        "tomatoes AND NOT basil",
        "NEAR(tomatoes basil)",
        "tomat* ^basil",
        "text:tomatoes",
        "(tomatoes",
        "tomatoes & !basil | <-> 'sun'",
        "'; DROP TABLE kb_chunks; --",
        "tomatoes?!",
        "C++ / C# — naïve café",
        "the and or not",
        "???",
        "\\",
        "🍅",
    ],
)
def test_any_query_is_searched_as_text_never_as_syntax(live: LiveServer, query: str) -> None:
    with live.client() as client:
        kb = create_base(client)
        upload(client, kb["id"], "garden.txt", GARDEN.encode())
        results = search(client, kb["id"], query)
    if "tomatoes" in query:
        assert results[0]["document_name"] == "garden.txt"


def test_agent_answer_cites_the_passages_of_its_context_handler(either: LiveServer) -> None:
    live = either
    with live.client(timeout=120) as client:
        kb = create_base(client)
        upload(client, kb["id"], "handbook.md", HANDBOOK.encode())
        upload(client, kb["id"], "garden.txt", GARDEN.encode())
        librarian = f"librarian-{kb['id'][-8:]}"  # one PostgreSQL database for every mode
        agent = {"id": librarian, "model": "offline", "knowledge_bases": [kb["id"]]}
        assert client.post("/api/agents", json=agent).status_code == 201

    _, frames = stream_frames(live, librarian, {"message": "How early must flights be booked?"})
    events = [f["event"] for f in frames]
    assert events.index("tool_call") < events.index("context_handler_created")
    assert events.index("context_handler_created") < events.index("tool_result")
    assert events[-1] == "complete"
    created = next(f for f in frames if f["event"] == "context_handler_created")
    call = next(f for f in frames if f["event"] == "tool_call")
    assert call["tool_name"] == "knowledge_search"
    assert created["tool_call_id"] == call["tool_call_id"]
    result = next(f for f in frames if f["event"] == "tool_result")
    assert result["result"]["context_handler_id"] == created["context_handler_id"]

    with live.client() as client:
        response = client.get(f"/api/context-handlers/{created['context_handler_id']}")
        assert response.status_code == 200
        handler = response.json()
    assert handler["query"] == "How early must flights be booked?"
    assert handler["tool_call_id"] == call["tool_call_id"]
    citations = {c["number"]: c for c in handler["citations"]}
    assert citations[1]["document_name"] == "handbook.md"
    assert "fourteen days" in citations[1]["text"]

    answer = frames[-1]["content"]
    cited = re.findall(r"([^\]]+?) \[(\d+)\]", answer.removeprefix("From the knowledge base: "))
    assert cited, answer
    for sentence, number in cited:
        passage = " ".join(citations[int(number)]["text"].split())
        assert sentence.strip() in passage, (sentence, number)


def test_context_handler_is_replayed_and_forgotten_with_its_session(server: LiveServer) -> None:
    with server.client(timeout=120) as client:
        kb = create_base(client, id="garden")
        upload(client, kb["id"], "garden.txt", GARDEN.encode())
        agent = {"id": "gardener", "model": "offline", "knowledge_bases": ["garden"]}
        assert client.post("/api/agents", json=agent).status_code == 201
        _, frames = stream_frames(server, "gardener", {"message": "When do I water tomatoes?"})
        handler_id = next(
            f["context_handler_id"] for f in frames if f["event"] == "context_handler_created"
        )
        run_id, session_id = frames[0]["run_id"], frames[0]["session_id"]

        with client.stream("GET", f"/api/agents/runs/{run_id}/stream") as replay:
            replayed = [line for line in replay.iter_lines() if "context_handler_created" in line]
        assert len(replayed) == 1
        assert handler_id in replayed[0]

        assert client.delete(f"/api/sessions/{session_id}").status_code == 204
        assert client.get(f"/api/context-handlers/{handler_id}").status_code == 404


@pytest.mark.parametrize(
    ("filename", "data", "message"),
    [
        ("notes.docx", b"PK\x03\x04", "Cannot tell what kind of document"),
        ("notes.txt", b"\xff\xfe\x00bad", "not UTF-8"),
        ("notes.txt", b"Looks like text\x00\x01\x02", "not text (byte 15 is NUL)"),
        ("notes.md", b"   \n\n  ", "no text"),
        ("scan.pdf", b"%PDF-1.4 not really", "not a readable PDF"),
    ],
)
def test_unreadable_documents_are_refused_and_nothing_is_stored(
    live: LiveServer, filename: str, data: bytes, message: str
) -> None:
    with live.client(timeout=120) as client:
        kb = create_base(client)
        response = upload(client, kb["id"], filename, data)
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["field"] == "file"
        assert message in error["message"]
        detail = client.get(f"/api/knowledge-bases/{kb['id']}").json()
        assert (detail["documents"], detail["chunks"]) == (0, 0)


def test_a_pdf_glyph_extracted_as_nul_is_dropped(live: LiveServer) -> None:
    with live.client(timeout=120) as client:
        kb = create_base(client)
        response = upload(client, kb["id"], "odd.pdf", pdf_bytes(["Saturn\x00 has rings."]))
        assert response.status_code == 201, response.text
        found = client.post(f"/api/knowledge-bases/{kb['id']}/search", json={"query": "rings"})
    assert found.json()["results"][0]["text"] == "Saturn has rings."


def test_bad_knowledge_requests_name_the_field(server: LiveServer) -> None:
    with server.client(timeout=120) as client:
        missing = upload(client, "kb_nope", "a.txt", b"hello")
        assert missing.status_code == 404
        assert missing.json()["error"]["field"] == "knowledge_base_id"

        kb = create_base(client, id="dup")
        again = client.post("/api/knowledge-bases", json={"id": "dup", "name": "Again"})
        assert again.status_code == 409
        assert again.json()["error"]["field"] == "id"

        no_file = client.post(f"/api/knowledge-bases/{kb['id']}/documents", data={"name": "x"})
        assert no_file.status_code == 422
        assert "file" in no_file.text

        empty_query = client.post(f"/api/knowledge-bases/{kb['id']}/search", json={"query": ""})
        assert empty_query.status_code == 422

        agent = {"id": "lost", "model": "offline", "knowledge_bases": ["no-such-base"]}
        refused = client.post("/api/agents", json=agent)
        assert refused.status_code == 422
        assert refused.json()["error"]["field"] == "knowledge_bases"
        assert client.get("/api/agents/lost").status_code == 404

        assert client.get("/api/context-handlers/ctx_nope").status_code == 404


def test_documents_may_be_larger_than_other_request_bodies(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_body_bytes=1_000, max_document_bytes=200_000)
    text = ("Lighthouses guide ships along dangerous coasts. " * 40 + "\n\n") * 20
    with serve(settings) as live, live.client(timeout=120) as client:
        kb = create_base(client)
        response = upload(client, kb["id"], "long.txt", text.encode())
        assert response.status_code == 201, response.text
        assert response.json()["chunk_count"] > 1
        too_long = client.post("/api/knowledge-bases", json={"name": "x" * 2_000})
        assert too_long.status_code == 413
        huge = upload(client, kb["id"], "huge.txt", b"word " * 50_000)
        assert huge.status_code == 413
