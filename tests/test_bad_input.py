"""Bad requests get a 4xx JSON error naming the problem, and nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import LiveServer, make_settings, postgres_admin, rows, serve


def row_counts(server: LiveServer) -> dict[str, int]:
    tables = ("runs", "sessions", "run_events", "messages", "agents")
    return {t: rows(server, f"select count(*) from {t}")[0][0] for t in tables}


STREAM = "/api/agents/demo/run/stream"


@pytest.mark.parametrize(
    ("content", "status", "code", "field"),
    [
        (b'{"message": "hi"', 400, "invalid_json", "body"),
        (b"not json at all", 400, "invalid_json", "body"),
        (b'{"message": "caf\xe9"}', 400, "invalid_body", "body"),
        (b"{}", 422, "invalid_request", "message"),
        (b'{"message": ""}', 422, "invalid_request", "message"),
        (b'{"message": 42}', 422, "invalid_request", "message"),
        (b'{"message": "hi", "colour": "red"}', 422, "invalid_request", "colour"),
        (b'{"message": "hi", "reasoning": "maybe"}', 422, "invalid_request", "reasoning"),
        (b'{"message": "hi", "reasoning": "yes"}', 422, "invalid_request", "reasoning"),
        (b'{"message": "hi", "reasoning": 1}', 422, "invalid_request", "reasoning"),
        (
            b'{"message": "hi", "reasoning_requested": "true"}',
            422,
            "invalid_request",
            "reasoning_requested",
        ),
        (
            b'{"message": "hi", "reasoning": true, "reasoning_requested": false}',
            422,
            "invalid_request",
            "reasoning_requested",
        ),
        (b'{"message": "hi", "session_id": 7}', 422, "invalid_request", "session_id"),
        (b'["message"]', 422, "invalid_request", "body"),
    ],
    ids=[
        "truncated",
        "not-json",
        "not-utf8",
        "missing",
        "empty",
        "wrong-type",
        "extra",
        "bad-bool",
        "loose-bool",
        "number-for-bool",
        "string-for-bool",
        "disagreeing-names",
        "number-for-string",
        "array",
    ],
)
def test_malformed_run_requests(
    server: LiveServer, content: bytes, status: int, code: str, field: str
) -> None:
    before = row_counts(server)
    with server.client() as client:
        response = client.post(
            STREAM, content=content, headers={"content-type": "application/json"}
        )

    assert response.status_code == status
    error = response.json()["error"]
    assert (error["code"], error["field"]) == (code, field)
    assert error["message"]
    assert row_counts(server) == before


def test_oversized_body_is_refused(tmp_path: Path) -> None:
    from conftest import make_settings, serve

    with serve(make_settings(tmp_path, max_body_bytes=1000)) as live:
        before = row_counts(live)
        with live.client() as client:
            declared = client.post(STREAM, json={"message": "x" * 2000})
            chunked = client.post(
                STREAM,
                content=iter([b'{"message": "', b"x" * 2000, b'"}']),
                headers={"content-type": "application/json"},
            )
        for response in (declared, chunked):
            assert response.status_code == 413
            assert response.json()["error"]["code"] == "body_too_large"
            assert response.json()["error"]["field"] == "body"
        assert row_counts(live) == before


def test_unknown_agent(server: LiveServer) -> None:
    before = row_counts(server)
    with server.client() as client:
        response = client.post("/api/agents/nobody/run/stream", json={"message": "hi"})
    assert response.status_code == 404
    assert response.json()["error"] == {
        "code": "not_found",
        "message": "No agent 'nobody'",
        "field": "agent_id",
    }
    assert row_counts(server) == before


@pytest.mark.parametrize(
    "headers",
    [{}, {"apikey": "wrong"}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}],
    ids=["none", "bad-apikey", "bad-bearer", "wrong-scheme"],
)
def test_requests_without_a_valid_key_are_refused(
    server: LiveServer, headers: dict[str, str]
) -> None:
    import httpx

    before = row_counts(server)
    response = httpx.post(server.url + STREAM, json={"message": "hi"}, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert "apikey" in response.json()["error"]["message"]
    assert row_counts(server) == before


def test_bearer_key_is_accepted(server: LiveServer) -> None:
    import httpx

    response = httpx.get(
        server.url + "/api/agents", headers={"Authorization": f"Bearer {server.key}"}
    )
    assert response.status_code == 200
    assert "demo" in [a["agent"]["id"] for a in response.json()]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"id": "Bad Id"}, "id"),
        ({"id": "x", "model": "gpt-nowhere"}, "model"),
        ({"id": "x", "tools": ["calculator", "rm_rf"]}, "tools"),
        ({"id": "x", "max_steps": 0}, "max_steps"),
        ({"id": "demo"}, "id"),
    ],
    ids=["bad-id", "unknown-model", "unknown-tool", "steps", "duplicate"],
)
def test_invalid_agent_definitions(server: LiveServer, body: dict[str, Any], field: str) -> None:
    before = row_counts(server)
    with server.client() as client:
        response = client.post("/api/agents", json=body)
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["field"] == field
    assert row_counts(server) == before


def test_agent_crud_versions_each_change(server: LiveServer) -> None:
    with server.client() as client:
        created = client.post("/api/agents", json={"id": "helper", "tools": ["calculator"]})
        assert created.status_code == 201
        assert created.json()["version"] == 1
        updated = client.patch("/api/agents/helper", json={"instructions": "Be terse."})
        assert updated.json()["version"] == 2
        assert updated.json()["agent"]["instructions"] == "Be terse."
        same = client.patch("/api/agents/helper", json={"instructions": "Be terse."})
        assert same.json()["version"] == 2, "no change, no new version"
        assert client.delete("/api/agents/helper").status_code == 204
        assert client.get("/api/agents/helper").status_code == 404


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/agents/demo", {"name": None}, "name"),
        ("/api/agents/demo", {"tools": None}, "tools"),
        ("/api/chat-deployments/your-slug", {"title": None}, "title"),
        ("/api/chat-deployments/your-slug", {"includeThinking": None}, "includeThinking"),
    ],
)
def test_null_is_not_a_value_in_partial_updates(
    server: LiveServer, path: str, body: dict[str, Any], field: str
) -> None:
    with server.client() as client:
        before = client.get(path).json()
        response = client.patch(path, json=body)
        after = client.get(path).json()
    assert response.status_code == 422
    assert response.json()["error"]["field"] == field
    assert after == before


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/agents/demo/run/stream", {"message": "hi\u0000there"}, "message"),
        ("/api/chat/your-slug", {"input": "hi\u0000there"}, "input"),
    ],
)
def test_nul_characters_are_refused(
    server: LiveServer, path: str, body: dict[str, Any], field: str
) -> None:
    before = row_counts(server)
    with server.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 422
    assert response.json()["error"]["field"] == field
    assert "NUL" in response.json()["error"]["message"]
    assert row_counts(server) == before


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/api/knowledge-bases/KB/search", {"query": "x", "top_k": True}, "top_k"),
        ("POST", "/api/knowledge-bases/KB/search", {"query": "x", "top_k": "5"}, "top_k"),
        ("POST", "/api/knowledge-bases/KB/search", {"query": "x", "top_k": 5.0}, "top_k"),
        ("POST", "/api/agents", {"id": "x", "max_steps": True}, "max_steps"),
        ("POST", "/api/agents", {"id": "x", "timeout_seconds": "60"}, "timeout_seconds"),
        ("PATCH", "/api/agents/demo", {"reasoning": "yes"}, "reasoning"),
        ("PATCH", "/api/agents/demo", {"max_steps": "3"}, "max_steps"),
        ("PATCH", "/api/chat-deployments/your-slug", {"includeThinking": "yes"}, "includeThinking"),
        ("PATCH", "/api/chat-deployments/your-slug", {"redact_pii": 1}, "redact_pii"),
        (
            "PUT",
            "/api/workflows/strict",
            {
                "blocks": [
                    {"id": "start", "type": "start"},
                    {"id": "f", "type": "function", "expression": "1", "redact_output": "no"},
                ],
                "edges": [{"from": "start", "to": "f"}],
            },
            "blocks.f.redact_output",
        ),
        (
            "POST",
            "/api/workflows/strict/execute",
            {
                "definition": {
                    "blocks": [
                        {"id": "start", "type": "start"},
                        {"id": "get", "type": "http", "url": "http://x", "timeout_seconds": "5"},
                    ],
                }
            },
            "blocks.get.timeout_seconds",
        ),
    ],
    ids=[
        "top-k-bool",
        "top-k-string",
        "top-k-float",
        "steps-bool",
        "timeout-string",
        "agent-reasoning",
        "agent-steps",
        "deployment-thinking",
        "deployment-redaction",
        "workflow-block-bool",
        "canvas-block-number",
    ],
)
def test_types_are_strict_in_every_request_model(
    server: LiveServer, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    """Nothing is coerced: a string, a number or a boolean of the wrong kind is a 422."""
    with server.client() as client:
        kb = client.post("/api/knowledge-bases", json={"name": "docs"}).json()["id"]
        before = (client.get("/api/agents").json(), client.get("/api/chat-deployments").json())
        response = client.request(method, path.replace("KB", kb), json=body)
        after = (client.get("/api/agents").json(), client.get("/api/chat-deployments").json())
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert after == before


def test_a_database_gone_away_is_503_with_retry_after_not_500(
    tmp_path: Path, cluster_database: str
) -> None:
    with serve(make_settings(tmp_path, database_url=cluster_database)) as live:
        postgres_admin(
            f'DROP DATABASE "{cluster_database.rsplit("/", 1)[1]}" WITH (FORCE)'
        )  # the connections go, and no new one finds it
        with live.client() as client:
            answers = [client.get(path) for path in ("/api/agents", "/api/agents/runs/run_x")]

    for answer in answers:
        assert answer.status_code == 503
        assert answer.headers["Retry-After"] == "5"
        assert answer.json()["error"] == {
            "code": "unavailable",
            "message": "The database is unavailable; try again shortly",
            "field": None,
        }


@pytest.mark.parametrize(
    "body",
    [b"{", b'{"name": "\xff"}', b"[" * 5000 + b"]" * 5000],
    ids=["not-json", "not-utf-8", "too-deep-to-parse"],
)
def test_a_document_upload_sent_as_broken_json_is_refused_as_a_form_not_a_500(
    server: LiveServer, body: bytes
) -> None:
    """The upload reads a form; a JSON content type with a body that is not JSON (or not
    UTF-8, or nested past what the parser can) is refused like any body it cannot read,
    and nothing is added."""
    with server.client() as client:
        kb = client.post("/api/knowledge-bases", json={"name": "docs"}).json()["id"]
        response = client.post(
            f"/api/knowledge-bases/{kb}/documents",
            content=body,
            headers={"content-type": "application/json"},
        )
        documents = client.get(f"/api/knowledge-bases/{kb}").json()["document_list"]

    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "file"
    assert documents == []
