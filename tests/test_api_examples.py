"""The OpenAPI document's examples are requests the server takes: every body and parameter
has one, each is valid against its schema, and a demo server accepts them (no 400 or 422);
a draining server refuses the operations that start runs with the 503 they document."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from jsonschema import Draft202012Validator

from agentstream.server import create_app
from conftest import LiveServer, make_settings
from fakes.server import run_app

Operation = tuple[str, str, dict[str, Any]]

CREATED_FIRST = [
    ("post", "/api/knowledge-bases"),
    ("post", "/api/workflows"),
    ("post", "/api/chat-deployments"),
    ("post", "/api/agents"),
]
"""What the other examples name (``PARAMETER_EXAMPLES``): created by their own examples
first (and deleted last)."""


def operations(document: dict[str, Any]) -> list[Operation]:
    listed = [
        (method, path, operation)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    ]
    first = [op for key in CREATED_FIRST for op in listed if op[:2] == key]
    rest = [op for op in listed if op[:2] not in CREATED_FIRST]
    return first + sorted(rest, key=lambda op: op[0] == "delete")


def validator(document: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """``schema`` with the document's components, which its ``$ref``s name."""
    return Draft202012Validator({**schema, "components": document["components"]})


def resolved(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def body_examples(document: dict[str, Any], operation: dict[str, Any]) -> list[Any]:
    """The documented example bodies: the media type's, or its schema's (a form's: one of
    each field's)."""
    media = next(iter(operation["requestBody"]["content"].values()))
    if "examples" in media:
        return [example["value"] for example in media["examples"].values()]
    schema = resolved(document, media["schema"])
    if "anyOf" in schema:  # an optional body
        schema = resolved(document, schema["anyOf"][0])
    if "examples" in schema:
        return list(schema["examples"])
    fields = schema.get("properties", {})
    if fields and all("examples" in field for field in fields.values()):
        return [{name: field["examples"][0] for name, field in fields.items()}]
    return []


@pytest.fixture
def document(server: LiveServer) -> dict[str, Any]:
    return httpx.get(f"{server.url}/openapi.json").json()  # type: ignore[no-any-return]


def test_every_body_and_parameter_has_an_example_valid_against_its_schema(
    document: dict[str, Any],
) -> None:
    for method, path, operation in operations(document):
        for parameter in operation.get("parameters", []):
            assert "example" in parameter, (method, path, parameter["name"])
            schema = validator(document, parameter["schema"])
            assert schema.is_valid(parameter["example"]), (method, path, parameter["name"])
        if "requestBody" not in operation:
            continue
        examples = body_examples(document, operation)
        assert examples, (method, path)
        media = next(iter(operation["requestBody"]["content"].values()))
        for example in examples:
            errors = list(validator(document, media["schema"]).iter_errors(example))
            assert not errors, (method, path, errors[0].message if errors else "")


def example_request(
    document: dict[str, Any], path: str, operation: dict[str, Any], example: Any
) -> dict[str, Any]:
    """The request an operation's examples make: path, query, headers and body."""
    url, query, headers = path, {}, {}
    for parameter in operation.get("parameters", []):
        value = parameter["example"]
        match parameter["in"]:
            case "path":
                url = url.replace("{" + parameter["name"] + "}", str(value))
            case "query":
                query[parameter["name"]] = str(value).lower() if value is True else str(value)
            case "header":
                headers[parameter["name"]] = str(value)
    request: dict[str, Any] = {"url": url, "params": query, "headers": headers}
    if "requestBody" in operation:
        if "multipart/form-data" in operation["requestBody"]["content"]:
            request["files"] = {"file": (example["file"], b"Leave: 25 days a year.")}
            request["data"] = {k: v for k, v in example.items() if k != "file"}
        else:
            request["json"] = example
    return request


def send_examples(
    live: LiveServer, document: dict[str, Any], *, bodies_only: bool = False
) -> Iterator[tuple[str, str, dict[str, Any], httpx.Response]]:
    """Each operation's example requests, in ``operations`` order, read whole."""
    with live.client(timeout=30) as client:
        for method, path, operation in operations(document):
            if bodies_only and "requestBody" not in operation:
                continue
            examples = body_examples(document, operation) if "requestBody" in operation else [None]
            for example in examples:
                request = example_request(document, path, operation, example)
                with client.stream(method.upper(), **request) as response:
                    response.read()
                yield method, path, operation, response


def test_a_demo_server_accepts_every_example_request(
    server: LiveServer, document: dict[str, Any]
) -> None:
    """Each request body example is taken as valid (no 400 or 422), and every status it
    gets is one its operation documents; those that create what others name succeed."""
    statuses = {}
    for method, path, operation, response in send_examples(server, document, bodies_only=True):
        status = response.status_code
        assert status not in (400, 422), (method, path, response.text)
        assert str(status) in operation["responses"], (method, path, status, response.text)
        statuses[method, path] = status
    assert [statuses[key] for key in CREATED_FIRST] == [201] * len(CREATED_FIRST)
    assert statuses["post", "/api/agents/{agent_id}/run/stream"] == 200
    assert statuses["post", "/api/chat/{slug}"] == 200
    assert statuses["post", "/api/workflows/{workflow_id}/run/stream"] == 200


STARTING_RUNS = {
    ("post", "/api/agents/{agent_id}/run/stream"),
    ("post", "/api/agents/{agent_id}/ui-messages"),
    ("post", "/api/agents/{agent_id}/ag-ui"),
    ("post", "/api/workflows/{workflow_id}/run/stream"),
    ("post", "/api/workflows/{workflow_id}/execute"),
    ("post", "/api/chat/{slug}"),
    ("post", "/v1/chat/completions"),
    ("post", "/v1/responses"),
}


def test_a_draining_server_refuses_new_runs_with_the_documented_503(tmp_path: Path) -> None:
    """Once the server drains (SIGTERM), each example that would start a run gets 503
    ``shutting_down`` with ``Retry-After``, documented on its operation; so does nothing
    else."""
    settings = make_settings(tmp_path)
    app = create_app(settings)
    with run_app(app, name="The server", lifespan="on") as url:
        live = LiveServer(
            url=url, key=settings.demo_key_file.read_text().strip(), settings=settings
        )
        document = httpx.get(f"{url}/openapi.json").json()
        anyio.run(app.state.drain)  # no run is live: it only stops taking new ones
        refused = set()
        for method, path, operation, response in send_examples(live, document):
            if response.status_code == 503:
                assert "503" in operation["responses"], (method, path)
                assert response.json()["error"]["code"] == "shutting_down"
                assert response.headers["retry-after"] == "1"
                refused.add((method, path))
    assert refused == STARTING_RUNS


def test_declared_statuses_name_what_the_server_answers(document: dict[str, Any]) -> None:
    """409, 429 and 503 are where routes declare them, with the error body."""
    declared = {
        (method, path): {s for s in operation["responses"] if s in ("409", "429", "503")}
        for method, path, operation in operations(document)
    }
    for key in STARTING_RUNS:
        assert "503" in declared[key], key
    assert declared["post", "/api/chat/{slug}"] == {"409", "429", "503"}
    assert declared["post", "/api/agents/runs/{run_id}/cancel"] == {"409", "503"}
    assert declared["get", "/api/agents"] == set()
